-- taskq schema v1: the task table.
-- Written in the MySQL 8 / MariaDB 10.6+ common subset. Every time column is written by
-- taskq from the database clock (UTC_TIMESTAMP(6)), never from a client clock.
CREATE TABLE taskq_tasks (
    id              BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
    queue           VARCHAR(64)  NOT NULL,
    name            VARCHAR(255) NOT NULL,
    -- JSON text as bytes: the worker decodes it and sends undecodable rows to `dead`.
    payload         LONGBLOB     NOT NULL,
    state           ENUM('pending', 'running', 'succeeded', 'dead', 'canceled') NOT NULL,
    -- Lower runs first.
    priority        SMALLINT     NOT NULL DEFAULT 0,
    -- Number of times the task has been claimed (started) so far.
    attempt         INT UNSIGNED NOT NULL DEFAULT 0,
    max_attempts    INT UNSIGNED NOT NULL,
    run_at          DATETIME(6)  NOT NULL,
    lease_until     DATETIME(6)  NULL,
    -- Fencing token: incremented by every claim, reap and release.
    lease_epoch     BIGINT UNSIGNED NOT NULL DEFAULT 0,
    worker_id       VARCHAR(128) NULL,
    idempotency_key VARCHAR(255) NULL,
    last_error      TEXT         NULL,
    created_at      DATETIME(6)  NOT NULL,
    updated_at      DATETIME(6)  NOT NULL,
    finished_at     DATETIME(6)  NULL,
    PRIMARY KEY (id),
    -- Claim: state = 'pending' AND queue = ? AND run_at <= now ORDER BY priority, run_at, id.
    KEY ix_taskq_claim (state, queue, priority, run_at, id),
    -- Reaper: state = 'running' AND lease_until < now.
    KEY ix_taskq_lease (state, lease_until),
    -- Retention: state = <terminal> AND finished_at < cutoff.
    KEY ix_taskq_finished (state, finished_at),
    -- Idempotency: one live row per (task name, key); NULL keys never collide.
    UNIQUE KEY uq_taskq_idempotency (name, idempotency_key)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

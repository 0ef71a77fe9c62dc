-- taskq schema v5: unique tasks ("at most one live task with this identity").
--
-- On the task row, set at enqueue and never changed:
--   unique_key   the task's identity: SHA-256 of the task name, the selected payload fields
--                and, for a window, the period and the window's number.
--   unique_while how long the task holds it: 'pending' (until a worker starts it), 'running'
--                (until it finishes), 'window' (until its window ends; a success keeps it).
--
-- taskq_unique has one row per identity that is held, naming the task that holds it. The
-- statements that end a hold (claim, write-back, reaper, cancel) delete the row in the same
-- transaction; a manual retry of a dead task inserts it again. A window's row is kept after a
-- success and deleted once expires_at (the end of the window) has passed.
--
-- The identity is the PRIMARY KEY of its own table, not a unique index of taskq_tasks: a
-- duplicate insert leaves a shared lock on the row it collided with until the caller's
-- transaction ends, and for a clustered index that lock covers the record only, while on a
-- secondary unique index it also covers the gap before the record, which (NULLs sorting
-- first) is where every task that is not unique would insert its NULL entry.
--
-- The two columns are added in place without a table rebuild (INSTANT on MariaDB 10.4+ and
-- MySQL 8.0.12+: appended at the end, no index).
ALTER TABLE taskq_tasks
    ADD COLUMN unique_key   BINARY(32) NULL,
    ADD COLUMN unique_while ENUM('pending', 'running', 'window') NULL;

CREATE TABLE taskq_unique (
    unique_key BINARY(32)      NOT NULL,
    -- The task holding the identity (0 only inside the enqueue that is reserving it).
    task_id    BIGINT UNSIGNED NOT NULL,
    -- End of the window, for a windowed identity (database clock); NULL otherwise.
    expires_at DATETIME(6)     NULL,
    PRIMARY KEY (unique_key),
    KEY ix_taskq_unique_expires (expires_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

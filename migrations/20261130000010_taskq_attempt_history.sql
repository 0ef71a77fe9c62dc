-- taskq schema v10: attempt history and the audit trail of operator actions.
--
-- On the task row (appended, nullable: both servers add them in place without a rebuild):
-- * `attempted_at`: when the latest attempt started (database clock), set by the claim's
--   UPDATE.
-- * `attempts`: the attempt history, a JSON array (stored as LONGTEXT, which reads the same on
--   MariaDB and MySQL 8) of one object per attempt that ended:
--     {"attempt": n, "epoch": e, "worker": "...", "started_at": "YYYY-MM-DD hh:mm:ss.ffffff",
--      "finished_at": "...", "outcome": "succeeded|failed|timed_out|panicked|canceled|
--      snoozed|lease_lost|released", "error": "..." | null}
--   appended by the statement that ends the attempt (the batched write-back, the reaper, the
--   release at shutdown), so it costs no statement of its own. Bounded: the latest 100
--   entries are kept, each entry's error cut to 1,024 characters. Deleted with its task by
--   retention.
ALTER TABLE taskq_tasks
    ADD COLUMN attempted_at DATETIME(6) NULL,
    ADD COLUMN attempts LONGTEXT NULL;

-- Operator actions (cancel, retry, reschedule, pause, bulk operations...): who did what, when
-- (database clock). Written by `Client` in the transaction of the action; pruned by the
-- workers' retention once older than the longest terminal-task retention.
CREATE TABLE taskq_audit (
    id      BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
    at      DATETIME(6)     NOT NULL,
    -- Who: `Client::with_actor` (the CLI: `cli:<user>@<host>`), "client" by default.
    actor   VARCHAR(255)    NOT NULL,
    -- What: cancel, cancel_requested, retry, reschedule, priority, pause, resume,
    -- bulk_cancel, bulk_retry, purge, schedule_delete, create, or an application's own.
    action  VARCHAR(64)     NOT NULL,
    -- The task acted on (NULL for queue-wide and bulk actions).
    task_id BIGINT UNSIGNED NULL,
    -- The queue acted on, or the task's queue.
    queue   VARCHAR(64)     NULL,
    -- JSON object: the action's parameters and effect (filter, counts, new values).
    detail  TEXT            NULL,
    PRIMARY KEY (id),
    KEY ix_taskq_audit_task (task_id, id),
    KEY ix_taskq_audit_queue (queue, id),
    -- Retention: at < cutoff.
    KEY ix_taskq_audit_at (at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

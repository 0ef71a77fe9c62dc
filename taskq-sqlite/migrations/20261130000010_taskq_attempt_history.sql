-- taskq schema v10 on SQLite (same version as MySQL migration 10): attempt history and the
-- audit trail of operator actions.
--
-- On the task row:
-- * `attempted_at`: when the latest attempt started (µs, database clock), set by the claim.
-- * `attempts`: the attempt history, a JSON array (TEXT) of one object per attempt that ended,
--   in MySQL's format, so one parser reads both backends:
--     {"attempt": n, "epoch": e, "worker": "...", "started_at": "YYYY-MM-DD hh:mm:ss.ffffff",
--      "finished_at": "...", "outcome": "succeeded|failed|timed_out|panicked|canceled|
--      snoozed|lease_lost|released", "error": "..." | null}
--   (times UTC; SQLite's clock has millisecond resolution, so the last three digits are 0),
--   appended with SQLite's json functions by the statement that ends the attempt (write-back,
--   reaper, release). Bounded like MySQL's: the latest 100 entries, each error cut to 1,024
--   characters. Deleted with its task by retention.
ALTER TABLE taskq_tasks ADD COLUMN attempted_at INTEGER;
ALTER TABLE taskq_tasks ADD COLUMN attempts TEXT;

-- Operator actions (cancel, retry, reschedule, pause, bulk operations...): who did what, when
-- (database clock, µs). Written in the transaction of the action; pruned by retention.
-- AUTOINCREMENT: ids are the paging cursor and never go back.
CREATE TABLE taskq_audit (
    id      INTEGER PRIMARY KEY AUTOINCREMENT,
    at      INTEGER NOT NULL,
    actor   TEXT    NOT NULL CHECK (length(actor) <= 255),
    action  TEXT    NOT NULL CHECK (length(action) <= 64),
    -- The task acted on (NULL for queue-wide and bulk actions).
    task_id INTEGER,
    -- The queue acted on, or the task's queue.
    queue   TEXT    CHECK (length(queue) <= 64),
    -- JSON object: the action's parameters and effect.
    detail  TEXT
) STRICT;
-- By task and by queue, newest first (the rowid `id` ends every entry); retention by `at`.
CREATE INDEX ix_taskq_audit_task ON taskq_audit (task_id) WHERE task_id IS NOT NULL;
CREATE INDEX ix_taskq_audit_queue ON taskq_audit (queue) WHERE queue IS NOT NULL;
CREATE INDEX ix_taskq_audit_at ON taskq_audit (at);

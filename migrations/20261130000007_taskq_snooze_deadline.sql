-- taskq schema v7: snooze and deadlines.
-- * `expired`, a terminal state: the task's deadline passed before an attempt could start
--   (appended to the ENUM, so existing values keep their stored numbers: a metadata-only
--   change on MySQL 8 and MariaDB 10.6+).
-- * `snoozes`: how many times a handler snoozed the task (ran again later without the attempt
--   being counted); bounded per task type by `Task::MAX_SNOOZES`.
-- * `deadline`: no attempt starts at or after it (database clock); NULL = no deadline. Checked
--   by the claim's locking read by primary key, so no index is needed.
-- Columns are appended (no AFTER), so both servers add them in place without a table rebuild.
ALTER TABLE taskq_tasks
    MODIFY COLUMN state ENUM('pending', 'running', 'succeeded', 'dead', 'canceled', 'expired') NOT NULL,
    ADD COLUMN snoozes INT UNSIGNED NOT NULL DEFAULT 0,
    ADD COLUMN deadline DATETIME(6) NULL;

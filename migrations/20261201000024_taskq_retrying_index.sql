-- The operator's Retrying view: pending tasks that have made at least one attempt, soonest
-- first, by (run_at, id). The attempt count is in no index, so the view read every pending row
-- (16 s a page on a million-task table with 150,000 pending). MySQL has no partial index: a
-- VIRTUAL generated column holds run_at for exactly those rows (NULL for every other row), and
-- an index on it makes the view one keyset range. Virtual: nothing stored in the row; the index
-- entry of a row changes only when the column's value does (a task that never fails keeps
-- NULL from insert to purge, so claims and write-backs of such tasks do not touch it).
-- Written in the MySQL 8 / MariaDB 10.6+ common subset (`AS (..) VIRTUAL`).
ALTER TABLE taskq_tasks
    ADD COLUMN retry_at DATETIME(6)
        AS (CASE WHEN state = 'pending' AND attempt > 0 THEN run_at END) VIRTUAL,
    ADD INDEX ix_taskq_retrying (retry_at, id);

-- taskq schema v11 on SQLite (same version as MySQL migration 11): fleet-wide queue limits on
-- the queue's row in taskq_queues (rows now exist for queues ever paused or limited).
--   concurrency_limit: at most this many tasks of the queue running at once across all workers.
--   rate_limit / rate_period_us: at most rate_limit claims per window of rate_period_us µs,
--     windows aligned to multiples of the period since the Unix epoch (database clock).
--   rate_window_start / rate_window_count: the window (µs) claims were last counted in, and
--     how many.
-- A claim of a limited queue reads the row and counts the queue's running tasks inside its
-- BEGIN IMMEDIATE transaction: claims never overlap, so no row lock is needed.
ALTER TABLE taskq_queues ADD COLUMN concurrency_limit INTEGER
    CHECK (concurrency_limit BETWEEN 0 AND 4294967295);
ALTER TABLE taskq_queues ADD COLUMN rate_limit INTEGER CHECK (rate_limit BETWEEN 0 AND 4294967295);
ALTER TABLE taskq_queues ADD COLUMN rate_period_us INTEGER;
ALTER TABLE taskq_queues ADD COLUMN rate_window_start INTEGER;
ALTER TABLE taskq_queues ADD COLUMN rate_window_count INTEGER NOT NULL DEFAULT 0
    CHECK (rate_window_count >= 0);

-- The running tasks of a queue (the limited claim's count, the queue list's running counts):
-- partial, so only running rows are in it.
CREATE INDEX ix_taskq_running ON taskq_tasks (queue) WHERE state = 'running';

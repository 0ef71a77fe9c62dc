-- taskq schema v11: fleet-wide queue limits, kept on the queue's row in taskq_queues (rows now
-- exist for queues ever paused or limited).
--   concurrency_limit: at most this many tasks of the queue running at once across all workers.
--   rate_limit / rate_period_us: at most rate_limit claims per window of rate_period_us, the
--     windows aligned to multiples of the period on the database clock (since 1970-01-01).
--   rate_window_start / rate_window_count: the window claims were last counted in, and how many.
-- A claim of a limited queue locks its row, so those claims serialize; other queues never
-- touch it.
ALTER TABLE taskq_queues
    ADD COLUMN concurrency_limit INT UNSIGNED NULL,
    ADD COLUMN rate_limit INT UNSIGNED NULL,
    ADD COLUMN rate_period_us BIGINT NULL,
    ADD COLUMN rate_window_start DATETIME(6) NULL,
    ADD COLUMN rate_window_count INT UNSIGNED NOT NULL DEFAULT 0;

-- taskq schema: live workers. One row per worker process, written by the worker itself: an
-- upsert at start, `last_seen_at` refreshed once per heartbeat interval (one statement per
-- worker, never per task), `stopped_at` set at graceful shutdown. Any worker's maintenance
-- deletes rows not seen for a day. A worker is alive while it is not stopped and was seen
-- within its lease (`lease_us`). The table is tiny (one row per worker process).
CREATE TABLE taskq_workers (
    worker_id    VARCHAR(128) NOT NULL,
    host         VARCHAR(255) NOT NULL,
    pid          INT UNSIGNED NOT NULL,
    -- JSON object: queue name -> concurrency of that queue in this worker.
    queues       TEXT         NOT NULL,
    -- Handlers the worker runs at once over all its queues.
    concurrency  INT UNSIGNED NOT NULL,
    -- The worker's lease and heartbeat interval (microseconds).
    lease_us     BIGINT UNSIGNED NOT NULL,
    heartbeat_us BIGINT UNSIGNED NOT NULL,
    -- Database clock, like every time taskq writes.
    started_at   DATETIME(6)  NOT NULL,
    last_seen_at DATETIME(6)  NOT NULL,
    stopped_at   DATETIME(6)  NULL,
    PRIMARY KEY (worker_id),
    -- Cleanup: last_seen_at < cutoff.
    KEY ix_taskq_workers_seen (last_seen_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

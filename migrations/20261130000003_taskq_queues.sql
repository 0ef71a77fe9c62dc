-- taskq schema v3: per-queue controls. A queue with paused_at set is not claimed from;
-- running tasks finish normally. Rows exist only for queues that were ever paused.
CREATE TABLE taskq_queues (
    queue      VARCHAR(64) NOT NULL,
    paused_at  DATETIME(6) NULL,
    updated_at DATETIME(6) NOT NULL,
    PRIMARY KEY (queue)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- taskq schema: recurring (cron) schedules. One row per schedule name, written by the workers
-- that declare the schedule (`#[taskq::task(cron = ..)]`, `WorkerBuilder::cron`): a worker
-- upserts its definition at start and advances `watermark` with a compare-and-set in the same
-- transaction that inserts the tick's task, so however many workers run, each tick is enqueued
-- once. The table is tiny (one row per schedule) and read by primary key only.
CREATE TABLE taskq_schedules (
    name           VARCHAR(200) NOT NULL,
    -- The task it enqueues, and where (as declared by the latest worker that started).
    task_name      VARCHAR(255) NOT NULL,
    queue          VARCHAR(64)  NOT NULL,
    -- The cron expression (5 or 6 fields) and its time zone ('UTC', '+02:00', 'Europe/Paris').
    -- A worker fires the schedule only while these equal its own definition.
    expression     VARCHAR(255) NOT NULL,
    timezone       VARCHAR(64)  NOT NULL,
    -- Missed-tick policy of the latest worker that started ('latest', 'skip', 'all(N)').
    missed_ticks   VARCHAR(32)  NOT NULL,
    -- Every tick at or before this time has been handled: enqueued, or skipped by the
    -- missed-tick policy. Set to the database clock when the schedule (or its expression or
    -- time zone) is new, so ticks before a deploy never fire.
    watermark      DATETIME(6)  NOT NULL,
    -- The latest tick enqueued (NULL: none yet), and by which worker.
    last_tick      DATETIME(6)  NULL,
    last_worker_id VARCHAR(128) NULL,
    -- The next tick after `watermark`, as computed by the worker that last wrote the row.
    next_tick      DATETIME(6)  NULL,
    -- When a worker last started with this definition.
    declared_at    DATETIME(6)  NOT NULL,
    created_at     DATETIME(6)  NOT NULL,
    updated_at     DATETIME(6)  NOT NULL,
    PRIMARY KEY (name)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- taskq's schema on SQLite: the state of the MySQL schema after its migrations 1 to 9
-- (../../migrations/), created in one step. The version is that of MySQL migration 9, so a
-- later migration carries the same number on both backends.
--
-- Types. Tables are STRICT (SQLite 3.37+): a value of the wrong type is an error, as on MySQL.
-- * Ids are `INTEGER PRIMARY KEY AUTOINCREMENT` (the rowid). AUTOINCREMENT never hands out an
--   id again, even after the highest rows were deleted (retention, a duplicate unique enqueue
--   undone): an id is half of the `(id, lease_epoch)` fencing token and the handle a client
--   keeps, so a reused id could let a stale write-back or an old `TaskId` reach a new task.
--   Plain rowids would reuse max(rowid)+1. It costs one `sqlite_sequence` update per insert.
-- * Times are INTEGER microseconds since the Unix epoch, UTC, always computed by SQL from the
--   database clock (the view `taskq_clock` below), never sent by a worker; callers send
--   durations, or absolute times a user gave (run_at, deadline).
-- * States are TEXT with CHECK constraints (MySQL: ENUM). Strings compare with BINARY
--   collation, like MySQL's utf8mb4_bin; the length CHECKs are MySQL's VARCHAR limits, so a
--   value too long for one backend is too long for both.
CREATE TABLE taskq_tasks (
    id                  INTEGER PRIMARY KEY AUTOINCREMENT,
    queue               TEXT    NOT NULL CHECK (length(queue) <= 64),
    name                TEXT    NOT NULL CHECK (length(name) <= 255),
    -- JSON text as bytes: the worker decodes it and sends undecodable rows to `dead`.
    payload             BLOB    NOT NULL,
    state               TEXT    NOT NULL CHECK (state IN
                            ('pending', 'running', 'succeeded', 'dead', 'canceled', 'expired')),
    -- Lower runs first (MySQL SMALLINT).
    priority            INTEGER NOT NULL DEFAULT 0 CHECK (priority BETWEEN -32768 AND 32767),
    -- Number of times the task has been claimed (started) so far.
    attempt             INTEGER NOT NULL DEFAULT 0 CHECK (attempt >= 0),
    max_attempts        INTEGER NOT NULL CHECK (max_attempts >= 0),
    run_at              INTEGER NOT NULL,
    lease_until         INTEGER,
    -- Fencing token: incremented by every claim, reap, release and manual retry.
    lease_epoch         INTEGER NOT NULL DEFAULT 0,
    worker_id           TEXT    CHECK (length(worker_id) <= 128),
    idempotency_key     TEXT    CHECK (length(idempotency_key) <= 255),
    -- The enqueuing request's trace context (MySQL migration 2).
    trace_context       TEXT    CHECK (length(trace_context) <= 512),
    last_error          TEXT,
    created_at          INTEGER NOT NULL,
    updated_at          INTEGER NOT NULL,
    finished_at         INTEGER,
    -- Unique tasks (MySQL migration 5): the identity (SHA-256) and how long it is held.
    unique_key          BLOB    CHECK (length(unique_key) = 32),
    unique_while        TEXT    CHECK (unique_while IN ('pending', 'running', 'window')),
    -- Snoozes so far, and the deadline no attempt starts at or after (MySQL migration 7).
    snoozes             INTEGER NOT NULL DEFAULT 0 CHECK (snoozes >= 0),
    deadline            INTEGER,
    -- When a cancel of the running task was requested (MySQL migration 9).
    cancel_requested_at INTEGER,
    CHECK ((unique_key IS NULL) = (unique_while IS NULL))
) STRICT;

-- Claim: state = 'pending' AND queue = ? AND run_at <= now ORDER BY priority, run_at, id, with
-- the name filter read from the index (MySQL migration 4). Partial: only pending rows are in
-- it, so claimed and finished rows never have to be stepped over. `id` is the rowid; naming it
-- before `name` keeps the entries in claim order.
CREATE INDEX ix_taskq_claim ON taskq_tasks (queue, priority, run_at, id, name)
    WHERE state = 'pending';
-- Reaper: state = 'running' AND lease_until < now ORDER BY lease_until.
CREATE INDEX ix_taskq_lease ON taskq_tasks (lease_until) WHERE state = 'running';
-- Retention: state = <terminal> AND finished_at < cutoff ORDER BY finished_at.
CREATE INDEX ix_taskq_finished ON taskq_tasks (state, finished_at) WHERE finished_at IS NOT NULL;
-- Idempotency: one row per (task name, key) while it exists. Partial: tasks without a key
-- (most of them) have no entry at all.
CREATE UNIQUE INDEX uq_taskq_idempotency ON taskq_tasks (name, idempotency_key)
    WHERE idempotency_key IS NOT NULL;

-- Per-queue controls (MySQL migration 3): a queue with paused_at set is not claimed from.
CREATE TABLE taskq_queues (
    queue      TEXT    NOT NULL PRIMARY KEY CHECK (length(queue) <= 64),
    paused_at  INTEGER,
    updated_at INTEGER NOT NULL
) STRICT, WITHOUT ROWID;

-- Held unique identities (MySQL migration 5): one row per identity, naming the task holding
-- it. The statements that end a hold delete the row in the same transaction; a window's row
-- is kept after a success and deleted once expires_at has passed.
CREATE TABLE taskq_unique (
    unique_key BLOB    NOT NULL PRIMARY KEY CHECK (length(unique_key) = 32),
    task_id    INTEGER NOT NULL,
    expires_at INTEGER
) STRICT, WITHOUT ROWID;
CREATE INDEX ix_taskq_unique_expires ON taskq_unique (expires_at) WHERE expires_at IS NOT NULL;

-- Recurring (cron) schedules (MySQL migration 6): one row per schedule name; see the MySQL
-- migration for the meaning of each column.
CREATE TABLE taskq_schedules (
    name           TEXT    NOT NULL PRIMARY KEY CHECK (length(name) <= 200),
    task_name      TEXT    NOT NULL CHECK (length(task_name) <= 255),
    queue          TEXT    NOT NULL CHECK (length(queue) <= 64),
    expression     TEXT    NOT NULL CHECK (length(expression) <= 255),
    timezone       TEXT    NOT NULL CHECK (length(timezone) <= 64),
    missed_ticks   TEXT    NOT NULL CHECK (length(missed_ticks) <= 32),
    watermark      INTEGER NOT NULL,
    last_tick      INTEGER,
    last_worker_id TEXT    CHECK (length(last_worker_id) <= 128),
    next_tick      INTEGER,
    declared_at    INTEGER NOT NULL,
    created_at     INTEGER NOT NULL,
    updated_at     INTEGER NOT NULL
) STRICT, WITHOUT ROWID;

-- Live workers (MySQL migration 8): one row per worker process, written by the worker.
CREATE TABLE taskq_workers (
    worker_id    TEXT    NOT NULL PRIMARY KEY CHECK (length(worker_id) <= 128),
    host         TEXT    NOT NULL CHECK (length(host) <= 255),
    pid          INTEGER NOT NULL CHECK (pid >= 0),
    -- JSON object: queue name -> concurrency of that queue in this worker.
    queues       TEXT    NOT NULL,
    concurrency  INTEGER NOT NULL CHECK (concurrency >= 0),
    -- The worker's lease and heartbeat interval (microseconds).
    lease_us     INTEGER NOT NULL CHECK (lease_us >= 0),
    heartbeat_us INTEGER NOT NULL CHECK (heartbeat_us >= 0),
    started_at   INTEGER NOT NULL,
    last_seen_at INTEGER NOT NULL,
    stopped_at   INTEGER
) STRICT, WITHOUT ROWID;
CREATE INDEX ix_taskq_workers_seen ON taskq_workers (last_seen_at);

-- The database clock: `SELECT us FROM taskq_clock` is now, in microseconds since the Unix
-- epoch (UTC). SQLite's 'now' has millisecond resolution and is the same for every use within
-- one statement. julianday() rather than unixepoch('subsec') (3.42+) so the schema also loads
-- in older sqlite3 shells; ROUND removes the floating-point error of the conversion.
CREATE VIEW taskq_clock (us) AS
    SELECT CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER) * 1000;

-- taskq schema v16 on SQLite (same version as MySQL migration 16): ordered tasks. See the
-- MySQL migration for the meaning of each column and of taskq_order_keys.
--
-- The new state `waiting` needs the state CHECK changed, which SQLite can only do by rebuilding
-- the table: a copy with the new definition, every row copied (ids kept), the old table
-- dropped, the copy renamed, its indexes created again, and the AUTOINCREMENT counter carried
-- over (so an id is never handed out again, even one deleted before this migration). It runs
-- inside the migrator's one BEGIN IMMEDIATE transaction.
CREATE TABLE taskq_tasks_v16 (
    id                  INTEGER PRIMARY KEY AUTOINCREMENT,
    queue               TEXT    NOT NULL CHECK (length(queue) <= 64),
    name                TEXT    NOT NULL CHECK (length(name) <= 255),
    payload             BLOB    NOT NULL,
    state               TEXT    NOT NULL CHECK (state IN
                            ('pending', 'running', 'succeeded', 'dead', 'canceled', 'expired',
                             'waiting')),
    priority            INTEGER NOT NULL DEFAULT 0 CHECK (priority BETWEEN -32768 AND 32767),
    attempt             INTEGER NOT NULL DEFAULT 0 CHECK (attempt >= 0),
    max_attempts        INTEGER NOT NULL CHECK (max_attempts >= 0),
    run_at              INTEGER NOT NULL,
    lease_until         INTEGER,
    lease_epoch         INTEGER NOT NULL DEFAULT 0,
    worker_id           TEXT    CHECK (length(worker_id) <= 128),
    idempotency_key     TEXT    CHECK (length(idempotency_key) <= 255),
    trace_context       TEXT    CHECK (length(trace_context) <= 512),
    last_error          TEXT,
    created_at          INTEGER NOT NULL,
    updated_at          INTEGER NOT NULL,
    finished_at         INTEGER,
    unique_key          BLOB    CHECK (length(unique_key) = 32),
    unique_while        TEXT    CHECK (unique_while IN ('pending', 'running', 'window')),
    snoozes             INTEGER NOT NULL DEFAULT 0 CHECK (snoozes >= 0),
    deadline            INTEGER,
    cancel_requested_at INTEGER,
    attempted_at        INTEGER,
    attempts            TEXT,
    -- Ordered tasks (MySQL migration 16).
    order_key           BLOB    CHECK (length(order_key) = 32),
    order_seq           INTEGER CHECK (order_seq >= 0),
    order_dead_skips    INTEGER NOT NULL DEFAULT 0 CHECK (order_dead_skips IN (0, 1)),
    CHECK ((unique_key IS NULL) = (unique_while IS NULL)),
    CHECK ((order_key IS NULL) = (order_seq IS NULL))
) STRICT;

INSERT INTO taskq_tasks_v16
    (id, queue, name, payload, state, priority, attempt, max_attempts, run_at, lease_until,
     lease_epoch, worker_id, idempotency_key, trace_context, last_error, created_at, updated_at,
     finished_at, unique_key, unique_while, snoozes, deadline, cancel_requested_at,
     attempted_at, attempts)
SELECT id, queue, name, payload, state, priority, attempt, max_attempts, run_at, lease_until,
     lease_epoch, worker_id, idempotency_key, trace_context, last_error, created_at, updated_at,
     finished_at, unique_key, unique_while, snoozes, deadline, cancel_requested_at,
     attempted_at, attempts
FROM taskq_tasks;

DELETE FROM sqlite_sequence WHERE name = 'taskq_tasks_v16';
INSERT INTO sqlite_sequence (name, seq)
    SELECT 'taskq_tasks_v16', seq FROM sqlite_sequence WHERE name = 'taskq_tasks';

DROP TABLE taskq_tasks;
ALTER TABLE taskq_tasks_v16 RENAME TO taskq_tasks;

-- The indexes of migrations 9 and 11, as they were.
CREATE INDEX ix_taskq_claim ON taskq_tasks (queue, priority, run_at, id, name)
    WHERE state = 'pending';
CREATE INDEX ix_taskq_lease ON taskq_tasks (lease_until) WHERE state = 'running';
CREATE INDEX ix_taskq_finished ON taskq_tasks (state, finished_at) WHERE finished_at IS NOT NULL;
CREATE UNIQUE INDEX uq_taskq_idempotency ON taskq_tasks (name, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
CREATE INDEX ix_taskq_running ON taskq_tasks (queue) WHERE state = 'running';
-- Promotion (the lowest waiting seq of a key) and the held-back keys' view. Partial: tasks
-- that are not ordered have no entry.
CREATE INDEX ix_taskq_order ON taskq_tasks (order_key, order_seq) WHERE order_key IS NOT NULL;

CREATE TABLE taskq_order_keys (
    order_key    BLOB    NOT NULL PRIMARY KEY CHECK (length(order_key) = 32),
    next_seq     INTEGER NOT NULL,
    head_task_id INTEGER
) STRICT, WITHOUT ROWID;

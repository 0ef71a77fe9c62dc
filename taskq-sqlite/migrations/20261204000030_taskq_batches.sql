-- taskq schema v30 on SQLite (same version as MySQL migration 30): batches. See the MySQL
-- migration for the meaning of each column. Times: µs since the Unix epoch on the database
-- clock (taskq_clock).
ALTER TABLE taskq_tasks ADD COLUMN batch_id INTEGER;

CREATE TABLE taskq_batches (
    id               INTEGER PRIMARY KEY AUTOINCREMENT,
    name             TEXT    NOT NULL CHECK (length(name) BETWEEN 1 AND 255),
    created_at       INTEGER NOT NULL,
    total            INTEGER NOT NULL CHECK (total >= 0),
    succeeded        INTEGER NOT NULL DEFAULT 0 CHECK (succeeded >= 0),
    failed           INTEGER NOT NULL DEFAULT 0 CHECK (failed >= 0),
    sealed           INTEGER NOT NULL CHECK (sealed IN (0, 1)),
    success_task_id  INTEGER,
    complete_task_id INTEGER,
    completed_at     INTEGER,
    succeeded_at     INTEGER,
    canceled_at      INTEGER
) STRICT;
CREATE INDEX ix_taskq_batches_name ON taskq_batches (name, id);

CREATE TABLE taskq_batch_members (
    task_id  INTEGER NOT NULL PRIMARY KEY,
    batch_id INTEGER NOT NULL,
    counted  INTEGER NOT NULL DEFAULT 0 CHECK (counted IN (0, 1, 2))
) STRICT;
CREATE INDEX ix_taskq_batch_member ON taskq_batch_members (batch_id, task_id);
CREATE INDEX ix_taskq_batch_member_counted ON taskq_batch_members (counted, task_id);

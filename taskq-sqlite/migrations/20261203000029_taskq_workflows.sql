-- taskq schema v29 on SQLite (same version as MySQL migration 29): workflows. See the MySQL
-- migration for the meaning of each column. Times: µs since the Unix epoch on the database
-- clock (taskq_clock).
ALTER TABLE taskq_tasks ADD COLUMN workflow_id INTEGER;

CREATE TABLE taskq_workflows (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    name        TEXT    NOT NULL CHECK (length(name) BETWEEN 1 AND 255),
    created_at  INTEGER NOT NULL,
    canceled_at INTEGER
) STRICT;
CREATE INDEX ix_taskq_workflows_name ON taskq_workflows (name, id);

CREATE TABLE taskq_workflow_steps (
    task_id            INTEGER NOT NULL PRIMARY KEY,
    workflow_id        INTEGER NOT NULL,
    seq                INTEGER NOT NULL,
    step               TEXT    NOT NULL CHECK (length(step) BETWEEN 1 AND 255),
    deps_left          INTEGER NOT NULL,
    runs_after_failure INTEGER NOT NULL CHECK (runs_after_failure IN (0, 1)),
    canceled_by_dep    INTEGER NOT NULL DEFAULT 0 CHECK (canceled_by_dep IN (0, 1))
) STRICT;
CREATE UNIQUE INDEX uq_taskq_workflow_step ON taskq_workflow_steps (workflow_id, step);
CREATE INDEX ix_taskq_workflow_seq ON taskq_workflow_steps (workflow_id, seq);

CREATE TABLE taskq_workflow_deps (
    dep_task_id INTEGER NOT NULL,
    task_id     INTEGER NOT NULL,
    settled     INTEGER NOT NULL DEFAULT 0 CHECK (settled IN (0, 1)),
    PRIMARY KEY (dep_task_id, task_id)
) STRICT, WITHOUT ROWID;
CREATE INDEX ix_taskq_workflow_step_deps ON taskq_workflow_deps (task_id);
-- Partial: settled edges have no entry.
CREATE INDEX ix_taskq_workflow_unsettled ON taskq_workflow_deps (dep_task_id) WHERE settled = 0;

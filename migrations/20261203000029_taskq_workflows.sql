-- taskq schema v29: workflows, steps that run after other steps (`taskq::workflow`).
--
-- taskq_tasks.workflow_id: the workflow a task is a step of; NULL for every other task (an
-- INSTANT column: no rewrite). The claim reads it, so a worker knows without another statement
-- that an outcome it writes back ends a step and settles the steps after it in the same
-- transaction; a task that is no step adds nothing to its claim or write-back.
--
-- taskq_workflows: one row per workflow. name is a label for people, not unique;
-- canceled_at is set when an operator cancels it. Its state is derived from its steps'.
--
-- taskq_workflow_steps: one row per step, keyed by its task.
--   step               the step's name, unique in its workflow;
--   deps_left          how many of the steps it runs after have not ended for it yet (see
--                      taskq_driver::rules::workflow::dependency_end); at 0 a waiting step is
--                      made pending. Signed, so that a bug shows as a negative number, not a
--                      wrapped one.
--   runs_after_failure 1: a cleanup step, run once its dependencies ended however they ended;
--   canceled_by_dep    1: canceled because a step it runs after did not succeed (an operator's
--                      retry of that step brings it back).
--   seq                the step's place in the workflow's insert order.
--
-- taskq_workflow_deps: one row per edge, step task_id runs after dep_task_id. settled = 1 once
-- the dependency's end was applied to the step (exactly once: the settle locks the edge and
-- reads it unsettled). ix_taskq_workflow_unsettled finds the ended dependencies the write-back
-- did not settle (a reap, an operator's cancel, an expiry), for the reaper's sweep.
ALTER TABLE taskq_tasks ADD COLUMN workflow_id BIGINT UNSIGNED NULL;

CREATE TABLE taskq_workflows (
    id          BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
    name        VARCHAR(255)    NOT NULL,
    created_at  DATETIME(6)     NOT NULL,
    canceled_at DATETIME(6)     NULL,
    PRIMARY KEY (id),
    KEY ix_taskq_workflows_name (name, id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

CREATE TABLE taskq_workflow_steps (
    task_id            BIGINT UNSIGNED NOT NULL,
    workflow_id        BIGINT UNSIGNED NOT NULL,
    seq                INT UNSIGNED    NOT NULL,
    step               VARCHAR(255)    NOT NULL,
    deps_left          INT             NOT NULL,
    runs_after_failure TINYINT(1)      NOT NULL,
    canceled_by_dep    TINYINT(1)      NOT NULL DEFAULT 0,
    PRIMARY KEY (task_id),
    UNIQUE KEY uq_taskq_workflow_step (workflow_id, step),
    KEY ix_taskq_workflow_seq (workflow_id, seq)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

CREATE TABLE taskq_workflow_deps (
    dep_task_id BIGINT UNSIGNED NOT NULL,
    task_id     BIGINT UNSIGNED NOT NULL,
    settled     TINYINT(1)      NOT NULL DEFAULT 0,
    PRIMARY KEY (dep_task_id, task_id),
    KEY ix_taskq_workflow_step_deps (task_id),
    KEY ix_taskq_workflow_unsettled (settled, dep_task_id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

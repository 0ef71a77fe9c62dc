-- The operator's Retrying view: pending tasks that have made at least one attempt, soonest
-- first, by (run_at, id) (MySQL migration 20261201000024, which needs a generated column for
-- the same thing). A partial index holds exactly those rows, so the view is one keyset range
-- and a task that never fails never enters it.
CREATE INDEX ix_taskq_retrying ON taskq_tasks (run_at, id) WHERE state = 'pending' AND attempt > 0;

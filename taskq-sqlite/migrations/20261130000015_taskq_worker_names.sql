-- taskq schema v15 on SQLite (same version as MySQL migration 15): the task names each worker
-- registers, on its row in taskq_workers (JSON array; NULL: a row written by a worker of an
-- earlier version, taken as registering every name). With the queues it works, it says which
-- due pending tasks no live worker will claim.
ALTER TABLE taskq_workers ADD COLUMN names TEXT;

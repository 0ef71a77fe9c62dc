-- taskq schema v31 on SQLite (same version as MySQL migration 31): a task's output, the JSON
-- text its successful handler returned (NULL: none). See the MySQL migration.
ALTER TABLE taskq_tasks ADD COLUMN output TEXT;

-- taskq schema v13: what running on a Galera cluster needs.
--   taskq_tasks.enqueue_batch: a random marker written by one multi-row enqueue statement
--     (`enqueue_many`), so the statement's rows can be read back by it when the server does
--     not promise consecutive ids (innodb_autoinc_lock_mode = 2, required by Galera and MySQL
--     8's default). NULL for rows inserted one at a time. Not indexed: the rows are found by a
--     primary-key range scan starting at the statement's first id.
--   taskq_migration_lock: the migration lock. GET_LOCK is local to one server (Galera does not
--     replicate it), so `taskq::migrate` takes this row instead: inserting it is a replicated
--     write, and of two migrators on different nodes only one insert commits (the other gets a
--     duplicate key or a certification failure and waits). `migrate` creates the table itself
--     before taking the lock (it must exist before the first migration); this statement is a
--     no-op then and records it in the schema.
ALTER TABLE taskq_tasks ADD COLUMN enqueue_batch BIGINT UNSIGNED NULL;

CREATE TABLE IF NOT EXISTS taskq_migration_lock (
    id         TINYINT UNSIGNED NOT NULL,
    holder     VARCHAR(64)      NOT NULL,
    expires_at DATETIME(6)      NOT NULL,
    PRIMARY KEY (id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

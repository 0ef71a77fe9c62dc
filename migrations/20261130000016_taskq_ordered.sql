-- taskq schema v16: ordered tasks ("one at a time per key, in commit order").
--
-- On the task row, set at enqueue and never changed:
--   order_key        the order key: SHA-256 of the queue and the selected payload fields (or
--                    of the queue and the key given at enqueue). NULL: not ordered.
--   order_seq        the task's place in its key's order: taken from taskq_order_keys.next_seq
--                    by the enqueue, under that row's lock, so seq order is commit order.
--   order_dead_skips 1: when this task dies, its key goes on with the next task (opt-in,
--                    `ordered_dead_after`); 0: a dead head holds its key until an operator
--                    retries, cancels or deletes it.
-- A new state, `waiting`, holds the tasks queued behind their key's head: out of the claim
-- index's `pending` range, so a key with many tasks queued costs the claim nothing. The ENUM
-- value is appended (existing values keep their numbers: metadata-only on MySQL 8 and
-- MariaDB 10.6+); the columns are appended (INSTANT); the index is built online.
--
-- taskq_order_keys has one row per key ever used: the next sequence number and the task that
-- is the key's head (the only one of the key that is pending, running, or dead and holding
-- it), NULL when none is. Its own table with a PRIMARY KEY (like taskq_unique), so the
-- enqueue's upsert locks one record and never a gap of taskq_tasks.
ALTER TABLE taskq_tasks
    MODIFY COLUMN state ENUM('pending', 'running', 'succeeded', 'dead', 'canceled', 'expired',
                             'waiting') NOT NULL,
    ADD COLUMN order_key        BINARY(32)      NULL,
    ADD COLUMN order_seq        BIGINT UNSIGNED NULL,
    ADD COLUMN order_dead_skips TINYINT(1)      NOT NULL DEFAULT 0;

-- Promotion: the lowest waiting seq of a key; the held-back keys' view.
CREATE INDEX ix_taskq_order ON taskq_tasks (order_key, order_seq);

CREATE TABLE taskq_order_keys (
    order_key    BINARY(32)      NOT NULL,
    next_seq     BIGINT UNSIGNED NOT NULL,
    head_task_id BIGINT UNSIGNED NULL,
    PRIMARY KEY (order_key)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

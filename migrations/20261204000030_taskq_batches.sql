-- taskq schema v30: batches, groups of tasks with callbacks (`taskq::batch`).
--
-- taskq_tasks.batch_id: the batch a task is a member of; NULL for every other task (an INSTANT
-- column: no rewrite). The claim reads it, so a worker knows without another statement that an
-- outcome it writes back ends a member and is counted in its batch in the same transaction; a
-- task that is no member adds nothing to its claim or write-back. A callback is not a member.
--
-- taskq_batches: one row per batch, with its counters, so that its progress is one row.
--   name               a label for people, not unique;
--   total              members added;
--   succeeded, failed  members whose end was counted (taskq_driver::rules::batch::count):
--                      succeeded, or dead / canceled / expired / deleted;
--   sealed             1 once no member will be added but by a member: the callbacks are
--                      released when every member has ended;
--   success_task_id    the on_success callback, a task inserted 'waiting', made due when every
--                      member succeeded (canceled when the batch completes with a failure);
--   complete_task_id   the on_complete callback, made due when every member has ended;
--   completed_at       when every member had ended (on_complete released, once);
--   succeeded_at       when every member had succeeded (on_success released, once);
--   canceled_at        when an operator canceled it.
--
-- taskq_batch_members: one row per member, keyed by its task. counted: 0 not counted, 1
-- counted as succeeded, 2 as failed; a count locks the row and applies the change once.
-- ix_taskq_batch_member_counted finds the ends the write-back did not count (a reap, an
-- operator's cancel, an expiry) and the failed members an operator retried, for the sweep.
ALTER TABLE taskq_tasks ADD COLUMN batch_id BIGINT UNSIGNED NULL;

CREATE TABLE taskq_batches (
    id               BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
    name             VARCHAR(255)    NOT NULL,
    created_at       DATETIME(6)     NOT NULL,
    total            INT UNSIGNED    NOT NULL,
    succeeded        INT UNSIGNED    NOT NULL DEFAULT 0,
    failed           INT UNSIGNED    NOT NULL DEFAULT 0,
    sealed           TINYINT(1)      NOT NULL,
    success_task_id  BIGINT UNSIGNED NULL,
    complete_task_id BIGINT UNSIGNED NULL,
    completed_at     DATETIME(6)     NULL,
    succeeded_at     DATETIME(6)     NULL,
    canceled_at      DATETIME(6)     NULL,
    PRIMARY KEY (id),
    KEY ix_taskq_batches_name (name, id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

CREATE TABLE taskq_batch_members (
    task_id  BIGINT UNSIGNED NOT NULL,
    batch_id BIGINT UNSIGNED NOT NULL,
    counted  TINYINT         NOT NULL DEFAULT 0,
    PRIMARY KEY (task_id),
    KEY ix_taskq_batch_member (batch_id, task_id),
    KEY ix_taskq_batch_member_counted (counted, task_id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

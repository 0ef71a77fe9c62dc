-- taskq schema v14: taskq_queues.claims, a counter of the claims that started tasks of the
-- queue while it was limited (a concurrency or rate limit). The claim reads it under the row
-- lock with the limits, and the statement that starts its tasks bumps it on condition that it
-- is unchanged. On a Galera cluster the row lock holds on one node only: the write makes two
-- claims of one limited queue on two nodes conflict at certification (one is rolled back),
-- where a claim that only read the row let every node fill the queue to its limit; the
-- condition makes a claim whose transaction the server dropped without an error take nothing.
-- Unlimited queues never touch the row. An instant column append on a small table.
ALTER TABLE taskq_queues ADD COLUMN claims BIGINT UNSIGNED NOT NULL DEFAULT 0;

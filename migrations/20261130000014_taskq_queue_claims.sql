-- taskq schema v14: taskq_queues.claims, the number of claims that started tasks of the queue
-- while it was limited. Every such claim writes it (one more UPDATE of the row the claim has
-- locked anyway; a rate-limited claim writes it in the statement that counts its window), so
-- that on a Galera cluster two claims of one limited queue committed on different nodes touch
-- the same row and certification rolls one of them back: the row lock alone is local to a
-- node and a claim that only reads the row would let every node fill the queue to its limit.
-- Unlimited queues never touch the row. An instant column append on a small table.
ALTER TABLE taskq_queues ADD COLUMN claims BIGINT UNSIGNED NOT NULL DEFAULT 0;

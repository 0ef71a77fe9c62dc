-- taskq schema v26: the inbox, one row per (consumer, message id) a consumer has recorded
-- (`taskq::Inbox::record_tx`, in the consumer's own transaction, with the effects of handling
-- that message: the row exists if and only if they committed).
--   consumer: the consuming service's name (one inbox table serves several consumers).
--   message_id: the broker message's id (`Nats-Msg-Id`, AMQP `message_id`, the `id` field of a
--     Redis stream entry...), compared byte for byte (utf8mb4_bin).
--   seen_at: when it was first recorded (database clock); retention deletes by it.
--   repeats: how many times it was recorded again after that (redeliveries the consumer
--     dropped), counted by the upsert that records (see taskq-mysql/src/inbox.rs).
CREATE TABLE taskq_inbox (
    consumer   VARCHAR(128) NOT NULL,
    message_id VARCHAR(255) NOT NULL,
    seen_at    DATETIME(6) NOT NULL,
    repeats    BIGINT UNSIGNED NOT NULL DEFAULT 0,
    PRIMARY KEY (consumer, message_id),
    KEY ix_taskq_inbox_seen (consumer, seen_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

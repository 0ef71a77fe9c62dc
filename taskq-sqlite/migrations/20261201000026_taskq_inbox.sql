-- taskq schema v26 on SQLite (same version as MySQL migration 26): the inbox, one row per
-- (consumer, message id) a consumer has recorded (`taskq::Inbox::record_tx`, in the consumer's
-- own transaction). seen_at: µs since the Unix epoch on the database clock (taskq_clock);
-- repeats: how many times the id was recorded again after the first. Ids compare byte for byte
-- (TEXT's default BINARY collation).
CREATE TABLE taskq_inbox (
    consumer   TEXT    NOT NULL CHECK (length(consumer) BETWEEN 1 AND 128),
    message_id TEXT    NOT NULL CHECK (length(message_id) BETWEEN 1 AND 255),
    seen_at    INTEGER NOT NULL,
    repeats    INTEGER NOT NULL DEFAULT 0 CHECK (repeats >= 0),
    PRIMARY KEY (consumer, message_id)
) STRICT, WITHOUT ROWID;
CREATE INDEX ix_taskq_inbox_seen ON taskq_inbox (consumer, seen_at);

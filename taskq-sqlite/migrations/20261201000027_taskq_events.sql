-- taskq schema v27 on SQLite (same version as MySQL migration 27): events and the relay's
-- state per key. See the MySQL migration for the meaning of each column. Times are µs since
-- the Unix epoch on the database clock (taskq_clock).
CREATE TABLE taskq_event_keys (
    key_hash    BLOB    NOT NULL PRIMARY KEY CHECK (length(key_hash) = 32),
    topic       TEXT    NOT NULL CHECK (length(topic) BETWEEN 1 AND 255),
    event_key   TEXT    NOT NULL CHECK (length(event_key) BETWEEN 1 AND 255),
    next_seq    INTEGER NOT NULL CHECK (next_seq >= 0),
    done_seq    INTEGER NOT NULL DEFAULT 0 CHECK (done_seq >= 0),
    ready_at    INTEGER,
    lease_owner TEXT    CHECK (length(lease_owner) <= 128),
    lease_epoch INTEGER NOT NULL DEFAULT 0,
    lease_until INTEGER,
    failures    INTEGER NOT NULL DEFAULT 0 CHECK (failures >= 0),
    last_error  TEXT,
    held_at     INTEGER,
    held_seq    INTEGER
) STRICT, WITHOUT ROWID;
CREATE INDEX ix_taskq_event_keys_ready ON taskq_event_keys (ready_at) WHERE ready_at IS NOT NULL;
CREATE INDEX ix_taskq_event_keys_held ON taskq_event_keys (held_at) WHERE held_at IS NOT NULL;

CREATE TABLE taskq_events (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    key_hash     BLOB    NOT NULL CHECK (length(key_hash) = 32),
    seq          INTEGER NOT NULL CHECK (seq >= 1),
    topic        TEXT    NOT NULL CHECK (length(topic) BETWEEN 1 AND 255),
    event_key    TEXT    NOT NULL CHECK (length(event_key) BETWEEN 1 AND 255),
    message_id   TEXT    NOT NULL CHECK (length(message_id) BETWEEN 1 AND 64),
    payload      BLOB    NOT NULL,
    headers      TEXT,
    created_at   INTEGER NOT NULL,
    dead_at      INTEGER,
    last_error   TEXT
) STRICT;
CREATE UNIQUE INDEX uq_taskq_events_seq ON taskq_events (key_hash, seq);
CREATE INDEX ix_taskq_events_created ON taskq_events (created_at) WHERE dead_at IS NULL;
CREATE INDEX ix_taskq_events_topic ON taskq_events (topic, created_at);

-- taskq schema v27: events (the outbox, issue 26) and the relay's state per key.
--
-- taskq_event_keys: one row per (topic, key) ever published.
--   key_hash     SHA-256 of topic, 0x00, key (taskq_driver::rules::event::key_hash): the
--                primary key, so the publisher's upsert locks one record and never a gap.
--   next_seq     the key's last sequence number, taken by the publishing transaction under
--                this row's lock (held to its commit): seq order is commit order.
--   done_seq     every event of the key up to it is delivered or dead (the record of
--                delivery: no event row is written when delivered); the relay reads from
--                done_seq + 1. done_seq < next_seq: the key has work, and then ready_at or
--                held_at is set.
--   ready_at     when a relay may take the key next: NULL when it has nothing to do (idle)
--                or is held; the publish sets it to now when NULL; a lease sets it to the
--                lease's end, a failure to the end of the backoff.
--   lease_owner, lease_epoch, lease_until: the relay holding the key, a fencing token (+1 on
--                every lease and every operator action), the end of the lease (db clock).
--   failures     failed rounds in a row (the backoff's attempt number); 0 after a success.
--   last_error   the latest failure or rejection.
--   held_at, held_seq: a rejected event holds the key (strict mode) from held_at on, at
--                held_seq, until an operator replays, retries or skips it.
CREATE TABLE taskq_event_keys (
    key_hash    BINARY(32)      NOT NULL,
    topic       VARCHAR(255)    NOT NULL,
    event_key   VARCHAR(255)    NOT NULL,
    next_seq    BIGINT UNSIGNED NOT NULL,
    done_seq    BIGINT UNSIGNED NOT NULL DEFAULT 0,
    ready_at    DATETIME(6)     NULL,
    lease_owner VARCHAR(128)    NULL,
    lease_epoch BIGINT UNSIGNED NOT NULL DEFAULT 0,
    lease_until DATETIME(6)     NULL,
    failures    INT UNSIGNED    NOT NULL DEFAULT 0,
    last_error  TEXT            NULL,
    held_at     DATETIME(6)     NULL,
    held_seq    BIGINT UNSIGNED NULL,
    PRIMARY KEY (key_hash),
    KEY ix_taskq_event_keys_ready (ready_at),
    KEY ix_taskq_event_keys_held (held_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- taskq_events: one row per published event. A delivered event's row is never written: its
-- key's done_seq records delivery (see taskq_driver::event).
--   message_id   stable id of the event (32 hex chars, random), the broker message's id.
--   payload      the event, serde_json bytes; headers: JSON array of [name, value], NULL: none.
--   dead_at      when it was dead-lettered (rejected, dead-letter mode) or skipped by an
--                operator; NULL: not dead. Only ever set at or below the key's done_seq.
--                State: dead if dead_at is set, else delivered if seq <= the key's done_seq,
--                else pending.
--   last_error   the rejection of a dead event.
--   ix_taskq_events_created  retention: the events not dead, by publish time.
--   ix_taskq_events_topic    replay of a topic's time range.
CREATE TABLE taskq_events (
    id           BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
    key_hash     BINARY(32)      NOT NULL,
    seq          BIGINT UNSIGNED NOT NULL,
    topic        VARCHAR(255)    NOT NULL,
    event_key    VARCHAR(255)    NOT NULL,
    message_id   VARCHAR(64)     NOT NULL,
    payload      LONGBLOB        NOT NULL,
    headers      LONGTEXT        NULL,
    created_at   DATETIME(6)     NOT NULL,
    dead_at      DATETIME(6)     NULL,
    last_error   TEXT            NULL,
    PRIMARY KEY (id),
    UNIQUE KEY uq_taskq_events_seq (key_hash, seq),
    KEY ix_taskq_events_created (dead_at, created_at),
    KEY ix_taskq_events_topic (topic, created_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

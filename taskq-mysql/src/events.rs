//! Events (`taskq_events`) and the relay's keys (`taskq_event_keys`): the publish in the
//! caller's transaction, the relay's lease / read / renew / settle, and the operator's reads,
//! retention, replays and releases.
//!
//! A delivered event's row is never written: the key's `done_seq` records delivery (see
//! `taskq_driver::event`); only a dead event carries a mark (`dead_at`).
//!
//! Lock order, the same in every transaction: the key row first, then its event rows. The
//! publish upserts the key row (its lock held to the caller's commit, so a key's seq order is
//! its commit order) and then inserts the event; a relay's settle updates the key row under
//! its epoch and then marks the events. A relay's transaction that may wait for a key row
//! (settle) holds no other key row: a publisher's transaction can lock several keys
//! in any order, and waiting on one key while holding another could deadlock with it. The
//! lease and the renewal take many keys at once, but with `SKIP LOCKED` (they never wait). The
//! operator's replay of a time range locks its keys in hash order.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use sqlx::{Connection, MySqlConnection, MySqlPool};

use taskq_driver::event::*;
use taskq_driver::rows::hex;

/// Inserts an event on `conn` (see [`taskq_driver::driver::Enqueue::event_insert`]). Outside a
/// transaction the statements run in a short one of their own.
pub(crate) async fn event_insert(
    conn: &mut MySqlConnection,
    e: &NewEvent<'_>,
) -> sqlx::Result<EventInserted> {
    if conn.is_in_transaction() {
        return insert(conn, e).await;
    }
    let mut tx = conn.begin().await?;
    let out = insert(&mut tx, e).await?;
    tx.commit().await?;
    Ok(out)
}

async fn insert(conn: &mut MySqlConnection, e: &NewEvent<'_>) -> sqlx::Result<EventInserted> {
    let hash = key_hash(e.topic, e.key);
    // A new key row is seq 1 (1 affected row); an existing one counts up, and
    // `LAST_INSERT_ID(expr)` hands the new number back in the statement's answer (2 affected
    // rows: the update always changes `next_seq`). The row stays locked to the commit.
    let done = sqlx::query!(
        r#"INSERT INTO taskq_event_keys (key_hash, topic, event_key, next_seq, ready_at)
           VALUES (?, ?, ?, 1, UTC_TIMESTAMP(6))
           ON DUPLICATE KEY UPDATE
             next_seq = LAST_INSERT_ID(next_seq + 1),
             ready_at = IF(held_at IS NULL, COALESCE(ready_at, UTC_TIMESTAMP(6)), NULL)"#,
        &hash[..],
        e.topic,
        e.key,
    )
    .execute(&mut *conn)
    .await?;
    let seq = if done.rows_affected() == 1 {
        1
    } else {
        done.last_insert_id()
    };
    let headers = headers_json(e.headers);
    let ins = sqlx::query!(
        r#"INSERT INTO taskq_events
             (key_hash, seq, topic, event_key, message_id, payload, headers, created_at)
           VALUES (?, ?, ?, ?, ?, ?, ?, UTC_TIMESTAMP(6))"#,
        &hash[..],
        seq,
        e.topic,
        e.key,
        e.message_id,
        e.payload,
        headers,
    )
    .execute(&mut *conn)
    .await?;
    Ok(EventInserted {
        id: ins.last_insert_id(),
        seq,
    })
}

/// `[hex hash, ...]` as JSON.
fn hashes_json<'a>(hashes: impl Iterator<Item = &'a [u8; 32]>) -> String {
    let v: Vec<String> = hashes.map(|h| hex(h)).collect();
    serde_json::to_string(&v).expect("hashes serialize")
}

/// A ready key as the claim reads it.
struct ReadyKey {
    key_hash: Vec<u8>,
    topic: String,
    event_key: String,
    lease_epoch: u64,
    done_seq: u64,
    next_seq: u64,
    failures: u32,
}

/// Up to `limit` ready keys (of `topics`, JSON; `None`: every topic), oldest ready first: a
/// locking read of `ix_taskq_event_keys_ready` that skips rows another relay or a publisher
/// holds (in a transaction the rows stay locked to its end; outside one, to the statement's).
async fn ready_keys(
    conn: &mut MySqlConnection,
    topics: Option<&str>,
    limit: u32,
) -> sqlx::Result<Vec<ReadyKey>> {
    let rows = sqlx::query!(
        r#"SELECT key_hash AS "key_hash: Vec<u8>", topic, event_key,
                  lease_epoch AS "lease_epoch: u64", done_seq AS "done_seq: u64",
                  next_seq AS "next_seq: u64", failures AS "failures: u32"
           FROM taskq_event_keys FORCE INDEX (ix_taskq_event_keys_ready)
           WHERE ready_at <= UTC_TIMESTAMP(6)
             AND (? IS NULL OR JSON_CONTAINS(?, JSON_QUOTE(topic)))
           ORDER BY ready_at
           LIMIT ?
           FOR UPDATE SKIP LOCKED"#,
        topics,
        topics,
        limit,
    )
    .fetch_all(&mut *conn)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| ReadyKey {
            key_hash: r.key_hash,
            topic: r.topic,
            event_key: r.event_key,
            lease_epoch: r.lease_epoch,
            done_seq: r.done_seq,
            next_seq: r.next_seq,
            failures: r.failures,
        })
        .collect())
}

/// Leases ready keys (see [`taskq_driver::driver::Events::event_key_claim`]): a locking read of
/// `ix_taskq_event_keys_ready` that skips rows another relay or a publisher holds, then one
/// `UPDATE` by primary key of the first of those rows whose backlogs reach `req.events`; one
/// transaction. With `req.probe` the same read runs first on its own (autocommit: its row
/// locks end with it), and the transaction only when it found a key: one statement when none
/// is ready, instead of `BEGIN`, the read and `COMMIT`.
pub(crate) async fn event_key_claim(
    pool: &MySqlPool,
    req: &EventClaim<'_>,
) -> sqlx::Result<Vec<EventLease>> {
    let topics = req.topics.map(|t| t.json());
    let mut conn = pool.acquire().await?;
    if req.probe && ready_keys(&mut conn, topics, 1).await?.is_empty() {
        return Ok(Vec::new());
    }
    let mut tx = conn.begin().await?;
    let rows = ready_keys(&mut tx, topics, req.limit).await?;
    // Keys past the ones whose backlogs fill `req.events` are left alone (their row locks
    // end with the transaction).
    let n = keys_for_events(
        rows.iter().map(|r| r.next_seq.saturating_sub(r.done_seq)),
        req.events,
    );
    if n == 0 {
        tx.commit().await?;
        return Ok(Vec::new());
    }
    let leases: Vec<EventLease> = rows
        .into_iter()
        .take(n)
        .map(|r| EventLease {
            key_hash: hash_of(&r.key_hash),
            topic: r.topic,
            key: r.event_key,
            epoch: r.lease_epoch + 1,
            done_seq: r.done_seq,
            next_seq: r.next_seq,
            failures: r.failures,
        })
        .collect();
    let json = hashes_json(leases.iter().map(|l| &l.key_hash));
    sqlx::query!(
        r#"UPDATE JSON_TABLE(?, '$[*]' COLUMNS (h VARCHAR(64) PATH '$')) AS j
             STRAIGHT_JOIN taskq_event_keys k FORCE INDEX (PRIMARY) ON k.key_hash = UNHEX(j.h)
           SET k.lease_epoch = k.lease_epoch + 1, k.lease_owner = ?,
               k.lease_until = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND,
               k.ready_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND"#,
        json,
        req.owner,
        req.lease_us,
        req.lease_us,
    )
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(leases)
}

/// The events of each range (none dead: see `taskq_driver::event`), by range then seq: one
/// statement, a range read of `uq_taskq_events_seq` per range, driven from the JSON side.
///
/// The join's condition on the key is written as a closed interval (`>=` and `<=`) rather
/// than `=`: with `=` the server reads each key by `ref` on the hash alone and filters the
/// seqs, so a read walks every stored event of the key (delivered ones too, until pruned),
/// 20,000 index entries for 512 events of a key with 20,000. With the interval it re-plans
/// the range for each JSON row ("Range checked for each record" on MariaDB 10.11), starting
/// at the range's first seq. No `ORDER BY`: sorting joined rows with their payloads cost the
/// server a temporary table and a filesort; the rows are put in range then seq order here.
pub(crate) async fn event_read(
    pool: &MySqlPool,
    ranges: &[EventRange],
) -> sqlx::Result<Vec<EventRow>> {
    if ranges.is_empty() {
        return Ok(Vec::new());
    }
    let v: Vec<(String, u64, u64)> = ranges
        .iter()
        .map(|r| (hex(&r.key_hash), r.after_seq, r.up_to))
        .collect();
    let json = serde_json::to_string(&v).expect("ranges serialize");
    let rows = sqlx::query!(
        r#"SELECT e.id AS "id: u64", e.key_hash AS "key_hash: Vec<u8>", e.seq AS "seq: u64",
                  e.topic, e.event_key, e.message_id, e.payload, e.headers
           FROM JSON_TABLE(?, '$[*]' COLUMNS (h VARCHAR(64) PATH '$[0]',
                                              a BIGINT UNSIGNED PATH '$[1]',
                                              b BIGINT UNSIGNED PATH '$[2]')) AS j
             STRAIGHT_JOIN taskq_events e FORCE INDEX (uq_taskq_events_seq)
               ON e.key_hash >= UNHEX(j.h) AND e.key_hash <= UNHEX(j.h)
                  AND e.seq > j.a AND e.seq <= j.b
           WHERE e.dead_at IS NULL"#,
        json,
    )
    .fetch_all(pool)
    .await?;
    let mut rows: Vec<EventRow> = rows
        .into_iter()
        .map(|r| EventRow {
            id: r.id,
            key_hash: hash_of(&r.key_hash),
            seq: r.seq,
            topic: r.topic,
            key: r.event_key,
            message_id: r.message_id,
            payload: r.payload,
            headers: headers_parse(r.headers.as_deref()),
        })
        .collect();
    sort_by_range(&mut rows, ranges);
    Ok(rows)
}

/// Puts `rows` in the order of their keys' first range in `ranges`, then by seq.
fn sort_by_range(rows: &mut [EventRow], ranges: &[EventRange]) {
    let mut at: std::collections::HashMap<[u8; 32], usize> =
        std::collections::HashMap::with_capacity(ranges.len());
    for (i, r) in ranges.iter().enumerate() {
        at.entry(r.key_hash).or_insert(i);
    }
    rows.sort_by_key(|r| (at.get(&r.key_hash).copied().unwrap_or(usize::MAX), r.seq));
}

/// Renews the leases still held under their epochs; the keys still held (see
/// [`taskq_driver::driver::Events::event_key_renew`]). Never waits for a row lock, so a
/// publisher's open transaction on one key cannot hold up the renewal of the others:
///
/// 1. one transaction: a locking read by primary key of the keys still leased under their
///    epochs, `FOR UPDATE SKIP LOCKED` (a row another transaction holds is skipped), one
///    multi-row `UPDATE` of the rows it locked; commit;
/// 2. the keys it skipped, a plain (non-locking) read: a key still leased under its epoch is
///    held by a publisher's transaction at this moment; it is not renewed now (the next
///    renewal tries again; another relay's lease skips the locked row too) but still held. A
///    key whose epoch moved on, or whose lease ended, is lost.
///
/// Holding no key row while waiting for another (it never waits), it cannot deadlock with a
/// publisher.
pub(crate) async fn event_key_renew(
    pool: &MySqlPool,
    leases: &[([u8; 32], u64)],
    lease_us: i64,
) -> sqlx::Result<Vec<[u8; 32]>> {
    if leases.is_empty() {
        return Ok(Vec::new());
    }
    let fence: Vec<(String, u64)> = leases.iter().map(|(h, e)| (hex(h), *e)).collect();
    let fence = serde_json::to_string(&fence).expect("fence serializes");
    let mut conn = pool.acquire().await?;
    let mut tx = conn.begin().await?;
    let locked = sqlx::query_scalar!(
        r#"SELECT k.key_hash AS "key_hash: Vec<u8>"
           FROM JSON_TABLE(?, '$[*]' COLUMNS (h VARCHAR(64) PATH '$[0]',
                                              e BIGINT UNSIGNED PATH '$[1]')) AS j
             STRAIGHT_JOIN taskq_event_keys k FORCE INDEX (PRIMARY) ON k.key_hash = UNHEX(j.h)
           WHERE k.lease_epoch = j.e AND k.lease_owner IS NOT NULL
           FOR UPDATE SKIP LOCKED"#,
        fence,
    )
    .fetch_all(&mut *tx)
    .await?;
    let locked: std::collections::HashSet<[u8; 32]> = locked.iter().map(|h| hash_of(h)).collect();
    if !locked.is_empty() {
        let json = hashes_json(locked.iter());
        sqlx::query!(
            r#"UPDATE JSON_TABLE(?, '$[*]' COLUMNS (h VARCHAR(64) PATH '$')) AS j
                 STRAIGHT_JOIN taskq_event_keys k FORCE INDEX (PRIMARY) ON k.key_hash = UNHEX(j.h)
               SET k.lease_until = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND,
                   k.ready_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND"#,
            json,
            lease_us,
            lease_us,
        )
        .execute(&mut *tx)
        .await?;
    }
    tx.commit().await?;
    let mut held: Vec<[u8; 32]> = Vec::with_capacity(leases.len());
    let skipped: Vec<(String, u64)> = leases
        .iter()
        .filter(|(h, _)| !locked.contains(h))
        .map(|(h, e)| (hex(h), *e))
        .collect();
    let busy = if skipped.is_empty() {
        Vec::new()
    } else {
        let skipped = serde_json::to_string(&skipped).expect("fence serializes");
        sqlx::query_scalar!(
            r#"SELECT k.key_hash AS "key_hash: Vec<u8>"
               FROM JSON_TABLE(?, '$[*]' COLUMNS (h VARCHAR(64) PATH '$[0]',
                                                  e BIGINT UNSIGNED PATH '$[1]')) AS j
                 STRAIGHT_JOIN taskq_event_keys k FORCE INDEX (PRIMARY) ON k.key_hash = UNHEX(j.h)
               WHERE k.lease_epoch = j.e AND k.lease_owner IS NOT NULL"#,
            skipped,
        )
        .fetch_all(&mut *conn)
        .await?
    };
    let busy: std::collections::HashSet<[u8; 32]> = busy.iter().map(|h| hash_of(h)).collect();
    for (h, _) in leases {
        if locked.contains(h) || busy.contains(h) {
            held.push(*h);
        }
    }
    Ok(held)
}

/// Settles leased keys (see [`taskq_driver::driver::Events::event_key_settle`]) in a constant
/// number of statements, whatever the number of keys, never waiting for a key row while
/// holding another:
///
/// 1. one transaction: a locking read by primary key of the keys still leased under their
///    epochs, `FOR UPDATE SKIP LOCKED` (a row a publisher's open transaction holds is
///    skipped, never waited for); one multi-row `UPDATE` of those key rows (what each becomes,
///    carried per key in JSON: its `done_seq` records what was delivered); when the round
///    dead-lettered events, one `UPDATE` marking them dead; commit. Four statements, whatever
///    the number of keys (five with dead-lettered events).
/// 2. each key the read skipped (held by a publisher, or no longer leased under its epoch) in
///    a short transaction of its own: its row under its epoch (this one may wait for the
///    publisher's commit, holding no other key row), then its dead events.
///
/// A publisher's transaction may lock several keys in any order, so a relay transaction that
/// waited for one key row while holding another could deadlock with it, and InnoDB may pick
/// the publisher as the victim: the first step never waits, the second holds one key row.
pub(crate) async fn event_key_settle(
    pool: &MySqlPool,
    keys: &[EventSettle],
) -> sqlx::Result<Vec<bool>> {
    let mut held = vec![false; keys.len()];
    if keys.is_empty() {
        return Ok(held);
    }
    let mut conn = pool.acquire().await?;
    let fence: Vec<(String, u64)> = keys.iter().map(|k| (hex(&k.key_hash), k.epoch)).collect();
    let fence = serde_json::to_string(&fence).expect("fence serializes");
    let mut tx = conn.begin().await?;
    let locked = sqlx::query_scalar!(
        r#"SELECT k.key_hash AS "key_hash: Vec<u8>"
           FROM JSON_TABLE(?, '$[*]' COLUMNS (h VARCHAR(64) PATH '$[0]',
                                              e BIGINT UNSIGNED PATH '$[1]')) AS j
             STRAIGHT_JOIN taskq_event_keys k FORCE INDEX (PRIMARY) ON k.key_hash = UNHEX(j.h)
           WHERE k.lease_epoch = j.e AND k.lease_owner IS NOT NULL
           FOR UPDATE SKIP LOCKED"#,
        fence,
    )
    .fetch_all(&mut *tx)
    .await?;
    let locked: std::collections::HashSet<[u8; 32]> = locked.iter().map(|h| hash_of(h)).collect();
    if !locked.is_empty() {
        // Per key: [hash, epoch, done_seq, next (`KeyNext::encode`: 0 release, 1 backoff, 2 hold, 3 keep),
        // backoff µs, error, held seq].
        let mut rows = Vec::with_capacity(locked.len());
        let mut dead: Vec<(u64, &str)> = Vec::new();
        for (i, k) in keys.iter().enumerate() {
            if !locked.contains(&k.key_hash) {
                continue;
            }
            held[i] = true;
            let (n, us, err, hs) = k.next.encode();
            rows.push(serde_json::json!([
                hex(&k.key_hash),
                k.epoch,
                k.done_seq,
                n,
                us,
                err,
                hs
            ]));
            dead.extend(k.dead.iter().map(|(id, e)| (*id, e.as_str())));
        }
        let json = serde_json::Value::Array(rows).to_string();
        sqlx::query!(
            r#"UPDATE JSON_TABLE(?, '$[*]' COLUMNS (h VARCHAR(64) PATH '$[0]',
                                                   e BIGINT UNSIGNED PATH '$[1]',
                                                   d BIGINT UNSIGNED PATH '$[2]',
                                                   n TINYINT UNSIGNED PATH '$[3]',
                                                   us BIGINT PATH '$[4]',
                                                   err TEXT PATH '$[5]',
                                                   hs BIGINT UNSIGNED PATH '$[6]')) AS j
                 STRAIGHT_JOIN taskq_event_keys k FORCE INDEX (PRIMARY) ON k.key_hash = UNHEX(j.h)
               SET k.ready_at = CASE j.n WHEN 0 THEN IF(j.d < k.next_seq, UTC_TIMESTAMP(6), NULL)
                                         WHEN 1 THEN UTC_TIMESTAMP(6) + INTERVAL j.us MICROSECOND
                                         WHEN 3 THEN k.ready_at
                                         ELSE NULL END,
                   k.done_seq = GREATEST(k.done_seq, j.d),
                   k.lease_owner = IF(j.n = 3, k.lease_owner, NULL),
                   k.lease_until = IF(j.n = 3, k.lease_until, NULL),
                   k.failures = IF(j.n IN (0, 3), 0, k.failures + 1),
                   k.last_error = IF(j.n IN (0, 3), NULL, j.err),
                   k.held_at = IF(j.n = 2, UTC_TIMESTAMP(6), k.held_at),
                   k.held_seq = IF(j.n = 2, j.hs, k.held_seq)
               WHERE k.lease_epoch = j.e AND k.lease_owner IS NOT NULL"#,
            json,
        )
        .execute(&mut *tx)
        .await?;
        mark_dead(&mut tx, dead).await?;
    }
    tx.commit().await?;
    // The keys skipped: one at a time, each in its own short transaction.
    for (i, k) in keys.iter().enumerate() {
        if held[i] {
            continue;
        }
        let mut tx = conn.begin().await?;
        let ok = settle_one(&mut tx, k).await?;
        tx.commit().await?;
        held[i] = ok;
    }
    Ok(held)
}

/// Marks dead-lettered events dead (with the rejection), by id, in id order; only ones not
/// dead already.
async fn mark_dead(conn: &mut MySqlConnection, mut events: Vec<(u64, &str)>) -> sqlx::Result<()> {
    if events.is_empty() {
        return Ok(());
    }
    events.sort_unstable_by_key(|e| e.0);
    let json = serde_json::to_string(&events).expect("events serialize");
    sqlx::query!(
        r#"UPDATE JSON_TABLE(?, '$[*]' COLUMNS (id BIGINT UNSIGNED PATH '$[0]',
                                               err TEXT PATH '$[1]')) AS j
             STRAIGHT_JOIN taskq_events e FORCE INDEX (PRIMARY) ON e.id = j.id
           SET e.dead_at = UTC_TIMESTAMP(6), e.last_error = j.err
           WHERE e.dead_at IS NULL"#,
        json,
    )
    .execute(&mut *conn)
    .await?;
    Ok(())
}

async fn settle_one(conn: &mut MySqlConnection, k: &EventSettle) -> sqlx::Result<bool> {
    let h = &k.key_hash[..];
    let done = match &k.next {
        KeyNext::Release => {
            sqlx::query!(
                r#"UPDATE taskq_event_keys
                   SET ready_at = IF(? < next_seq, UTC_TIMESTAMP(6), NULL),
                       done_seq = GREATEST(done_seq, ?), lease_owner = NULL,
                       lease_until = NULL, failures = 0, last_error = NULL
                   WHERE key_hash = ? AND lease_epoch = ? AND lease_owner IS NOT NULL"#,
                k.done_seq,
                k.done_seq,
                h,
                k.epoch,
            )
            .execute(&mut *conn)
            .await?
        }
        KeyNext::Keep => {
            sqlx::query!(
                r#"UPDATE taskq_event_keys
                   SET done_seq = GREATEST(done_seq, ?), failures = 0, last_error = NULL
                   WHERE key_hash = ? AND lease_epoch = ? AND lease_owner IS NOT NULL"#,
                k.done_seq,
                h,
                k.epoch,
            )
            .execute(&mut *conn)
            .await?
        }
        KeyNext::Backoff { delay_us, error } => {
            sqlx::query!(
                r#"UPDATE taskq_event_keys
                   SET ready_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND,
                       done_seq = GREATEST(done_seq, ?), lease_owner = NULL,
                       lease_until = NULL, failures = failures + 1, last_error = ?
                   WHERE key_hash = ? AND lease_epoch = ? AND lease_owner IS NOT NULL"#,
                delay_us,
                k.done_seq,
                error,
                h,
                k.epoch,
            )
            .execute(&mut *conn)
            .await?
        }
        KeyNext::Hold { seq, error } => {
            sqlx::query!(
                r#"UPDATE taskq_event_keys
                   SET ready_at = NULL, done_seq = GREATEST(done_seq, ?), lease_owner = NULL,
                       lease_until = NULL, failures = failures + 1, last_error = ?,
                       held_at = UTC_TIMESTAMP(6), held_seq = ?
                   WHERE key_hash = ? AND lease_epoch = ? AND lease_owner IS NOT NULL"#,
                k.done_seq,
                error,
                seq,
                h,
                k.epoch,
            )
            .execute(&mut *conn)
            .await?
        }
    };
    if done.rows_affected() != 1 {
        return Ok(false);
    }
    mark_dead(
        conn,
        k.dead.iter().map(|(id, e)| (*id, e.as_str())).collect(),
    )
    .await?;
    Ok(true)
}

/// Per topic: pending events (the sum of its keys' `next_seq - done_seq`), the oldest one's
/// creation (the earliest of the keys' first pending events, one lookup of
/// `uq_taskq_events_seq` each), and held keys. Only keys with work are read: those are ready,
/// leased or held (`ix_taskq_event_keys_ready`, `ix_taskq_event_keys_held`).
pub(crate) async fn event_topic_stats(pool: &MySqlPool) -> sqlx::Result<Vec<EventTopicStats>> {
    let pending = sqlx::query!(
        r#"SELECT k.topic, CAST(SUM(k.next_seq - k.done_seq) AS SIGNED) AS "pending!: i64",
                  MIN(e.created_at) AS "oldest: DateTime<Utc>"
           FROM (SELECT key_hash, topic, next_seq, done_seq
                 FROM taskq_event_keys FORCE INDEX (ix_taskq_event_keys_ready)
                 WHERE ready_at IS NOT NULL AND done_seq < next_seq
                 UNION ALL
                 SELECT key_hash, topic, next_seq, done_seq
                 FROM taskq_event_keys FORCE INDEX (ix_taskq_event_keys_held)
                 WHERE held_at IS NOT NULL AND ready_at IS NULL AND done_seq < next_seq) AS k
             LEFT JOIN taskq_events e FORCE INDEX (uq_taskq_events_seq)
               ON e.key_hash = k.key_hash AND e.seq = k.done_seq + 1
           GROUP BY k.topic"#
    )
    .fetch_all(pool)
    .await?;
    let held = sqlx::query!(
        r#"SELECT topic, COUNT(*) AS "held!: i64"
           FROM taskq_event_keys WHERE held_at IS NOT NULL GROUP BY topic"#
    )
    .fetch_all(pool)
    .await?;
    let mut by: BTreeMap<String, EventTopicStats> = BTreeMap::new();
    let entry = |by: &mut BTreeMap<String, EventTopicStats>, t: &str| {
        by.entry(t.to_owned())
            .or_insert_with(|| EventTopicStats {
                topic: t.to_owned(),
                pending: 0,
                oldest_pending_at: None,
                held_keys: 0,
            })
            .topic
            .clone()
    };
    for p in pending {
        let t = entry(&mut by, &p.topic);
        let s = by.get_mut(&t).expect("inserted");
        s.pending = p.pending as u64;
        s.oldest_pending_at = p.oldest;
    }
    for h in held {
        let t = entry(&mut by, &h.topic);
        by.get_mut(&t).expect("inserted").held_keys = h.held as u64;
    }
    Ok(by.into_values().collect())
}

/// Held keys, longest held first (a range of `ix_taskq_event_keys_held`).
pub(crate) async fn event_keys_held(
    pool: &MySqlPool,
    topic: Option<&str>,
    limit: u32,
) -> sqlx::Result<Vec<HeldEventKey>> {
    let rows = sqlx::query!(
        r#"SELECT topic, event_key, held_seq AS "held_seq!: u64", last_error,
                  held_at AS "held_at!: DateTime<Utc>"
           FROM taskq_event_keys
           WHERE held_at IS NOT NULL AND (? IS NULL OR topic = ?)
           ORDER BY held_at
           LIMIT ?"#,
        topic,
        topic,
        limit,
    )
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| HeldEventKey {
            topic: r.topic,
            key: r.event_key,
            seq: r.held_seq,
            error: r.last_error.unwrap_or_default(),
            since: r.held_at,
        })
        .collect())
}

/// A key's events past `after_seq`, by seq.
pub(crate) async fn event_list(
    pool: &MySqlPool,
    topic: &str,
    key: &str,
    after_seq: u64,
    limit: u32,
) -> sqlx::Result<Vec<EventInfo>> {
    let hash = key_hash(topic, key);
    let rows = sqlx::query!(
        r#"SELECT e.id AS "id: u64", e.topic, e.event_key, e.seq AS "seq: u64", e.message_id,
                  k.done_seq AS "done_seq: u64", e.created_at AS "created_at: DateTime<Utc>",
                  e.dead_at AS "dead_at: DateTime<Utc>", e.last_error
           FROM taskq_events e
             JOIN taskq_event_keys k ON k.key_hash = e.key_hash
           WHERE e.key_hash = ? AND e.seq > ?
           ORDER BY e.seq
           LIMIT ?"#,
        &hash[..],
        after_seq,
        limit,
    )
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| EventInfo {
            id: r.id,
            topic: r.topic,
            key: r.event_key,
            seq: r.seq,
            message_id: r.message_id,
            state: EventState::of(r.seq, r.done_seq, r.dead_at.is_some()),
            created_at: r.created_at,
            dead_at: r.dead_at,
            last_error: r.last_error,
        })
        .collect())
}

/// A key's relay state.
pub(crate) async fn event_key_get(
    pool: &MySqlPool,
    topic: &str,
    key: &str,
) -> sqlx::Result<Option<EventKeyInfo>> {
    let hash = key_hash(topic, key);
    let r = sqlx::query!(
        r#"SELECT topic, event_key, next_seq AS "next_seq: u64", done_seq AS "done_seq: u64",
                  lease_epoch AS "lease_epoch: u64", lease_owner,
                  lease_until AS "lease_until: DateTime<Utc>",
                  (lease_until IS NOT NULL AND lease_until > UTC_TIMESTAMP(6)) AS "leased!: bool",
                  failures AS "failures: u32", last_error,
                  held_at AS "held_at: DateTime<Utc>", held_seq AS "held_seq: u64"
           FROM taskq_event_keys WHERE key_hash = ?"#,
        &hash[..],
    )
    .fetch_optional(pool)
    .await?;
    Ok(r.map(|r| EventKeyInfo {
        topic: r.topic,
        key: r.event_key,
        next_seq: r.next_seq,
        done_seq: r.done_seq,
        lease_epoch: r.lease_epoch,
        lease_owner: r.lease_owner,
        lease_until: r.lease_until,
        leased: r.leased,
        failures: r.failures,
        last_error: r.last_error,
        held_at: r.held_at,
        held_seq: r.held_seq,
    }))
}

/// Deletes up to `limit` delivered events published more than `age_us` µs ago, oldest first:
/// a plain read of `ix_taskq_events_created` (events not dead, by publish time) joined to each
/// event's key for `seq <= done_seq`, then one short transaction: the keys of those events
/// locked `FOR UPDATE SKIP LOCKED` (a key a publisher, a relay's settle or a replay holds is
/// left for the next prune, never waited for), then a `DELETE` of the events of the keys it
/// locked that re-checks `seq <= done_seq` against the locked key rows. So a replay that
/// rewound a key after the read (issue 34 E5) has its events kept, and a replay that comes
/// after the lock waits for the delete and rewinds from what is still stored. Key rows
/// first, then their event rows: the module's lock order; the prune never waits for a key.
pub(crate) async fn event_prune(
    conn: &mut MySqlConnection,
    age_us: i64,
    limit: u32,
) -> sqlx::Result<u64> {
    let rows = sqlx::query!(
        r#"SELECT e.id AS "id: u64", e.key_hash AS "key_hash: Vec<u8>"
           FROM taskq_events e FORCE INDEX (ix_taskq_events_created)
             STRAIGHT_JOIN taskq_event_keys k FORCE INDEX (PRIMARY) ON k.key_hash = e.key_hash
           WHERE e.dead_at IS NULL
             AND e.created_at < UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND
             AND e.seq <= k.done_seq
           ORDER BY e.created_at
           LIMIT ?"#,
        age_us,
        limit,
    )
    .fetch_all(&mut *conn)
    .await?;
    if rows.is_empty() {
        return Ok(0);
    }
    let keys: std::collections::BTreeSet<String> = rows.iter().map(|r| hex(&r.key_hash)).collect();
    let keys = serde_json::to_string(&keys).expect("keys serialize");
    let mut tx = conn.begin().await?;
    let locked = sqlx::query_scalar!(
        r#"SELECT k.key_hash AS "key_hash: Vec<u8>"
           FROM JSON_TABLE(?, '$[*]' COLUMNS (h VARCHAR(64) PATH '$')) AS j
             STRAIGHT_JOIN taskq_event_keys k FORCE INDEX (PRIMARY) ON k.key_hash = UNHEX(j.h)
           FOR UPDATE SKIP LOCKED"#,
        keys,
    )
    .fetch_all(&mut *tx)
    .await?;
    let locked: std::collections::HashSet<[u8; 32]> = locked.iter().map(|h| hash_of(h)).collect();
    let ids: Vec<u64> = rows
        .iter()
        .filter(|r| locked.contains(&hash_of(&r.key_hash)))
        .map(|r| r.id)
        .collect();
    if ids.is_empty() {
        tx.commit().await?;
        return Ok(0);
    }
    let json = serde_json::to_string(&ids).expect("ids serialize");
    let done = sqlx::query!(
        r#"DELETE e FROM JSON_TABLE(?, '$[*]' COLUMNS (id BIGINT UNSIGNED PATH '$')) AS j
             STRAIGHT_JOIN taskq_events e FORCE INDEX (PRIMARY) ON e.id = j.id
             STRAIGHT_JOIN taskq_event_keys k FORCE INDEX (PRIMARY) ON k.key_hash = e.key_hash
           WHERE e.dead_at IS NULL AND e.seq <= k.done_seq"#,
        json,
    )
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(done.rows_affected())
}

/// Rewinds a key under its row's lock (`KeyRewind`, decided by `KeyRewind::plan`): from
/// `from_seq`, or the key's oldest stored event when that is later (read with a locking read,
/// so a prune that committed while this transaction waited for the key row is seen even
/// when an earlier plain read of the transaction fixed its snapshot), `done_seq` goes back to the seq before it and the dead
/// marks from it on are cleared, so its stored events from there up to the old `done_seq`
/// become pending; the lease ends (epoch + 1); a hold is cleared when `release_hold`, kept
/// otherwise (a held key is not made ready). How many events became pending; `None`: no
/// such key.
async fn rewind(
    conn: &mut MySqlConnection,
    rw: &taskq_driver::rules::KeyRewind,
) -> sqlx::Result<Option<u64>> {
    let h = &rw.key_hash[..];
    let done = sqlx::query_scalar!(
        r#"SELECT done_seq AS "done_seq: u64" FROM taskq_event_keys WHERE key_hash = ? FOR UPDATE"#,
        h,
    )
    .fetch_optional(&mut *conn)
    .await?;
    let Some(done) = done else {
        return Ok(None);
    };
    let oldest = sqlx::query_scalar!(
        r#"SELECT MIN(seq) AS "seq: u64" FROM taskq_events WHERE key_hash = ? LOCK IN SHARE MODE"#,
        h,
    )
    .fetch_one(&mut *conn)
    .await?;
    let plan = rw.plan(done, oldest);
    let mut pending = 0;
    if let Some((from, to)) = plan.pending {
        pending = sqlx::query_scalar!(
            r#"SELECT COUNT(*) AS "n!: i64" FROM taskq_events
               WHERE key_hash = ? AND seq >= ? AND seq <= ? LOCK IN SHARE MODE"#,
            h,
            from,
            to,
        )
        .fetch_one(&mut *conn)
        .await? as u64;
        sqlx::query!(
            r#"UPDATE taskq_events SET dead_at = NULL, last_error = NULL
               WHERE key_hash = ? AND seq >= ? AND dead_at IS NOT NULL"#,
            h,
            from,
        )
        .execute(&mut *conn)
        .await?;
    }
    let release = rw.release_hold;
    sqlx::query!(
        r#"UPDATE taskq_event_keys
           SET ready_at = IF(? OR held_at IS NULL, UTC_TIMESTAMP(6), NULL),
               done_seq = ?, lease_owner = NULL, lease_until = NULL,
               lease_epoch = lease_epoch + 1,
               held_at = IF(?, NULL, held_at), held_seq = IF(?, NULL, held_seq),
               last_error = IF(?, NULL, last_error), failures = IF(?, 0, failures)
           WHERE key_hash = ?"#,
        release,
        plan.done_seq,
        release,
        release,
        release,
        release,
        h,
    )
    .execute(&mut *conn)
    .await?;
    Ok(Some(pending))
}

/// Replays a key from `from_seq` (see [`taskq_driver::driver::Events::event_replay_key`]).
pub(crate) async fn event_replay_key(
    conn: &mut MySqlConnection,
    topic: &str,
    key: &str,
    from_seq: u64,
) -> sqlx::Result<u64> {
    let rw = taskq_driver::rules::event_replay_key(key_hash(topic, key), from_seq);
    debug_assert!(rw.release_hold);
    Ok(rewind(conn, &rw).await?.unwrap_or(0))
}

/// Replays a topic's delivered and dead events published in `[from, to)` (see
/// [`taskq_driver::driver::Events::event_replay_range`]): a plain read of the events (a range
/// of `ix_taskq_events_topic`, each joined to its key for `seq <= done_seq`), then each of
/// their keys rewound in hash order.
pub(crate) async fn event_replay_range(
    conn: &mut MySqlConnection,
    topic: &str,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
    limit: u32,
) -> sqlx::Result<RangeReplayed> {
    let rows = sqlx::query!(
        r#"SELECT e.key_hash AS "key_hash: Vec<u8>", e.seq AS "seq: u64"
           FROM taskq_events e FORCE INDEX (ix_taskq_events_topic)
             STRAIGHT_JOIN taskq_event_keys k FORCE INDEX (PRIMARY) ON k.key_hash = e.key_hash
           WHERE e.topic = ? AND e.created_at >= ? AND e.created_at < ? AND e.seq <= k.done_seq
           ORDER BY e.created_at, e.id
           LIMIT ?"#,
        topic,
        from.naive_utc(),
        to.naive_utc(),
        limit,
    )
    .fetch_all(&mut *conn)
    .await?;
    let rewinds =
        taskq_driver::rules::event_replay_range(rows.iter().map(|r| (hash_of(&r.key_hash), r.seq)));
    let mut events = 0;
    for rw in &rewinds {
        debug_assert!(!rw.release_hold);
        events += rewind(conn, rw).await?.unwrap_or(0);
    }
    Ok(RangeReplayed {
        read: rows.len() as u64,
        events,
    })
}

/// Releases a held key (see [`taskq_driver::driver::Events::event_key_release`]).
pub(crate) async fn event_key_release(
    conn: &mut MySqlConnection,
    topic: &str,
    key: &str,
    skip: bool,
) -> sqlx::Result<bool> {
    let hash = key_hash(topic, key);
    let held = sqlx::query!(
        r#"SELECT held_seq AS "held_seq!: u64", done_seq AS "done_seq: u64", last_error
           FROM taskq_event_keys WHERE key_hash = ? AND held_at IS NOT NULL FOR UPDATE"#,
        &hash[..],
    )
    .fetch_optional(&mut *conn)
    .await?;
    let Some(held) = held else {
        return Ok(false);
    };
    let r = taskq_driver::rules::event_key_release(held.done_seq, held.held_seq, skip);
    if let Some(seq) = r.dead_seq {
        sqlx::query!(
            r#"UPDATE taskq_events SET dead_at = UTC_TIMESTAMP(6), last_error = ?
               WHERE key_hash = ? AND seq = ? AND dead_at IS NULL"#,
            held.last_error,
            &hash[..],
            seq,
        )
        .execute(&mut *conn)
        .await?;
    }
    sqlx::query!(
        r#"UPDATE taskq_event_keys
           SET held_at = NULL, held_seq = NULL, failures = 0, last_error = NULL,
               lease_owner = NULL, lease_until = NULL, lease_epoch = lease_epoch + 1,
               done_seq = ?, ready_at = UTC_TIMESTAMP(6)
           WHERE key_hash = ?"#,
        r.done_seq,
        &hash[..],
    )
    .execute(&mut *conn)
    .await?;
    Ok(true)
}

impl taskq_driver::driver::Events for crate::MySqlDriver {
    async fn event_key_claim(&self, req: &EventClaim<'_>) -> sqlx::Result<Vec<EventLease>> {
        event_key_claim(self.pool(), req).await
    }
    async fn event_read(&self, ranges: &[EventRange]) -> sqlx::Result<Vec<EventRow>> {
        event_read(self.pool(), ranges).await
    }
    async fn event_key_renew(
        &self,
        leases: &[([u8; 32], u64)],
        lease_us: i64,
    ) -> sqlx::Result<Vec<[u8; 32]>> {
        event_key_renew(self.pool(), leases, lease_us).await
    }
    async fn event_key_settle(&self, keys: &[EventSettle]) -> sqlx::Result<Vec<bool>> {
        event_key_settle(self.pool(), keys).await
    }
    async fn event_topic_stats(&self) -> sqlx::Result<Vec<EventTopicStats>> {
        event_topic_stats(self.pool()).await
    }
    async fn event_keys_held(
        &self,
        topic: Option<&str>,
        limit: u32,
    ) -> sqlx::Result<Vec<HeldEventKey>> {
        event_keys_held(self.pool(), topic, limit).await
    }
    async fn event_list(
        &self,
        topic: &str,
        key: &str,
        after_seq: u64,
        limit: u32,
    ) -> sqlx::Result<Vec<EventInfo>> {
        event_list(self.pool(), topic, key, after_seq, limit).await
    }
    async fn event_key_get(&self, topic: &str, key: &str) -> sqlx::Result<Option<EventKeyInfo>> {
        event_key_get(self.pool(), topic, key).await
    }
    async fn event_prune(
        &self,
        conn: &mut MySqlConnection,
        age_us: i64,
        limit: u32,
    ) -> sqlx::Result<u64> {
        event_prune(conn, age_us, limit).await
    }
    async fn event_replay_key(
        &self,
        conn: &mut MySqlConnection,
        topic: &str,
        key: &str,
        from_seq: u64,
    ) -> sqlx::Result<u64> {
        event_replay_key(conn, topic, key, from_seq).await
    }
    async fn event_replay_range(
        &self,
        conn: &mut MySqlConnection,
        topic: &str,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
        limit: u32,
    ) -> sqlx::Result<RangeReplayed> {
        event_replay_range(conn, topic, from, to, limit).await
    }
    async fn event_key_release(
        &self,
        conn: &mut MySqlConnection,
        topic: &str,
        key: &str,
        skip: bool,
    ) -> sqlx::Result<bool> {
        event_key_release(conn, topic, key, skip).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(key: u8, seq: u64) -> EventRow {
        EventRow {
            id: seq,
            key_hash: [key; 32],
            seq,
            topic: "t".into(),
            key: "k".into(),
            message_id: format!("{key}-{seq}"),
            payload: Vec::new(),
            headers: Vec::new(),
        }
    }

    /// The read has no `ORDER BY`: whatever order the server sends, the rows come out by
    /// range (in the order of `ranges`, not of the hashes) then by seq.
    #[test]
    fn rows_are_put_in_range_then_seq_order() {
        let ranges = [
            EventRange {
                key_hash: [9; 32],
                after_seq: 0,
                up_to: 3,
            },
            EventRange {
                key_hash: [1; 32],
                after_seq: 4,
                up_to: 6,
            },
        ];
        let mut rows = vec![row(1, 6), row(9, 2), row(1, 5), row(9, 3), row(9, 1)];
        sort_by_range(&mut rows, &ranges);
        let got: Vec<(u8, u64)> = rows.iter().map(|r| (r.key_hash[0], r.seq)).collect();
        assert_eq!(got, [(9, 1), (9, 2), (9, 3), (1, 5), (1, 6)]);
    }
}

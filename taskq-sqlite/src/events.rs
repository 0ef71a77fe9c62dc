//! Events (`taskq_events`) and the relay's keys (`taskq_event_keys`): the publish in the
//! caller's transaction, the relay's lease / read / renew / settle, and the operator's reads,
//! retention, replays and releases. SQLite runs one writer at a time, so a key's seq, taken
//! inside the publishing write transaction, is in commit order, and a lease is one `UPDATE …
//! RETURNING` (nothing is ever "held elsewhere"). A delivered event's row is never written:
//! the key's `done_seq` records delivery (see `taskq_driver::event`); only a dead event
//! carries a mark (`dead_at`).

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use sqlx::{SqliteConnection, SqlitePool};

use taskq_driver::event::*;

use crate::clock::{opt_time, time_from_us, time_to_us};
use crate::connect::{begin_immediate, begin_write};
use crate::conv::{json, sid, uid};
use taskq_driver::rows::hex;

/// Inserts an event (see `Enqueue::event_insert`): the key row's upsert takes the next seq
/// (and marks the key ready unless held), then the event row; in a savepoint of the caller's
/// transaction, or a `BEGIN IMMEDIATE` transaction of its own.
pub(crate) async fn event_insert(
    conn: &mut SqliteConnection,
    e: &NewEvent<'_>,
) -> sqlx::Result<EventInserted> {
    let hash = key_hash(e.topic, e.key);
    let h = &hash[..];
    let mut tx = begin_write(conn).await?;
    let seq = sqlx::query_scalar!(
        r#"INSERT INTO taskq_event_keys (key_hash, topic, event_key, next_seq, ready_at)
           VALUES (?1, ?2, ?3, 1, (SELECT us FROM taskq_clock))
           ON CONFLICT (key_hash) DO UPDATE SET
             next_seq = next_seq + 1,
             ready_at = CASE WHEN held_at IS NULL
                             THEN COALESCE(ready_at, (SELECT us FROM taskq_clock)) END
           RETURNING next_seq AS "next_seq!: i64""#,
        h,
        e.topic,
        e.key,
    )
    .fetch_one(&mut *tx)
    .await?;
    let headers = headers_json(e.headers);
    let id = sqlx::query_scalar!(
        r#"INSERT INTO taskq_events
             (key_hash, seq, topic, event_key, message_id, payload, headers, created_at)
           VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, (SELECT us FROM taskq_clock))
           RETURNING id AS "id!: i64""#,
        h,
        seq,
        e.topic,
        e.key,
        e.message_id,
        e.payload,
        headers,
    )
    .fetch_one(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(EventInserted {
        id: uid(id),
        seq: uid(seq),
    })
}

/// Leases ready keys, oldest ready first, until their backlogs reach `req.events`: one
/// `UPDATE … RETURNING` (atomic under the write lock).
pub(crate) async fn event_key_claim(
    pool: &SqlitePool,
    req: &EventClaim<'_>,
) -> sqlx::Result<Vec<EventLease>> {
    let topics = req.topics.map(|t| t.json());
    let events = sid(req.events);
    let mut rows = sqlx::query!(
        r#"UPDATE taskq_event_keys
           SET lease_epoch = lease_epoch + 1, lease_owner = ?1,
               lease_until = (SELECT us FROM taskq_clock) + ?2,
               ready_at = (SELECT us FROM taskq_clock) + ?2
           WHERE key_hash IN (
             SELECT key_hash FROM (
               SELECT key_hash,
                      SUM(backlog) OVER (ORDER BY ready_at ROWS UNBOUNDED PRECEDING)
                        - backlog AS before
               FROM (SELECT key_hash, ready_at, next_seq - done_seq AS backlog
                     FROM taskq_event_keys
                     WHERE ready_at <= (SELECT us FROM taskq_clock)
                       AND (?3 IS NULL OR topic IN (SELECT value FROM json_each(?3)))
                     ORDER BY ready_at
                     LIMIT ?4))
             WHERE before < ?5 OR before = 0)
           RETURNING key_hash AS "key_hash!: Vec<u8>", topic AS "topic!: String",
                     event_key AS "event_key!: String", lease_epoch AS "lease_epoch!: i64",
                     done_seq AS "done_seq!: i64", next_seq AS "next_seq!: i64",
                     failures AS "failures!: i64", lease_until AS "lease_until!: i64""#,
        req.owner,
        req.lease_us,
        topics,
        req.limit,
        events,
    )
    .fetch_all(pool)
    .await?;
    // RETURNING comes in no particular order; all share one ready_at now, so order by hash.
    rows.sort_by(|a, b| a.key_hash.cmp(&b.key_hash));
    Ok(rows
        .into_iter()
        .map(|r| EventLease {
            key_hash: hash_of(&r.key_hash),
            topic: r.topic,
            key: r.event_key,
            epoch: uid(r.lease_epoch),
            done_seq: uid(r.done_seq),
            next_seq: uid(r.next_seq),
            failures: u32::try_from(r.failures).unwrap_or(u32::MAX),
        })
        .collect())
}

/// The events of each range (none dead: see `taskq_driver::event`), by range then seq: one
/// statement (a read of
/// `uq_taskq_events_seq` per range, driven from the JSON side).
pub(crate) async fn event_read(
    pool: &SqlitePool,
    ranges: &[EventRange],
) -> sqlx::Result<Vec<EventRow>> {
    if ranges.is_empty() {
        return Ok(Vec::new());
    }
    let v: Vec<(String, i64, i64)> = ranges
        .iter()
        .map(|r| (hex(&r.key_hash), sid(r.after_seq), sid(r.up_to)))
        .collect();
    let v = json(&v)?;
    let rows = sqlx::query!(
        r#"SELECT e.id AS "id!: i64", e.key_hash AS "key_hash!: Vec<u8>", e.seq AS "seq!: i64",
                  e.topic AS "topic!: String", e.event_key AS "event_key!: String",
                  e.message_id AS "message_id!: String", e.payload AS "payload!: Vec<u8>",
                  e.headers AS "headers?: String"
           FROM json_each(?1) AS j
             CROSS JOIN taskq_events AS e INDEXED BY uq_taskq_events_seq
               ON e.key_hash = unhex(j.value ->> 0)
              AND e.seq > (j.value ->> 1) AND e.seq <= (j.value ->> 2)
           WHERE e.dead_at IS NULL
           ORDER BY j.key, e.seq"#,
        v,
    )
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|e| EventRow {
            id: uid(e.id),
            key_hash: hash_of(&e.key_hash),
            seq: uid(e.seq),
            topic: e.topic,
            key: e.event_key,
            message_id: e.message_id,
            payload: e.payload,
            headers: headers_parse(e.headers.as_deref()),
        })
        .collect())
}

/// Renews the leases still held under their epochs; the keys renewed.
pub(crate) async fn event_key_renew(
    pool: &SqlitePool,
    leases: &[([u8; 32], u64)],
    lease_us: i64,
) -> sqlx::Result<Vec<[u8; 32]>> {
    let mut renewed = Vec::new();
    if leases.is_empty() {
        return Ok(renewed);
    }
    let mut tx = begin_immediate(pool).await?;
    for (h, epoch) in leases {
        let hb = &h[..];
        let e = sid(*epoch);
        let done = sqlx::query!(
            r#"UPDATE taskq_event_keys
               SET lease_until = (SELECT us FROM taskq_clock) + ?1,
                   ready_at = (SELECT us FROM taskq_clock) + ?1
               WHERE key_hash = ?2 AND lease_epoch = ?3 AND lease_owner IS NOT NULL"#,
            lease_us,
            hb,
            e,
        )
        .execute(&mut *tx)
        .await?;
        if done.rows_affected() == 1 {
            renewed.push(*h);
        }
    }
    tx.commit().await?;
    Ok(renewed)
}

/// Settles leased keys in one write transaction of a constant number of statements: one
/// multi-row `UPDATE … FROM json_each(…) RETURNING` of the key rows still leased under their
/// epochs (what each becomes carried per key in JSON: its `done_seq` records what was
/// delivered), then, when the round dead-lettered events of the keys it returned, one
/// `UPDATE` marking them dead.
pub(crate) async fn event_key_settle(
    pool: &SqlitePool,
    keys: &[EventSettle],
) -> sqlx::Result<Vec<bool>> {
    let mut held = vec![false; keys.len()];
    if keys.is_empty() {
        return Ok(held);
    }
    // Per key: [hash, epoch, done_seq, next (`KeyNext::encode`: 0 release, 1 backoff, 2 hold, 3 keep),
    // backoff µs, error, held seq].
    let rows: Vec<serde_json::Value> = keys
        .iter()
        .map(|k| {
            let (n, us, err, hs) = k.next.encode();
            let hs = hs.map(sid);
            serde_json::json!([
                hex(&k.key_hash),
                sid(k.epoch),
                sid(k.done_seq),
                n,
                us,
                err,
                hs
            ])
        })
        .collect();
    let rows = json(&rows)?;
    let mut tx = begin_immediate(pool).await?;
    let settled = sqlx::query_scalar!(
        r#"UPDATE taskq_event_keys AS k
           SET ready_at = CASE j.n
                            WHEN 0 THEN CASE WHEN j.d < k.next_seq
                                             THEN (SELECT us FROM taskq_clock) END
                            WHEN 1 THEN (SELECT us FROM taskq_clock) + j.us
                            WHEN 3 THEN k.ready_at
                          END,
               done_seq = MAX(k.done_seq, j.d),
               lease_owner = CASE WHEN j.n = 3 THEN k.lease_owner END,
               lease_until = CASE WHEN j.n = 3 THEN k.lease_until END,
               failures = CASE WHEN j.n IN (0, 3) THEN 0 ELSE k.failures + 1 END,
               last_error = j.err,
               held_at = CASE WHEN j.n = 2 THEN (SELECT us FROM taskq_clock) ELSE k.held_at END,
               held_seq = CASE WHEN j.n = 2 THEN j.hs ELSE k.held_seq END
           FROM (SELECT unhex(value ->> 0) AS h, value ->> 1 AS e, value ->> 2 AS d,
                        value ->> 3 AS n, value ->> 4 AS us, value ->> 5 AS err,
                        value ->> 6 AS hs
                 FROM json_each(?1)) AS j
           WHERE k.key_hash = j.h AND k.lease_epoch = j.e AND k.lease_owner IS NOT NULL
           RETURNING key_hash AS "key_hash!: Vec<u8>""#,
        rows,
    )
    .fetch_all(&mut *tx)
    .await?;
    let settled: std::collections::HashSet<[u8; 32]> = settled.iter().map(|h| hash_of(h)).collect();
    let mut dead: Vec<(i64, &str)> = Vec::new();
    for (i, k) in keys.iter().enumerate() {
        if settled.contains(&k.key_hash) {
            held[i] = true;
            dead.extend(k.dead.iter().map(|(id, e)| (sid(*id), e.as_str())));
        }
    }
    if !dead.is_empty() {
        let dead = json(&dead)?;
        sqlx::query!(
            r#"UPDATE taskq_events
               SET dead_at = (SELECT us FROM taskq_clock), last_error = j.err
               FROM (SELECT value ->> 0 AS id, value ->> 1 AS err FROM json_each(?1)) AS j
               WHERE taskq_events.id = j.id AND taskq_events.dead_at IS NULL"#,
            dead,
        )
        .execute(&mut *tx)
        .await?;
    }
    tx.commit().await?;
    Ok(held)
}

/// Per topic: pending events (the sum of its keys' `next_seq - done_seq`), the oldest one's
/// creation (the earliest of the keys' first pending events), held keys. Only keys with
/// work are read: those are ready, leased or held (the partial indexes on `ready_at` and
/// `held_at`).
pub(crate) async fn event_topic_stats(pool: &SqlitePool) -> sqlx::Result<Vec<EventTopicStats>> {
    let pending = sqlx::query!(
        r#"SELECT k.topic AS "topic!: String", SUM(k.next_seq - k.done_seq) AS "pending!: i64",
                  MIN(e.created_at) AS "oldest?: i64"
           FROM (SELECT key_hash, topic, next_seq, done_seq
                 FROM taskq_event_keys INDEXED BY ix_taskq_event_keys_ready
                 WHERE ready_at IS NOT NULL AND done_seq < next_seq
                 UNION ALL
                 SELECT key_hash, topic, next_seq, done_seq
                 FROM taskq_event_keys INDEXED BY ix_taskq_event_keys_held
                 WHERE held_at IS NOT NULL AND ready_at IS NULL AND done_seq < next_seq) AS k
             LEFT JOIN taskq_events AS e INDEXED BY uq_taskq_events_seq
               ON e.key_hash = k.key_hash AND e.seq = k.done_seq + 1
           GROUP BY k.topic"#
    )
    .fetch_all(pool)
    .await?;
    let held = sqlx::query!(
        r#"SELECT topic AS "topic!: String", COUNT(*) AS "held!: i64"
           FROM taskq_event_keys WHERE held_at IS NOT NULL GROUP BY topic"#
    )
    .fetch_all(pool)
    .await?;
    let mut by: BTreeMap<String, EventTopicStats> = BTreeMap::new();
    let blank = |t: &str| EventTopicStats {
        topic: t.to_owned(),
        pending: 0,
        oldest_pending_at: None,
        held_keys: 0,
    };
    for p in pending {
        let s = by.entry(p.topic.clone()).or_insert_with(|| blank(&p.topic));
        s.pending = uid(p.pending);
        s.oldest_pending_at = opt_time(p.oldest)?;
    }
    for h in held {
        by.entry(h.topic.clone())
            .or_insert_with(|| blank(&h.topic))
            .held_keys = uid(h.held);
    }
    Ok(by.into_values().collect())
}

/// Held keys, longest held first.
pub(crate) async fn event_keys_held(
    pool: &SqlitePool,
    topic: Option<&str>,
    limit: u32,
) -> sqlx::Result<Vec<HeldEventKey>> {
    let rows = sqlx::query!(
        r#"SELECT topic AS "topic!: String", event_key AS "event_key!: String",
                  held_seq AS "held_seq!: i64", last_error AS "last_error?: String",
                  held_at AS "held_at!: i64"
           FROM taskq_event_keys
           WHERE held_at IS NOT NULL AND (?1 IS NULL OR topic = ?1)
           ORDER BY held_at
           LIMIT ?2"#,
        topic,
        limit,
    )
    .fetch_all(pool)
    .await?;
    rows.into_iter()
        .map(|r| {
            Ok(HeldEventKey {
                topic: r.topic,
                key: r.event_key,
                seq: uid(r.held_seq),
                error: r.last_error.unwrap_or_default(),
                since: time_from_us(r.held_at)?,
            })
        })
        .collect()
}

/// A key's events past `after_seq`, by seq.
pub(crate) async fn event_list(
    pool: &SqlitePool,
    topic: &str,
    key: &str,
    after_seq: u64,
    limit: u32,
) -> sqlx::Result<Vec<EventInfo>> {
    let hash = key_hash(topic, key);
    let h = &hash[..];
    let after = sid(after_seq);
    let rows = sqlx::query!(
        r#"SELECT e.id AS "id!: i64", e.topic AS "topic!: String",
                  e.event_key AS "event_key!: String", e.seq AS "seq!: i64",
                  e.message_id AS "message_id!: String", k.done_seq AS "done_seq!: i64",
                  e.created_at AS "created_at!: i64", e.dead_at AS "dead_at?: i64",
                  e.last_error AS "last_error?: String"
           FROM taskq_events AS e
             JOIN taskq_event_keys AS k ON k.key_hash = e.key_hash
           WHERE e.key_hash = ?1 AND e.seq > ?2
           ORDER BY e.seq
           LIMIT ?3"#,
        h,
        after,
        limit,
    )
    .fetch_all(pool)
    .await?;
    rows.into_iter()
        .map(|r| {
            Ok(EventInfo {
                id: uid(r.id),
                topic: r.topic,
                key: r.event_key,
                seq: uid(r.seq),
                message_id: r.message_id,
                state: EventState::of(uid(r.seq), uid(r.done_seq), r.dead_at.is_some()),
                created_at: time_from_us(r.created_at)?,
                dead_at: opt_time(r.dead_at)?,
                last_error: r.last_error,
            })
        })
        .collect()
}

/// A key's relay state.
pub(crate) async fn event_key_get(
    pool: &SqlitePool,
    topic: &str,
    key: &str,
) -> sqlx::Result<Option<EventKeyInfo>> {
    let hash = key_hash(topic, key);
    let h = &hash[..];
    let r = sqlx::query!(
        r#"SELECT topic AS "topic!: String", event_key AS "event_key!: String",
                  next_seq AS "next_seq!: i64", done_seq AS "done_seq!: i64",
                  lease_epoch AS "lease_epoch!: i64", lease_owner AS "lease_owner?: String",
                  lease_until AS "lease_until?: i64",
                  (lease_until IS NOT NULL AND lease_until > (SELECT us FROM taskq_clock))
                    AS "leased!: bool",
                  failures AS "failures!: i64", last_error AS "last_error?: String",
                  held_at AS "held_at?: i64", held_seq AS "held_seq?: i64"
           FROM taskq_event_keys WHERE key_hash = ?1"#,
        h,
    )
    .fetch_optional(pool)
    .await?;
    let Some(r) = r else { return Ok(None) };
    Ok(Some(EventKeyInfo {
        topic: r.topic,
        key: r.event_key,
        next_seq: uid(r.next_seq),
        done_seq: uid(r.done_seq),
        lease_epoch: uid(r.lease_epoch),
        lease_owner: r.lease_owner,
        lease_until: opt_time(r.lease_until)?,
        leased: r.leased,
        failures: u32::try_from(r.failures).unwrap_or(u32::MAX),
        last_error: r.last_error,
        held_at: opt_time(r.held_at)?,
        held_seq: r.held_seq.map(uid),
    }))
}

/// Deletes up to `limit` delivered events (not dead, at or below their key's `done_seq`)
/// published more than `age_us` µs ago, oldest first: one statement.
pub(crate) async fn event_prune(
    conn: &mut SqliteConnection,
    age_us: i64,
    limit: u32,
) -> sqlx::Result<u64> {
    let done = sqlx::query!(
        r#"DELETE FROM taskq_events
           WHERE id IN (
             SELECT e.id FROM taskq_events AS e INDEXED BY ix_taskq_events_created
               JOIN taskq_event_keys AS k ON k.key_hash = e.key_hash
             WHERE e.dead_at IS NULL AND e.created_at < (SELECT us FROM taskq_clock) - ?1
               AND e.seq <= k.done_seq
             ORDER BY e.created_at
             LIMIT ?2)"#,
        age_us,
        limit,
    )
    .execute(&mut *conn)
    .await?;
    Ok(done.rows_affected())
}

/// Rewinds a key (`KeyRewind`), in the caller's write transaction: from `from_seq`, or the
/// key's oldest stored event when that is later, `done_seq` goes back to the seq before it
/// and the dead marks from it on are cleared, so its stored events from there up to the old
/// `done_seq` become pending; the lease ends (epoch + 1); a hold is cleared when
/// `release_hold`, kept otherwise (a held key is not made ready). How many events became
/// pending; `None`: no such key.
async fn rewind(
    conn: &mut SqliteConnection,
    rw: &taskq_driver::rules::KeyRewind,
) -> sqlx::Result<Option<u64>> {
    let h = &rw.key_hash[..];
    let k = sqlx::query!(
        r#"SELECT done_seq AS "done_seq!: i64",
                  (SELECT MIN(seq) FROM taskq_events WHERE key_hash = ?1) AS "oldest?: i64"
           FROM taskq_event_keys WHERE key_hash = ?1"#,
        h,
    )
    .fetch_optional(&mut *conn)
    .await?;
    let Some(k) = k else {
        return Ok(None);
    };
    let plan = rw.plan(uid(k.done_seq), k.oldest.map(uid));
    let mut pending = 0;
    if let Some((from, to)) = plan.pending {
        let (from, to) = (sid(from), sid(to));
        pending = sqlx::query_scalar!(
            r#"SELECT COUNT(*) AS "n!: i64" FROM taskq_events
               WHERE key_hash = ?1 AND seq >= ?2 AND seq <= ?3"#,
            h,
            from,
            to,
        )
        .fetch_one(&mut *conn)
        .await?;
        sqlx::query!(
            r#"UPDATE taskq_events SET dead_at = NULL, last_error = NULL
               WHERE key_hash = ?1 AND seq >= ?2 AND dead_at IS NOT NULL"#,
            h,
            from,
        )
        .execute(&mut *conn)
        .await?;
    }
    let release = rw.release_hold;
    let done_seq = sid(plan.done_seq);
    sqlx::query!(
        r#"UPDATE taskq_event_keys
           SET ready_at = CASE WHEN ?1 OR held_at IS NULL THEN (SELECT us FROM taskq_clock) END,
               done_seq = ?2, lease_owner = NULL, lease_until = NULL,
               lease_epoch = lease_epoch + 1,
               held_at = CASE WHEN ?1 THEN NULL ELSE held_at END,
               held_seq = CASE WHEN ?1 THEN NULL ELSE held_seq END,
               last_error = CASE WHEN ?1 THEN NULL ELSE last_error END,
               failures = CASE WHEN ?1 THEN 0 ELSE failures END
           WHERE key_hash = ?3"#,
        release,
        done_seq,
        h,
    )
    .execute(&mut *conn)
    .await?;
    Ok(Some(uid(pending)))
}

/// Replays a key from `from_seq` (see `Events::event_replay_key`).
pub(crate) async fn event_replay_key(
    conn: &mut SqliteConnection,
    topic: &str,
    key: &str,
    from_seq: u64,
) -> sqlx::Result<u64> {
    let rw = taskq_driver::rules::event_replay_key(key_hash(topic, key), from_seq);
    debug_assert!(rw.release_hold);
    let mut tx = begin_write(conn).await?;
    let n = rewind(&mut tx, &rw).await?.unwrap_or(0);
    tx.commit().await?;
    Ok(n)
}

/// Replays a topic's delivered and dead events published in `[from, to)` (see
/// `Events::event_replay_range`): a read of the events (`ix_taskq_events_topic`, each joined
/// to its key for `seq <= done_seq`), then each of their keys rewound in hash order.
pub(crate) async fn event_replay_range(
    conn: &mut SqliteConnection,
    topic: &str,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
    limit: u32,
) -> sqlx::Result<RangeReplayed> {
    let (f, t) = (time_to_us(from), time_to_us(to));
    let mut tx = begin_write(conn).await?;
    let rows = sqlx::query!(
        r#"SELECT e.key_hash AS "key_hash!: Vec<u8>", e.seq AS "seq!: i64"
           FROM taskq_events AS e INDEXED BY ix_taskq_events_topic
             JOIN taskq_event_keys AS k ON k.key_hash = e.key_hash
           WHERE e.topic = ?1 AND e.created_at >= ?2 AND e.created_at < ?3
             AND e.seq <= k.done_seq
           ORDER BY e.created_at, e.id
           LIMIT ?4"#,
        topic,
        f,
        t,
        limit,
    )
    .fetch_all(&mut *tx)
    .await?;
    let rewinds = taskq_driver::rules::event_replay_range(
        rows.iter().map(|r| (hash_of(&r.key_hash), uid(r.seq))),
    );
    let mut events = 0;
    for rw in &rewinds {
        debug_assert!(!rw.release_hold);
        events += rewind(&mut tx, rw).await?.unwrap_or(0);
    }
    tx.commit().await?;
    Ok(RangeReplayed {
        read: rows.len() as u64,
        events,
    })
}

/// Releases a held key (see `Events::event_key_release`).
pub(crate) async fn event_key_release(
    conn: &mut SqliteConnection,
    topic: &str,
    key: &str,
    skip: bool,
) -> sqlx::Result<bool> {
    let hash = key_hash(topic, key);
    let h = &hash[..];
    let mut tx = begin_write(conn).await?;
    let held = sqlx::query!(
        r#"SELECT held_seq AS "held_seq!: i64", done_seq AS "done_seq!: i64",
                  last_error AS "last_error?: String"
           FROM taskq_event_keys WHERE key_hash = ?1 AND held_at IS NOT NULL"#,
        h,
    )
    .fetch_optional(&mut *tx)
    .await?;
    let Some(held) = held else {
        tx.commit().await?;
        return Ok(false);
    };
    let r = taskq_driver::rules::event_key_release(uid(held.done_seq), uid(held.held_seq), skip);
    if let Some(seq) = r.dead_seq {
        let seq = sid(seq);
        sqlx::query!(
            r#"UPDATE taskq_events SET dead_at = (SELECT us FROM taskq_clock), last_error = ?1
               WHERE key_hash = ?2 AND seq = ?3 AND dead_at IS NULL"#,
            held.last_error,
            h,
            seq,
        )
        .execute(&mut *tx)
        .await?;
    }
    let done_seq = sid(r.done_seq);
    sqlx::query!(
        r#"UPDATE taskq_event_keys
           SET held_at = NULL, held_seq = NULL, failures = 0, last_error = NULL,
               lease_owner = NULL, lease_until = NULL, lease_epoch = lease_epoch + 1,
               done_seq = ?1, ready_at = (SELECT us FROM taskq_clock)
           WHERE key_hash = ?2"#,
        done_seq,
        h,
    )
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(true)
}
impl taskq_driver::driver::Events for crate::SqliteDriver {
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
        conn: &mut SqliteConnection,
        age_us: i64,
        limit: u32,
    ) -> sqlx::Result<u64> {
        event_prune(conn, age_us, limit).await
    }
    async fn event_replay_key(
        &self,
        conn: &mut SqliteConnection,
        topic: &str,
        key: &str,
        from_seq: u64,
    ) -> sqlx::Result<u64> {
        event_replay_key(conn, topic, key, from_seq).await
    }
    async fn event_replay_range(
        &self,
        conn: &mut SqliteConnection,
        topic: &str,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
        limit: u32,
    ) -> sqlx::Result<RangeReplayed> {
        event_replay_range(conn, topic, from, to, limit).await
    }
    async fn event_key_release(
        &self,
        conn: &mut SqliteConnection,
        topic: &str,
        key: &str,
        skip: bool,
    ) -> sqlx::Result<bool> {
        event_key_release(conn, topic, key, skip).await
    }
}

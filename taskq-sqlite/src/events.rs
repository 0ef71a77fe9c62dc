//! Events (`taskq_events`) and the relay's keys (`taskq_event_keys`): the publish in the
//! caller's transaction, the relay's lease / read / renew / settle, and the operator's reads,
//! retention, replays and releases. SQLite runs one writer at a time, so a key's seq, taken
//! inside the publishing write transaction, is in commit order, and a lease is one `UPDATE …
//! RETURNING` (nothing is ever "held elsewhere").

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
             (key_hash, seq, topic, event_key, message_id, payload, headers, state, created_at)
           VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, 'pending', (SELECT us FROM taskq_clock))
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

/// The pending events of each range, by range then seq: one statement (a read of
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
           WHERE e.state = 'pending'
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
/// epochs (what each becomes carried per key in JSON), then one `UPDATE` marking the events of
/// the keys it returned.
pub(crate) async fn event_key_settle(
    pool: &SqlitePool,
    keys: &[EventSettle],
) -> sqlx::Result<Vec<bool>> {
    let mut held = vec![false; keys.len()];
    if keys.is_empty() {
        return Ok(held);
    }
    // Per key: [hash, epoch, done_seq, next (0 release, 1 backoff, 2 hold), backoff µs,
    // error, held seq].
    let rows: Vec<serde_json::Value> = keys
        .iter()
        .map(|k| {
            let (n, us, err, hs) = match &k.next {
                KeyNext::Release => (0u8, 0i64, None, None),
                KeyNext::Backoff { delay_us, error } => (1, *delay_us, Some(error.as_str()), None),
                KeyNext::Hold { seq, error } => (2, 0, Some(error.as_str()), Some(sid(*seq))),
            };
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
                          END,
               done_seq = MAX(k.done_seq, j.d), lease_owner = NULL, lease_until = NULL,
               failures = CASE WHEN j.n = 0 THEN 0 ELSE k.failures + 1 END,
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
    let mut events: Vec<(i64, Option<&str>)> = Vec::new();
    for (i, k) in keys.iter().enumerate() {
        if settled.contains(&k.key_hash) {
            held[i] = true;
            events.extend(k.delivered.iter().map(|&id| (sid(id), None)));
            events.extend(k.dead.iter().map(|(id, e)| (sid(*id), Some(e.as_str()))));
        }
    }
    if !events.is_empty() {
        let events = json(&events)?;
        sqlx::query!(
            r#"UPDATE taskq_events
               SET state = CASE WHEN j.err IS NULL THEN 'delivered' ELSE 'dead' END,
                   delivered_at = (SELECT us FROM taskq_clock), last_error = j.err
               FROM (SELECT value ->> 0 AS id, value ->> 1 AS err FROM json_each(?1)) AS j
               WHERE taskq_events.id = j.id AND taskq_events.state = 'pending'"#,
            events,
        )
        .execute(&mut *tx)
        .await?;
    }
    tx.commit().await?;
    Ok(held)
}

/// Per topic: pending events, the oldest one's creation, held keys.
pub(crate) async fn event_topic_stats(pool: &SqlitePool) -> sqlx::Result<Vec<EventTopicStats>> {
    let pending = sqlx::query!(
        r#"SELECT topic AS "topic!: String", COUNT(*) AS "pending!: i64",
                  MIN(created_at) AS "oldest?: i64"
           FROM taskq_events WHERE state = 'pending' GROUP BY topic"#
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
        r#"SELECT id AS "id!: i64", topic AS "topic!: String", event_key AS "event_key!: String",
                  seq AS "seq!: i64", message_id AS "message_id!: String",
                  state AS "state!: String", created_at AS "created_at!: i64",
                  delivered_at AS "delivered_at?: i64", last_error AS "last_error?: String"
           FROM taskq_events
           WHERE key_hash = ?1 AND seq > ?2
           ORDER BY seq
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
                state: EventState::parse(&r.state).unwrap_or(EventState::Pending),
                created_at: time_from_us(r.created_at)?,
                delivered_at: opt_time(r.delivered_at)?,
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

/// Deletes up to `limit` events delivered more than `age_us` µs ago, oldest first.
pub(crate) async fn event_prune(
    conn: &mut SqliteConnection,
    age_us: i64,
    limit: u32,
) -> sqlx::Result<u64> {
    let done = sqlx::query!(
        r#"DELETE FROM taskq_events
           WHERE id IN (
             SELECT id FROM taskq_events
             WHERE state = 'delivered' AND delivered_at < (SELECT us FROM taskq_clock) - ?1
             ORDER BY delivered_at
             LIMIT ?2)"#,
        age_us,
        limit,
    )
    .execute(&mut *conn)
    .await?;
    Ok(done.rows_affected())
}

/// Replays a key from `from_seq` (see `Events::event_replay_key`).
pub(crate) async fn event_replay_key(
    conn: &mut SqliteConnection,
    topic: &str,
    key: &str,
    from_seq: u64,
) -> sqlx::Result<u64> {
    let rewind = taskq_driver::rules::event_replay_key(key_hash(topic, key), from_seq);
    debug_assert!(rewind.release_hold);
    let h = &rewind.key_hash[..];
    let from = sid(rewind.from_seq);
    let mut tx = begin_write(conn).await?;
    let k = sqlx::query!(
        r#"UPDATE taskq_event_keys
           SET done_seq = MIN(done_seq, ?1 - 1), held_at = NULL, held_seq = NULL,
               last_error = NULL, failures = 0, lease_owner = NULL, lease_until = NULL,
               lease_epoch = lease_epoch + 1, ready_at = (SELECT us FROM taskq_clock)
           WHERE key_hash = ?2"#,
        from,
        h,
    )
    .execute(&mut *tx)
    .await?;
    if k.rows_affected() == 0 {
        tx.commit().await?;
        return Ok(0);
    }
    let e = sqlx::query!(
        r#"UPDATE taskq_events SET state = 'pending', delivered_at = NULL, last_error = NULL
           WHERE key_hash = ?1 AND seq >= ?2 AND state <> 'pending'"#,
        h,
        from,
    )
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(e.rows_affected())
}

/// Replays a topic's delivered and dead events published in `[from, to)` (see
/// `Events::event_replay_range`).
pub(crate) async fn event_replay_range(
    conn: &mut SqliteConnection,
    topic: &str,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
    limit: u32,
) -> sqlx::Result<u64> {
    let (f, t) = (time_to_us(from), time_to_us(to));
    let mut tx = begin_write(conn).await?;
    let rows = sqlx::query!(
        r#"SELECT id AS "id!: i64", key_hash AS "key_hash!: Vec<u8>", seq AS "seq!: i64"
           FROM taskq_events
           WHERE state IN ('delivered', 'dead') AND topic = ?1 AND created_at >= ?2
             AND created_at < ?3
           ORDER BY created_at, id
           LIMIT ?4"#,
        topic,
        f,
        t,
        limit,
    )
    .fetch_all(&mut *tx)
    .await?;
    let rewinds = taskq_driver::rules::event_replay_range(
        rows.iter().map(|r| (hash_of(&r.key_hash), r.seq as u64)),
    );
    for rewind in &rewinds {
        debug_assert!(!rewind.release_hold);
        let hb = &rewind.key_hash[..];
        let seq = sid(rewind.from_seq);
        sqlx::query!(
            r#"UPDATE taskq_event_keys
               SET done_seq = MIN(done_seq, ?1 - 1), lease_owner = NULL, lease_until = NULL,
                   lease_epoch = lease_epoch + 1,
                   ready_at = CASE WHEN held_at IS NULL THEN (SELECT us FROM taskq_clock) END
               WHERE key_hash = ?2"#,
            seq,
            hb,
        )
        .execute(&mut *tx)
        .await?;
    }
    let ids: Vec<i64> = rows.iter().map(|r| r.id).collect();
    let ids = json(&ids)?;
    let done = sqlx::query!(
        r#"UPDATE taskq_events SET state = 'pending', delivered_at = NULL, last_error = NULL
           WHERE id IN (SELECT value FROM json_each(?1)) AND state <> 'pending'"#,
        ids,
    )
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(done.rows_affected())
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
    let done_seq = if skip {
        sqlx::query!(
            r#"UPDATE taskq_events
               SET state = 'dead', delivered_at = (SELECT us FROM taskq_clock), last_error = ?1
               WHERE key_hash = ?2 AND seq = ?3 AND state = 'pending'"#,
            held.last_error,
            h,
            held.held_seq,
        )
        .execute(&mut *tx)
        .await?;
        held.done_seq.max(held.held_seq)
    } else {
        held.done_seq
    };
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
    ) -> sqlx::Result<u64> {
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

//! Events and the relay's keys (`taskq_events`, `taskq_event_keys`): seq per key in insert
//! order, leases that skip leased keys and expire on the database clock, reads of a lease's
//! range, settles fenced by the epoch, the same way on every driver.

use taskq_driver::driver::Driver;
use taskq_driver::event::*;

use crate::support::*;

const TOPIC: &str = "orders";

async fn insert<D: Driver>(d: &D, key: &str, payload: &[u8]) -> EventInserted {
    let mut c = conn(d).await;
    let id = new_message_id();
    let headers = vec![("h".to_owned(), "v".to_owned())];
    D::event_insert(
        &mut c,
        &NewEvent {
            topic: TOPIC,
            key,
            message_id: &id,
            payload,
            headers: &headers,
        },
    )
    .await
    .expect("event_insert")
}

fn claim(owner: &str, lease_us: i64) -> EventClaim<'_> {
    EventClaim {
        owner,
        topics: None,
        limit: 10,
        lease_us,
    }
}

fn release(l: &EventLease, done_seq: u64, delivered: Vec<u64>) -> EventSettle {
    EventSettle {
        key_hash: l.key_hash,
        epoch: l.epoch,
        done_seq,
        delivered,
        dead: vec![],
        next: KeyNext::Release,
    }
}

/// Seq per key counts up from 1; a lease takes each ready key once, skips leased keys, and
/// reads the range's pending events in seq order with their payloads and headers.
pub async fn events_are_numbered_per_key_and_leased_once<D: Driver>(d: D) {
    let a1 = insert(&d, "a", b"1").await;
    let b1 = insert(&d, "b", b"x").await;
    let a2 = insert(&d, "a", b"2").await;
    assert_eq!((a1.seq, b1.seq, a2.seq), (1, 1, 2));
    assert!(a1.id < b1.id && b1.id < a2.id);

    let mut leases = d.event_key_claim(&claim("r1", HOUR_US)).await.unwrap();
    leases.sort_by(|x, y| x.key.cmp(&y.key));
    assert_eq!(leases.len(), 2);
    assert_eq!(
        (
            leases[0].key.as_str(),
            leases[0].epoch,
            leases[0].done_seq,
            leases[0].next_seq
        ),
        ("a", 1, 0, 2)
    );
    assert!(
        d.event_key_claim(&claim("r2", HOUR_US))
            .await
            .unwrap()
            .is_empty(),
        "leased keys are not leased again"
    );
    let ranges = [EventRange {
        key_hash: leases[0].key_hash,
        after_seq: 0,
        up_to: 2,
    }];
    let rows = d.event_read(&ranges).await.unwrap();
    assert_eq!(rows.iter().map(|r| r.seq).collect::<Vec<_>>(), [1, 2]);
    assert_eq!(rows[1].payload, b"2");
    assert_eq!(rows[0].headers, [("h".to_owned(), "v".to_owned())]);
    assert_eq!(rows[0].key_hash, key_hash(TOPIC, "a"));
    // Settled: a's events delivered, the key idle; b released with nothing done stays ready.
    let held = d
        .event_key_settle(&[
            release(&leases[0], 2, vec![a1.id, a2.id]),
            release(&leases[1], 0, vec![]),
        ])
        .await
        .unwrap();
    assert_eq!(held, [true, true]);
    let a = d.event_key_get(TOPIC, "a").await.unwrap().unwrap();
    assert_eq!((a.done_seq, a.leased, a.lease_owner), (2, false, None));
    let again = d.event_key_claim(&claim("r2", HOUR_US)).await.unwrap();
    assert_eq!(again.len(), 1);
    assert_eq!((again[0].key.as_str(), again[0].epoch), ("b", 2));
    let listed = d.event_list(TOPIC, "a", 0, 10).await.unwrap();
    assert!(listed.iter().all(|e| e.state == EventState::Delivered));
}

/// A lease ends on the database clock and another relay takes the key (epoch + 1); the first
/// relay's renewal and settle under the old epoch change nothing.
pub async fn an_expired_event_lease_is_taken_over_and_the_old_epoch_is_fenced<D: Driver>(d: D) {
    let e1 = insert(&d, "a", b"1").await;
    let mut c = conn(&d).await;
    let before = now::<D>(&mut c).await;
    let first = d
        .event_key_claim(&claim("r1", SHORT_LEASE_US))
        .await
        .unwrap();
    assert_eq!(first.len(), 1);
    wait_clock_past::<D>(&mut c, before + chrono::TimeDelta::milliseconds(2)).await;
    let second = d.event_key_claim(&claim("r2", HOUR_US)).await.unwrap();
    assert_eq!(second.len(), 1);
    assert_eq!(second[0].epoch, first[0].epoch + 1);
    let renewed = d
        .event_key_renew(&[(first[0].key_hash, first[0].epoch)], HOUR_US)
        .await
        .unwrap();
    assert!(renewed.is_empty());
    let held = d
        .event_key_settle(&[release(&first[0], 1, vec![e1.id])])
        .await
        .unwrap();
    assert_eq!(held, [false]);
    let listed = d.event_list(TOPIC, "a", 0, 10).await.unwrap();
    assert_eq!(
        listed[0].state,
        EventState::Pending,
        "not marked by the stale settle"
    );
    let k = d.event_key_get(TOPIC, "a").await.unwrap().unwrap();
    assert_eq!(
        (k.done_seq, k.lease_owner.as_deref(), k.leased),
        (0, Some("r2"), true)
    );
    let renewed = d
        .event_key_renew(&[(second[0].key_hash, second[0].epoch)], HOUR_US)
        .await
        .unwrap();
    assert_eq!(renewed, [second[0].key_hash]);
}

/// A backoff makes the key ready only after its delay; a hold keeps it out until released,
/// and a publish on a held key does not make it ready.
pub async fn a_backed_off_key_waits_and_a_held_key_stays_out<D: Driver>(d: D) {
    insert(&d, "a", b"1").await;
    insert(&d, "b", b"1").await;
    let mut l = d.event_key_claim(&claim("r1", HOUR_US)).await.unwrap();
    l.sort_by(|x, y| x.key.cmp(&y.key));
    let settles = [
        EventSettle {
            next: KeyNext::Backoff {
                delay_us: HOUR_US,
                error: "down".into(),
            },
            ..release(&l[0], 0, vec![])
        },
        EventSettle {
            next: KeyNext::Hold {
                seq: 1,
                error: "too large".into(),
            },
            ..release(&l[1], 0, vec![])
        },
    ];
    assert_eq!(d.event_key_settle(&settles).await.unwrap(), [true, true]);
    insert(&d, "b", b"2").await;
    assert!(
        d.event_key_claim(&claim("r1", HOUR_US))
            .await
            .unwrap()
            .is_empty()
    );
    let a = d.event_key_get(TOPIC, "a").await.unwrap().unwrap();
    assert_eq!((a.failures, a.last_error.as_deref()), (1, Some("down")));
    let held = d.event_keys_held(Some(TOPIC), 10).await.unwrap();
    assert_eq!(held.len(), 1);
    assert_eq!(
        (held[0].key.as_str(), held[0].seq, held[0].error.as_str()),
        ("b", 1, "too large")
    );
    let stats = d.event_topic_stats().await.unwrap();
    assert_eq!((stats[0].pending, stats[0].held_keys), (3, 1));
    let mut c = conn(&d).await;
    assert!(d.event_key_release(&mut c, TOPIC, "b", true).await.unwrap());
    let l = d.event_key_claim(&claim("r1", HOUR_US)).await.unwrap();
    assert_eq!(l.len(), 1);
    assert_eq!(
        (l[0].key.as_str(), l[0].done_seq, l[0].next_seq),
        ("b", 1, 2)
    );
    let listed = d.event_list(TOPIC, "b", 0, 10).await.unwrap();
    assert_eq!(listed[0].state, EventState::Dead);
    assert_eq!(listed[0].last_error.as_deref(), Some("too large"));
}

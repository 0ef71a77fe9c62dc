//! Events and the relay's keys (`taskq_events`, `taskq_event_keys`): seq per key in insert
//! order, leases that skip leased keys and expire on the database clock, reads of a lease's
//! range, settles fenced by the epoch, the same way on every driver.

use sqlx::Connection as _;
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
        events: u64::MAX,
        lease_us,
        probe: false,
    }
}

fn release(l: &EventLease, done_seq: u64) -> EventSettle {
    EventSettle {
        key_hash: l.key_hash,
        epoch: l.epoch,
        done_seq,
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
        .event_key_settle(&[release(&leases[0], 2), release(&leases[1], 0)])
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
    insert(&d, "a", b"1").await;
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
    let held = d.event_key_settle(&[release(&first[0], 1)]).await.unwrap();
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

/// A settle that keeps the lease (`KeyNext::Keep`: the relay reads on the key in its next
/// round) moves `done_seq` (the events up to it are delivered) and resets failures, but the
/// key stays leased to the same relay under the same epoch and end: no other claim takes it,
/// and the relay's next settle under that epoch ends the lease.
pub async fn a_kept_lease_records_delivery_and_stays_with_its_relay<D: Driver>(d: D) {
    for n in [b"1", b"2", b"3"] {
        insert(&d, "a", n).await;
    }
    insert(&d, "b", b"1").await;
    let mut l = d.event_key_claim(&claim("r1", HOUR_US)).await.unwrap();
    l.sort_by(|x, y| x.key.cmp(&y.key));
    let before = d.event_key_get(TOPIC, "a").await.unwrap().unwrap();
    let keep = |l: &EventLease, done_seq| EventSettle {
        next: KeyNext::Keep,
        ..release(l, done_seq)
    };
    assert_eq!(
        d.event_key_settle(&[keep(&l[0], 2), keep(&l[1], 1)])
            .await
            .unwrap(),
        [true, true]
    );
    let a = d.event_key_get(TOPIC, "a").await.unwrap().unwrap();
    assert_eq!(
        (
            a.done_seq,
            a.leased,
            a.lease_owner.as_deref(),
            a.lease_epoch
        ),
        (2, true, Some("r1"), l[0].epoch)
    );
    assert_eq!(
        a.lease_until, before.lease_until,
        "the lease's end is unchanged"
    );
    assert_eq!(
        d.event_list(TOPIC, "a", 0, 10)
            .await
            .unwrap()
            .iter()
            .map(|e| e.state)
            .collect::<Vec<_>>(),
        [
            EventState::Delivered,
            EventState::Delivered,
            EventState::Pending
        ]
    );
    assert!(
        d.event_key_claim(&claim("r2", HOUR_US))
            .await
            .unwrap()
            .is_empty(),
        "kept keys are still leased"
    );
    // The next round's settle, same epoch: the lease ends.
    assert_eq!(
        d.event_key_settle(&[release(&l[0], 3), release(&l[1], 1)])
            .await
            .unwrap(),
        [true, true]
    );
    let a = d.event_key_get(TOPIC, "a").await.unwrap().unwrap();
    assert_eq!((a.done_seq, a.leased, a.lease_owner), (3, false, None));
    assert!(
        d.event_key_claim(&claim("r2", HOUR_US))
            .await
            .unwrap()
            .is_empty(),
        "nothing left to relay"
    );
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
            ..release(&l[0], 0)
        },
        EventSettle {
            next: KeyNext::Hold {
                seq: 1,
                error: "too large".into(),
            },
            ..release(&l[1], 0)
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

/// Leases of `keys` (all ready, one relay), by key.
async fn lease_all<D: Driver>(d: &D, n: usize) -> Vec<EventLease> {
    let mut l = d.event_key_claim(&claim("r1", HOUR_US)).await.unwrap();
    l.sort_by(|x, y| x.key.cmp(&y.key));
    assert_eq!(l.len(), n, "every key leased");
    l
}

/// A claim that probes first ([`EventClaim::probe`]) leases what one that does not would:
/// nothing when no key is ready (every key leased), the ready keys otherwise, each once.
pub async fn a_probing_claim_leases_the_same_keys<D: Driver>(d: D) {
    let probe = |owner| EventClaim {
        probe: true,
        ..claim(owner, HOUR_US)
    };
    assert!(d.event_key_claim(&probe("r1")).await.unwrap().is_empty());
    insert(&d, "a", b"1").await;
    insert(&d, "b", b"1").await;
    let first = d.event_key_claim(&probe("r1")).await.unwrap();
    let mut keys: Vec<&str> = first.iter().map(|l| l.key.as_str()).collect();
    keys.sort_unstable();
    assert_eq!(keys, ["a", "b"], "a probing claim leases the ready keys");
    assert!(
        d.event_key_claim(&probe("r2")).await.unwrap().is_empty(),
        "leased keys are not ready: the probe finds none"
    );
    insert(&d, "c", b"1").await;
    let next = d.event_key_claim(&probe("r2")).await.unwrap();
    assert_eq!(
        next.iter().map(|l| l.key.as_str()).collect::<Vec<_>>(),
        ["c"],
        "only the key not leased yet"
    );
    assert_eq!(next[0].epoch, 1);
}

/// A claim stops leasing once the keys' backlogs reach its events: a key with a long backlog
/// fills the round alone; keys of one event each are leased together.
pub async fn a_claim_leases_keys_until_their_backlogs_fill_its_events<D: Driver>(d: D) {
    for n in 0..5 {
        insert(&d, "a", n.to_string().as_bytes()).await;
    }
    insert(&d, "b", b"1").await;
    insert(&d, "c", b"1").await;
    let one = d
        .event_key_claim(&EventClaim {
            events: 3,
            ..claim("r1", HOUR_US)
        })
        .await
        .unwrap();
    assert_eq!(one.len(), 1, "a's backlog of 5 fills 3 events alone");
    assert_eq!(
        (one[0].key.as_str(), one[0].next_seq - one[0].done_seq),
        ("a", 5)
    );
    let rest = d
        .event_key_claim(&EventClaim {
            events: 3,
            ..claim("r1", HOUR_US)
        })
        .await
        .unwrap();
    let mut keys: Vec<&str> = rest.iter().map(|l| l.key.as_str()).collect();
    keys.sort_unstable();
    assert_eq!(keys, ["b", "c"], "the keys not leased before stay ready");
}

/// One settle of several keys: each key is written only under its own epoch (a key whose
/// epoch moved on is refused, `false`, and neither its row nor its events change) while the
/// others settle as asked: done_seq moved (delivered events), dead events marked, the key
/// released, backed off or held; settling the same lease twice is refused.
pub async fn a_settle_of_many_keys_refuses_a_stale_epoch_per_key_and_settles_the_others<
    D: Driver,
>(
    d: D,
) {
    insert(&d, "a", b"1").await;
    insert(&d, "a", b"2").await;
    insert(&d, "b", b"1").await;
    insert(&d, "c", b"1").await;
    let c2 = insert(&d, "c", b"2").await;
    insert(&d, "c", b"3").await;
    insert(&d, "e", b"1").await;
    insert(&d, "h", b"1").await;
    insert(&d, "h", b"2").await;
    let l = lease_all(&d, 5).await;
    let (la, lb, lc, le, lh) = (&l[0], &l[1], &l[2], &l[3], &l[4]);
    // An operator replays b: its lease ends, epoch + 1.
    let mut c = conn(&d).await;
    d.event_replay_key(&mut c, TOPIC, "b", 1).await.unwrap();
    let settles = [
        release(la, 2),
        release(lb, 1),
        // c: 1 delivered, 2 dead-lettered, 3 delivered.
        EventSettle {
            dead: vec![(c2.id, "too big".into())],
            ..release(lc, 3)
        },
        EventSettle {
            next: KeyNext::Backoff {
                delay_us: HOUR_US,
                error: "down".into(),
            },
            ..release(le, 0)
        },
        EventSettle {
            next: KeyNext::Hold {
                seq: 2,
                error: "refused".into(),
            },
            ..release(lh, 1)
        },
    ];
    assert_eq!(
        d.event_key_settle(&settles).await.unwrap(),
        [true, false, true, true, true]
    );
    let state = |v: &[EventInfo]| v.iter().map(|e| e.state).collect::<Vec<_>>();
    use EventState::*;
    assert_eq!(
        state(&d.event_list(TOPIC, "a", 0, 10).await.unwrap()),
        [Delivered, Delivered]
    );
    assert_eq!(
        state(&d.event_list(TOPIC, "b", 0, 10).await.unwrap()),
        [Pending],
        "the stale settle marks nothing"
    );
    let cs = d.event_list(TOPIC, "c", 0, 10).await.unwrap();
    assert_eq!(state(&cs), [Delivered, Dead, Delivered]);
    assert_eq!(
        cs.iter()
            .map(|e| e.last_error.as_deref())
            .collect::<Vec<_>>(),
        [None, Some("too big"), None]
    );
    assert_eq!(
        cs.iter().map(|e| e.dead_at.is_some()).collect::<Vec<_>>(),
        [false, true, false],
        "only the dead event carries a time"
    );
    assert_eq!(
        state(&d.event_list(TOPIC, "e", 0, 10).await.unwrap()),
        [Pending]
    );
    assert_eq!(
        state(&d.event_list(TOPIC, "h", 0, 10).await.unwrap()),
        [Delivered, Pending]
    );
    let key = |k: &'static str| {
        let d = d.clone();
        async move { d.event_key_get(TOPIC, k).await.unwrap().unwrap() }
    };
    let (a, b, cc, e, h) = (
        key("a").await,
        key("b").await,
        key("c").await,
        key("e").await,
        key("h").await,
    );
    assert_eq!(
        (a.done_seq, a.leased, a.lease_owner.as_deref(), a.failures),
        (2, false, None, 0)
    );
    assert_eq!(
        (b.done_seq, b.lease_epoch, b.leased),
        (0, lb.epoch + 1, false),
        "b as the replay left it"
    );
    assert_eq!(
        (cc.done_seq, cc.leased, cc.last_error.as_deref()),
        (3, false, None)
    );
    assert_eq!(
        (e.done_seq, e.leased, e.failures, e.last_error.as_deref()),
        (0, false, 1, Some("down"))
    );
    assert_eq!(
        (h.done_seq, h.leased, h.failures, h.held_at.is_some()),
        (1, false, 1, true)
    );
    let held = d.event_keys_held(Some(TOPIC), 10).await.unwrap();
    assert_eq!(
        held.iter()
            .map(|k| (k.key.as_str(), k.seq, k.error.as_str()))
            .collect::<Vec<_>>(),
        [("h", 2, "refused")]
    );
    // Ready now: b only (a and c are done, e backs off for an hour, h is held).
    let again = d.event_key_claim(&claim("r2", HOUR_US)).await.unwrap();
    assert_eq!(
        again.iter().map(|l| l.key.as_str()).collect::<Vec<_>>(),
        ["b"]
    );
    // The same settle again: every lease is over (settled, or b's taken by r2 now).
    assert_eq!(
        d.event_key_settle(&settles).await.unwrap(),
        [false, false, false, false, false]
    );
    let e_after = key("e").await;
    assert_eq!(
        e_after.failures, 1,
        "a second settle of a lease changes nothing"
    );
}

/// A key whose row a publisher's open transaction holds is settled after that transaction
/// commits; the other keys of the settle do not wait for it, and the publisher can go on to
/// lock one of them (a key the settle had already written) and commit: its transaction is not
/// rolled back and every event it published is there. (On SQLite the settle waits for the
/// publisher's write lock as a whole.)
pub async fn a_key_a_publisher_holds_is_settled_after_its_commit_and_the_publisher_commits<
    D: Driver,
>(
    d: D,
) {
    insert(&d, "a", b"1").await;
    insert(&d, "b", b"1").await;
    insert(&d, "c", b"1").await;
    let l = lease_all(&d, 3).await;
    let settles = [release(&l[0], 1), release(&l[1], 1), release(&l[2], 1)];
    // The publisher locks c, then b (its own order), and keeps its transaction open.
    let mut pc = conn(&d).await;
    let mut tx = pc.begin().await.unwrap();
    let ids = [new_message_id(), new_message_id(), new_message_id()];
    fn publish<'a>(key: &'a str, id: &'a str) -> NewEvent<'a> {
        NewEvent {
            topic: TOPIC,
            key,
            message_id: id,
            payload: b"p",
            headers: &[],
        }
    }
    let pub_c = D::event_insert(&mut *tx, &publish("c", &ids[0]))
        .await
        .unwrap();
    let pub_b = D::event_insert(&mut *tx, &publish("b", &ids[1]))
        .await
        .unwrap();
    let mysql = backend::<D>() == "MySQL";
    let settle = d.event_key_settle(&settles);
    let publisher = async {
        if mysql {
            // The settle writes a at once (it never waits while holding a key row)...
            let start = std::time::Instant::now();
            loop {
                let a = d.event_key_get(TOPIC, "a").await.unwrap().unwrap();
                if a.lease_owner.is_none() {
                    break;
                }
                assert!(
                    start.elapsed() < std::time::Duration::from_secs(20),
                    "a settled while b and c are held"
                );
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
            // ... and waits for b and c, which are still leased.
            let b = d.event_key_get(TOPIC, "b").await.unwrap().unwrap();
            assert!(b.lease_owner.is_some(), "b waits for the publisher");
            // The publisher now takes a too, and commits.
            let pub_a = D::event_insert(&mut *tx, &publish("a", &ids[2]))
                .await
                .unwrap();
            tx.commit().await.unwrap();
            vec![pub_c, pub_b, pub_a]
        } else {
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            tx.commit().await.unwrap();
            vec![pub_c, pub_b]
        }
    };
    let (held, published) = tokio::join!(settle, publisher);
    assert_eq!(held.unwrap(), [true, true, true]);
    // The publisher's events are there, numbered after the settled ones, pending.
    for (p, k) in published.iter().zip(["c", "b", "a"]) {
        assert_eq!(p.seq, 2, "{k}");
        let events = d.event_list(TOPIC, k, 0, 10).await.unwrap();
        assert_eq!(
            events.iter().map(|e| (e.seq, e.state)).collect::<Vec<_>>(),
            [(1, EventState::Delivered), (2, EventState::Pending)],
            "{k}"
        );
        let key = d.event_key_get(TOPIC, k).await.unwrap().unwrap();
        assert_eq!(
            (key.done_seq, key.next_seq, key.leased),
            (1, 2, false),
            "{k}"
        );
    }
    // Every key with a new event is ready again.
    let again = d.event_key_claim(&claim("r2", HOUR_US)).await.unwrap();
    assert_eq!(again.len(), published.len());
}

/// The states of `key`'s stored events, by seq.
async fn states<D: Driver>(d: &D, key: &str) -> Vec<EventState> {
    let listed = d.event_list(TOPIC, key, 0, 100).await.unwrap();
    listed.iter().map(|e| e.state).collect()
}

/// Issue 34 E8: skipping the held event of a key that a range replay rewound (the replay keeps
/// the hold) marks it dead but keeps the replay: the replayed events below it are still
/// pending, the relay reads them and the events after the skipped one, never the skipped one,
/// and its settle moves past it.
pub async fn skipping_a_held_key_after_a_range_replay_keeps_the_replay<D: Driver>(d: D) {
    for n in [b"1", b"2", b"3", b"4"] {
        insert(&d, "a", n).await;
    }
    let l = d.event_key_claim(&claim("r1", HOUR_US)).await.unwrap();
    let hold = EventSettle {
        next: KeyNext::Hold {
            seq: 3,
            error: "too large".into(),
        },
        ..release(&l[0], 2)
    };
    assert_eq!(d.event_key_settle(&[hold]).await.unwrap(), [true]);
    let mut c = conn(&d).await;
    let day = chrono::TimeDelta::days(1);
    let t = now::<D>(&mut c).await;
    let replayed = d
        .event_replay_range(&mut c, TOPIC, t - day, t + day, 100)
        .await
        .unwrap();
    assert_eq!((replayed.read, replayed.events), (2, 2));
    let k = d.event_key_get(TOPIC, "a").await.unwrap().unwrap();
    assert_eq!(
        (k.done_seq, k.held_seq),
        (0, Some(3)),
        "rewound, still held"
    );

    assert!(d.event_key_release(&mut c, TOPIC, "a", true).await.unwrap());
    let k = d.event_key_get(TOPIC, "a").await.unwrap().unwrap();
    assert_eq!((k.done_seq, k.held_seq), (0, None), "the replay is kept");
    use EventState::*;
    assert_eq!(states(&d, "a").await, [Pending, Pending, Dead, Pending]);

    let l = d.event_key_claim(&claim("r1", HOUR_US)).await.unwrap();
    assert_eq!((l.len(), l[0].done_seq, l[0].next_seq), (1, 0, 4));
    let rows = d
        .event_read(&[EventRange {
            key_hash: l[0].key_hash,
            after_seq: 0,
            up_to: 4,
        }])
        .await
        .unwrap();
    assert_eq!(rows.iter().map(|r| r.seq).collect::<Vec<_>>(), [1, 2, 4]);
    assert_eq!(
        d.event_key_settle(&[release(&l[0], 4)]).await.unwrap(),
        [true]
    );
    assert_eq!(
        states(&d, "a").await,
        [Delivered, Delivered, Dead, Delivered]
    );
    let listed = d.event_list(TOPIC, "a", 0, 10).await.unwrap();
    assert_eq!(listed[2].last_error.as_deref(), Some("too large"));
}

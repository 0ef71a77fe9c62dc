//! Rules every driver applies the same way, written once: the drivers read the rows their own
//! way, then decide with these. The runtime's own rules that depend on no database live here
//! too, each unit-tested without one: [`backoff`] (the delay before a retry), [`unique`]
//! (a unique task's identity), [`order`] (an ordered task's key) and [`workflow`] (a
//! workflow's graph).

use crate::state::TaskState;

pub mod backoff;
pub mod batch;
pub mod order;
pub mod unique;
pub mod workflow;

/// What a queue's limits let one claim take: `limit` asked for, the concurrency limit with the
/// queue's running count (`(max, running)`, when the queue has one), the rate limit with the
/// claims already counted in the current window (`(max, used)`, when the queue has one with a
/// positive period). `allowed` is at most `limit`; `rate_binds` says the rate limit is what
/// bound it (its window is used up once this claim is full).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Allowance {
    /// Tasks the claim may take.
    pub allowed: u32,
    /// The rate limit allows no more than the concurrency limit does.
    pub rate_binds: bool,
}

/// See [`Allowance`].
pub fn claim_allowance(
    limit: u32,
    concurrency: Option<(u32, i64)>,
    rate: Option<(u32, i64)>,
) -> Allowance {
    let room = |max: u32, used: i64| (i64::from(max) - used).clamp(0, 1 << 31) as u32;
    let by_running = concurrency.map_or(limit, |(max, running)| limit.min(room(max, running)));
    let by_rate = rate.map_or(limit, |(max, used)| limit.min(room(max, used)));
    Allowance {
        allowed: by_running.min(by_rate),
        rate_binds: by_rate <= by_running,
    }
}

/// Whether a unique task frees its identity when it moves to `to` (`unique_while`: `pending`,
/// `running` or `window`; see taskq's docs/semantics.md, "Unique tasks"). An identity held
/// while pending is freed when the task starts; one held while running, when it ends; a
/// window's is kept through a success (the window runs out on its own) and freed by every
/// other end. Ending `dead`, `canceled` or `expired` frees any identity; going back to
/// `pending` (a retry, a snooze, a reap with attempts left, a release) frees none.
pub fn frees_identity(unique_while: &str, to: TaskState) -> bool {
    match to {
        TaskState::Pending | TaskState::Waiting => false,
        TaskState::Running => unique_while == "pending",
        TaskState::Succeeded => unique_while != "window",
        TaskState::Dead | TaskState::Canceled | TaskState::Expired => true,
    }
}

/// Whether the end of a run (a claimed task moving from `running` to `to`: a retry or snooze
/// back to `pending`, `succeeded`, `dead` or `canceled`, by the write-back or the reap) frees
/// the identity of a task unique while `unique_while`: as [`frees_identity`] says, except for
/// an identity held while pending, which the claim that started the run freed already (a
/// later enqueue may hold it now), so a run's end never frees it again.
pub fn run_end_frees_identity(unique_while: &str, to: TaskState) -> bool {
    unique_while != "pending" && frees_identity(unique_while, to)
}

/// Whether retrying a dead unique task takes its identity again: yes, unless it is a window's
/// (the window is over or held by a later enqueue).
pub fn retry_retakes_identity(unique_while: &str) -> bool {
    unique_while != "window"
}

/// Whether an ordered task that is its key's head stops being the head when it moves to `to`
/// (then the same transaction promotes the key's next waiting task, lowest `order_seq` first;
/// see docs/semantics.md, "Ordered tasks"). Succeeding, being canceled or expiring ends the
/// head; dying ends it only when the task opted in (`dead_skips`, `ordered_dead_after`):
/// otherwise a dead head holds its key until an operator retries or deletes it (a dead task
/// cannot be canceled).
/// Going back to `pending` (a retry, a snooze, a reaped lease, a release) keeps it the head, so
/// the key waits for it and its order holds across crashes.
pub fn ends_order_head(to: TaskState, dead_skips: bool) -> bool {
    match to {
        TaskState::Succeeded | TaskState::Canceled | TaskState::Expired => true,
        TaskState::Dead => dead_skips,
        TaskState::Waiting | TaskState::Pending | TaskState::Running => false,
    }
}

/// Whether a cancel ends a task in `state` at once (`canceled`): `pending` (a key's head, or a
/// task of no key) and `waiting` (behind its key's head); a running task is asked to cancel
/// instead, a terminal one is left alone. Every driver cancels a batch's pending and waiting
/// tasks in one statement and only then lets the keys of the canceled heads go on (in
/// [`order_ends`] order), so a canceled head never promotes a task the same batch cancels; a
/// bulk cancel walks the waiting tasks before the pending ones for the same reason.
pub fn cancels_at_once(state: TaskState) -> bool {
    matches!(state, TaskState::Pending | TaskState::Waiting)
}

/// An ordered task a statement ended ([`ends_order_head`] of its new state): its key's head
/// may move on to the key's next waiting task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OrderEnd {
    /// The order key.
    pub key: Vec<u8>,
    /// The task.
    pub id: u64,
    /// Its number in the key (`order_seq`).
    pub seq: u64,
}

/// The keys to advance after a statement ended `ends`, in the order every driver advances
/// them: by key, then by number (each once).
pub fn order_ends(ends: impl IntoIterator<Item = OrderEnd>) -> Vec<OrderEnd> {
    let mut out: Vec<OrderEnd> = ends.into_iter().collect();
    out.sort_by(|a, b| (&a.key, a.seq, a.id).cmp(&(&b.key, b.seq, b.id)));
    out.dedup();
    out
}

/// The state an ordered task is enqueued in: `pending` (claimable, and its key's head) when
/// its key has no head, `waiting` behind the head otherwise. Every driver records a task
/// enqueued `pending` as its key's head in the same savepoint of the caller's transaction as
/// the insert, so an error or a cancel midway leaves neither.
pub fn ordered_enqueue_state(key_has_head: bool) -> TaskState {
    if key_has_head {
        TaskState::Waiting
    } else {
        TaskState::Pending
    }
}

/// What the retry of a dead ordered task writes (see [`order_retry`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OrderRetry {
    /// The state the task is retried into: `pending` (its key's head) or `waiting`.
    pub state: TaskState,
    /// The task's new `order_seq`, when it takes a new number at the end of its key.
    pub new_seq: Option<u64>,
    /// Record the task as its key's head (`taskq_order_keys.head_task_id`).
    pub make_head: bool,
}

/// How a dead ordered task `id` is retried, from its key's row as the retry's upsert left it
/// (`next_seq`, just counted up, and the `head` recorded): the key's head stays the head
/// (`pending`, nothing else written); any other task takes the new number at the end of its
/// key, `pending` and head when the key has none, `waiting` behind the head otherwise. Each
/// driver upserts and reads the key its own way, then writes what this plan says.
pub fn order_retry(id: u64, next_seq: u64, head: Option<u64>) -> OrderRetry {
    if head == Some(id) {
        return OrderRetry {
            state: TaskState::Pending,
            new_seq: None,
            make_head: false,
        };
    }
    let state = ordered_enqueue_state(head.is_some());
    OrderRetry {
        state,
        new_seq: Some(next_seq),
        make_head: state == TaskState::Pending,
    }
}

/// How a replay rewinds one event key's row (`taskq_event_keys`), planned by
/// [`event_replay_key`] or [`event_replay_range`]; each driver writes it with its own
/// statement: `done_seq` becomes at most `from_seq - 1` (the relays deliver from `from_seq`
/// again), the lease is dropped (`lease_owner`, `lease_until` cleared, `lease_epoch + 1`, so a
/// relay still holding it settles nothing), and the key is ready at once (`ready_at` = now).
/// With `release_hold` the key's hold is ended too (`held_at`, `held_seq`, `last_error`,
/// `failures` cleared); without it a held key stays held (`ready_at` stays `NULL`) and its
/// rewind waits for an operator's release.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyRewind {
    /// The key (`key_hash`).
    pub key_hash: [u8; 32],
    /// The lowest sequence number delivered again (at least 1).
    pub from_seq: u64,
    /// End the key's hold.
    pub release_hold: bool,
}

impl KeyRewind {
    /// The seq the rewind really starts at, given the key's oldest stored event (`None`: none
    /// stored): `from_seq`, or that event when retention deleted the ones before it, so that
    /// `done_seq` never goes back past what is stored (a key's pending events are exactly
    /// `done_seq + 1 ..= next_seq`, and pending counts stay exact).
    pub fn start(&self, oldest_stored: Option<u64>) -> u64 {
        self.from_seq.max(oldest_stored.unwrap_or(u64::MAX)).max(1)
    }

    /// What the rewind writes to a key whose `done_seq` and oldest stored event were read
    /// under its row's lock: the one decision both drivers' rewinds apply (their steps: lock
    /// and read the key, count the events made pending and clear the dead marks from
    /// [`RewindPlan::from`] on when [`RewindPlan::pending`] is some, then update the key row
    /// with [`RewindPlan::done_seq`], ending the lease and, with `release_hold`, the hold).
    pub fn plan(&self, done_seq: u64, oldest_stored: Option<u64>) -> RewindPlan {
        let from = self.start(oldest_stored);
        RewindPlan {
            from,
            pending: (from <= done_seq).then_some((from, done_seq)),
            done_seq: done_seq.min(from - 1),
        }
    }
}

/// What a [`KeyRewind`] writes ([`KeyRewind::plan`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RewindPlan {
    /// The first seq sent again.
    pub from: u64,
    /// The stored events made pending again, `(from, old done_seq)` inclusive, when the
    /// rewind goes back at all (then the dead marks from `from` on are cleared).
    pub pending: Option<(u64, u64)>,
    /// The key's new `done_seq` (never raised).
    pub done_seq: u64,
}

/// What an operator's release of a held key writes ([`KeyRelease`]), from the key's
/// `done_seq` and `held_seq` read under its row's lock: the one decision both drivers apply.
/// A retry (`skip == false`) keeps `done_seq`: the held event is sent again. A skip marks the
/// held event dead and moves `done_seq` past it when it is the key's next event; when a
/// range replay rewound the key below it (a range replay keeps holds), `done_seq` stays
/// where the replay put it, so the replayed events are still sent: the relay, which reads
/// no dead event, passes the skipped one when it gets there and its settle moves `done_seq`
/// past it.
pub fn event_key_release(done_seq: u64, held_seq: u64, skip: bool) -> KeyRelease {
    KeyRelease {
        dead_seq: skip.then_some(held_seq),
        done_seq: if skip && done_seq.saturating_add(1) >= held_seq {
            done_seq.max(held_seq)
        } else {
            done_seq
        },
    }
}

/// What [`event_key_release`] writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyRelease {
    /// The event to mark dead (with the hold's error): the held one, on a skip.
    pub dead_seq: Option<u64>,
    /// The key's new `done_seq`.
    pub done_seq: u64,
}

/// The rewind of an operator's replay of one key from `from_seq` (0 counts as 1): the key
/// rewinds to it and its hold ends, whatever held it (the events from `from_seq` on are
/// pending again).
pub fn event_replay_key(key_hash: [u8; 32], from_seq: u64) -> KeyRewind {
    KeyRewind {
        key_hash,
        from_seq: from_seq.max(1),
        release_hold: true,
    }
}

/// The rewinds of a replay of a topic's events in a time range: one per key among `events`
/// (`(key_hash, seq)` of every event replayed), in `key_hash` order (the order both drivers
/// lock key rows in), each from the key's lowest replayed `seq`. A held key keeps its hold:
/// the range's events of a held key wait for the release like the held event.
pub fn event_replay_range(events: impl IntoIterator<Item = ([u8; 32], u64)>) -> Vec<KeyRewind> {
    let mut lowest: std::collections::BTreeMap<[u8; 32], u64> = Default::default();
    for (key_hash, seq) in events {
        let e = lowest.entry(key_hash).or_insert(seq);
        *e = (*e).min(seq);
    }
    lowest
        .into_iter()
        .map(|(key_hash, seq)| KeyRewind {
            key_hash,
            from_seq: seq.max(1),
            release_hold: false,
        })
        .collect()
}

/// The states one half of `Tasks::task_stats` counts: the active ones (`waiting`, `pending`,
/// `running`; the last repeated) or the terminal ones (`succeeded`, `dead`, `canceled`,
/// `expired`), four values for one statement's `state IN (?, ?, ?, ?)` in each driver.
pub fn stats_states(terminal: bool) -> [TaskState; 4] {
    use TaskState::*;
    if terminal {
        [Succeeded, Dead, Canceled, Expired]
    } else {
        [Waiting, Pending, Running, Running]
    }
}

/// How long after its last beat a worker that has not stopped counts as lost (µs): two of the
/// heartbeat intervals it registered (one late beat is tolerated: a slow statement, a pause, a
/// failover), but never longer than its lease (past it, every lease it held has lapsed and the
/// reaper takes its tasks back), and never less than 1 s (clock granularity and scheduling
/// jitter). Both drivers read `heartbeat_us`, `lease_us` and the age of `last_seen_at` from
/// `taskq_workers` and decide with this; the dashboard, the CLI and `Client::unhandled` show
/// what it says.
pub fn worker_lost_after_us(heartbeat_us: u64, lease_us: u64) -> u64 {
    heartbeat_us
        .saturating_mul(2)
        .min(lease_us)
        .max(WORKER_LOST_FLOOR_US)
}

/// The floor of [`worker_lost_after_us`]: 1 s.
pub const WORKER_LOST_FLOOR_US: u64 = 1_000_000;

/// Whether a worker row is alive: not stopped, and its last beat (`seen_ago_us` before the
/// database clock's now) no older than [`worker_lost_after_us`]. A worker that is neither alive
/// nor stopped is lost (crashed, killed with `kill -9`, hung, or cut off from the database).
pub fn worker_alive(stopped: bool, seen_ago_us: i64, heartbeat_us: u64, lease_us: u64) -> bool {
    !stopped && seen_ago_us <= worker_lost_after_us(heartbeat_us, lease_us) as i64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rewind_goes_back_to_its_start_and_never_forward() {
        let rw = event_replay_key([1; 32], 3);
        assert_eq!(
            rw.plan(7, Some(1)),
            RewindPlan {
                from: 3,
                pending: Some((3, 7)),
                done_seq: 2
            }
        );
        // Nothing delivered from 3 on: nothing pending again, done_seq unchanged.
        assert_eq!(rw.plan(1, Some(1)).pending, None);
        assert_eq!(rw.plan(1, Some(1)).done_seq, 1);
        // Nothing stored.
        assert_eq!(rw.plan(5, None).done_seq, 5);
        assert_eq!(rw.plan(5, None).pending, None);
    }

    #[test]
    fn a_skip_moves_past_the_held_event_only_when_it_is_next() {
        let skip = |done, held| event_key_release(done, held, true);
        assert_eq!(
            skip(2, 3),
            KeyRelease {
                dead_seq: Some(3),
                done_seq: 3
            }
        );
        // A range replay rewound the key below its held event: the replay stays.
        assert_eq!(
            skip(0, 3),
            KeyRelease {
                dead_seq: Some(3),
                done_seq: 0
            }
        );
        assert_eq!(
            event_key_release(0, 3, false),
            KeyRelease {
                dead_seq: None,
                done_seq: 0
            }
        );
        assert_eq!(skip(5, 3).done_seq, 5, "never lowered");
    }

    #[test]
    fn a_rewind_starts_no_earlier_than_the_oldest_stored_event() {
        let rw = event_replay_key([1; 32], 0);
        assert_eq!(rw.start(Some(1)), 1);
        assert_eq!(rw.start(Some(7)), 7, "events 1..6 were pruned");
        assert_eq!(event_replay_key([1; 32], 9).start(Some(7)), 9);
        assert_eq!(
            rw.start(None),
            u64::MAX,
            "nothing stored: nothing to replay"
        );
    }

    #[test]
    fn event_replays_rewind_each_key_to_its_lowest_seq() {
        let (a, b, c) = ([1u8; 32], [2u8; 32], [3u8; 32]);
        let key = event_replay_key(a, 0);
        assert_eq!((key.from_seq, key.release_hold), (1, true));
        assert_eq!(event_replay_key(a, 7).from_seq, 7);
        // Per key, the lowest seq, whatever the order of the events; keys in hash order.
        let plan = event_replay_range([(c, 9), (a, 5), (c, 4), (a, 3), (b, 8), (a, 6)]);
        let got: Vec<_> = plan
            .iter()
            .map(|r| (r.key_hash[0], r.from_seq, r.release_hold))
            .collect();
        assert_eq!(got, [(1, 3, false), (2, 8, false), (3, 4, false)]);
        assert!(event_replay_range([]).is_empty());
    }

    #[test]
    fn a_worker_is_lost_after_two_missed_beats_its_lease_or_one_second() {
        const S: u64 = 1_000_000;
        // Defaults: lease 30 s, heartbeat 10 s: lost after 20 s.
        assert_eq!(worker_lost_after_us(10 * S, 30 * S), 20 * S);
        assert!(worker_alive(false, 20 * S as i64, 10 * S, 30 * S));
        assert!(!worker_alive(false, 20 * S as i64 + 1, 10 * S, 30 * S));
        // A heartbeat over half the lease: the lease bounds it.
        assert_eq!(worker_lost_after_us(20 * S, 30 * S), 30 * S);
        // Fast beats: the 1 s floor.
        assert_eq!(worker_lost_after_us(1_000, 30 * S), S);
        assert_eq!(worker_lost_after_us(0, 0), S);
        assert!(worker_alive(false, 999_999, 1_000, 3_000));
        // No overflow on absurd values.
        assert_eq!(worker_lost_after_us(u64::MAX, u64::MAX), u64::MAX);
        // Stopped is never alive; a beat from the future (clock skew) is alive.
        assert!(!worker_alive(true, 0, 10 * S, 30 * S));
        assert!(worker_alive(false, -5, 10 * S, 30 * S));
    }

    #[test]
    fn identities_are_freed_as_the_docs_say() {
        use TaskState::*;
        let freed = |w: &str| -> Vec<TaskState> {
            TaskState::ALL
                .into_iter()
                .filter(|s| frees_identity(w, *s))
                .collect()
        };
        assert_eq!(
            freed("pending"),
            [Running, Succeeded, Dead, Canceled, Expired]
        );
        assert_eq!(freed("running"), [Succeeded, Dead, Canceled, Expired]);
        assert_eq!(freed("window"), [Dead, Canceled, Expired]);
        assert!(retry_retakes_identity("running") && !retry_retakes_identity("window"));
    }

    #[test]
    fn a_run_frees_what_it_holds_and_never_an_identity_the_claim_freed() {
        use TaskState::*;
        let freed = |w: &str| -> Vec<TaskState> {
            [Pending, Succeeded, Dead, Canceled]
                .into_iter()
                .filter(|s| run_end_frees_identity(w, *s))
                .collect()
        };
        assert_eq!(freed("pending"), [], "freed by the claim already");
        assert_eq!(freed("running"), [Succeeded, Dead, Canceled]);
        assert_eq!(freed("window"), [Dead, Canceled]);
        for w in ["running", "window"] {
            for to in TaskState::ALL {
                assert_eq!(
                    run_end_frees_identity(w, to),
                    frees_identity(w, to),
                    "{w} {to}"
                );
            }
        }
    }

    #[test]
    fn an_order_head_ends_as_the_docs_say() {
        use TaskState::*;
        let ends = |skips: bool| -> Vec<TaskState> {
            TaskState::ALL
                .into_iter()
                .filter(|s| ends_order_head(*s, skips))
                .collect()
        };
        assert_eq!(
            ends(false),
            [Succeeded, Canceled, Expired],
            "a dead head holds"
        );
        assert_eq!(ends(true), [Succeeded, Dead, Canceled, Expired]);
        assert_eq!(ordered_enqueue_state(false), Pending);
        assert_eq!(ordered_enqueue_state(true), Waiting);
    }

    #[test]
    fn a_cancel_ends_pending_and_waiting_tasks_and_keys_advance_in_key_order() {
        let at_once: Vec<TaskState> = TaskState::ALL
            .into_iter()
            .filter(|s| cancels_at_once(*s))
            .collect();
        assert_eq!(at_once, [TaskState::Waiting, TaskState::Pending]);
        let end = |k: u8, id, seq| OrderEnd {
            key: vec![k; 32],
            id,
            seq,
        };
        // By key (never by task id), then number; each once.
        let got = order_ends([end(2, 1, 5), end(1, 9, 3), end(2, 7, 4), end(1, 9, 3)]);
        assert_eq!(got, [end(1, 9, 3), end(2, 7, 4), end(2, 1, 5)]);
    }

    #[test]
    fn a_retried_ordered_task_keeps_its_headship_or_goes_to_the_end_of_its_key() {
        use TaskState::*;
        let head = order_retry(7, 5, Some(7));
        assert_eq!(
            (head.state, head.new_seq, head.make_head),
            (Pending, None, false)
        );
        let behind = order_retry(7, 5, Some(3));
        assert_eq!(
            (behind.state, behind.new_seq, behind.make_head),
            (Waiting, Some(5), false)
        );
        let alone = order_retry(7, 5, None);
        assert_eq!(
            (alone.state, alone.new_seq, alone.make_head),
            (Pending, Some(5), true)
        );
    }

    #[test]
    fn the_stats_halves_are_the_live_and_the_terminal_states() {
        for s in TaskState::ALL {
            assert_eq!(stats_states(true).contains(&s), s.is_terminal(), "{s}");
            assert_eq!(stats_states(false).contains(&s), !s.is_terminal(), "{s}");
        }
    }

    #[test]
    fn the_tighter_limit_wins_and_never_goes_negative() {
        let a = |l, c, r| claim_allowance(l, c, r);
        assert_eq!(a(10, None, None).allowed, 10);
        assert_eq!(a(10, Some((4, 1)), None).allowed, 3);
        assert_eq!(a(10, Some((4, 9)), None).allowed, 0);
        assert_eq!(a(10, None, Some((5, 2))).allowed, 3);
        let both = a(10, Some((4, 0)), Some((5, 2)));
        assert_eq!((both.allowed, both.rate_binds), (3, true));
        let both = a(10, Some((4, 3)), Some((5, 2)));
        assert_eq!((both.allowed, both.rate_binds), (1, false));
        assert_eq!(a(2, Some((4, 0)), Some((5, 0))).allowed, 2);
        assert_eq!(a(10, Some((u32::MAX, -5)), None).allowed, 10);
    }
}

//! `taskq events`: per-topic stats, held keys, one key's state and events, replay (audited),
//! retry or skip a held key, prune delivered events.

use taskq::Client;

use crate::args::EventsAction;
use crate::duration::format_duration;
use crate::failure::{EXIT_TASK, Failure};
use crate::render::{fmt_std, fmt_time, one_line, plural, print_json, print_table};
use crate::text::clean;

/// Runs one `taskq events` subcommand.
pub async fn run(client: &Client, action: &EventsAction, json: bool) -> Result<(), Failure> {
    match action {
        EventsAction::Stats => stats(client, json).await,
        EventsAction::Held { topic, limit } => held(client, topic.as_deref(), *limit, json).await,
        EventsAction::Show {
            topic,
            key,
            after_seq,
            limit,
        } => show(client, topic, key, *after_seq, *limit, json).await,
        EventsAction::Replay {
            topic,
            key,
            from_seq,
            since,
            until,
        } => {
            let (n, what) = match (key, since, until) {
                (Some(key), _, _) => {
                    let from = from_seq.unwrap_or(0);
                    let n = client.replay_event_key(topic, key, from).await?;
                    let what = if from == 0 {
                        format!("of key {key:?}")
                    } else {
                        format!("of key {key:?} from seq {from}")
                    };
                    (n, what)
                }
                (None, Some(since), Some(until)) => {
                    let n = client.replay_events(topic, *since, *until).await?;
                    (
                        n,
                        format!(
                            "published from {} to {}",
                            fmt_time(*since),
                            fmt_time(*until)
                        ),
                    )
                }
                _ => unreachable!("clap requires --key or --since with --until"),
            };
            if json {
                print_json(&serde_json::json!({ "replayed": n }));
            } else {
                println!("replaying {n} event{} of topic {topic:?} {what}", plural(n));
            }
            Ok(())
        }
        EventsAction::Retry { topic, key } => {
            let held = client.release_event_key(topic, key, false).await?;
            released(topic, key, held, "retried", json)
        }
        EventsAction::Skip { topic, key } => {
            let held = client.release_event_key(topic, key, true).await?;
            released(topic, key, held, "skipped", json)
        }
        EventsAction::Prune { older_than } => {
            let n = client.prune_events(*older_than).await?;
            if json {
                print_json(&serde_json::json!({ "pruned": n }));
            } else {
                println!(
                    "pruned {n} delivered event{} published more than {} ago",
                    plural(n),
                    format_duration(*older_than)
                );
            }
            Ok(())
        }
    }
}

fn released(topic: &str, key: &str, held: bool, done: &str, json: bool) -> Result<(), Failure> {
    if !held {
        return Err(Failure::new(
            EXIT_TASK,
            format!("key {key:?} of topic {topic:?} is not held (see `taskq events held`)"),
        ));
    }
    if json {
        print_json(&serde_json::json!({ done: true }));
    } else {
        println!("{done} the held event of key {key:?} of topic {topic:?}");
    }
    Ok(())
}

async fn stats(client: &Client, json: bool) -> Result<(), Failure> {
    let topics = client.event_stats().await?;
    if json {
        print_json(&serde_json::json!({ "topics": topics }));
        return Ok(());
    }
    if topics.is_empty() {
        println!("no event is pending and no key is held");
        return Ok(());
    }
    let rows = topics
        .iter()
        .map(|t| {
            vec![
                t.topic.clone(),
                t.pending.to_string(),
                if t.pending == 0 {
                    "-".to_owned()
                } else {
                    fmt_std(t.lag)
                },
                t.oldest_pending_at.map(fmt_time).unwrap_or_default(),
                t.held_keys.to_string(),
            ]
        })
        .collect();
    print_table(
        &["TOPIC", ">PENDING", ">LAG", "OLDEST PENDING", ">HELD KEYS"],
        rows,
    );
    if topics.iter().any(|t| t.held_keys > 0) {
        eprintln!("(held keys wait for an operator: `taskq events held`)");
    }
    Ok(())
}

async fn held(client: &Client, topic: Option<&str>, limit: u32, json: bool) -> Result<(), Failure> {
    let keys = client.event_keys_held(topic, limit).await?;
    if json {
        print_json(&serde_json::json!({ "held_keys": keys }));
        return Ok(());
    }
    if keys.is_empty() {
        println!("no event key is held back");
        return Ok(());
    }
    let rows = keys
        .iter()
        .map(|k| {
            vec![
                k.topic.clone(),
                k.key.clone(),
                k.seq.to_string(),
                fmt_time(k.since),
                one_line(&k.error, 80),
            ]
        })
        .collect();
    print_table(&["TOPIC", "KEY", ">SEQ", "HELD SINCE", "ERROR"], rows);
    eprintln!(
        "(retry the event after fixing its cause: taskq events retry --topic T --key K; give \
         up on it: taskq events skip --topic T --key K)"
    );
    Ok(())
}

/// `taskq events show TOPIC KEY`: the key's relay state, then a page of its events.
async fn show(
    client: &Client,
    topic: &str,
    key: &str,
    after_seq: u64,
    limit: u32,
    json: bool,
) -> Result<(), Failure> {
    let Some(k) = client.event_key(topic, key).await? else {
        return Err(Failure::new(
            EXIT_TASK,
            format!("no event was published on key {key:?} of topic {topic:?}"),
        ));
    };
    let events = client.event_list(topic, key, after_seq, limit).await?;
    let more = events.len() == limit as usize;
    if json {
        print_json(&serde_json::json!({
            "key": k,
            "events": events,
            "next_after_seq": events.last().filter(|_| more).map(|e| e.seq),
        }));
        return Ok(());
    }
    let opt_time =
        |t: Option<chrono::DateTime<chrono::Utc>>| t.map_or_else(|| "-".into(), fmt_time);
    let fields = [
        ("topic", k.topic.clone()),
        ("key", k.key.clone()),
        ("next_seq", k.next_seq.to_string()),
        ("done_seq", k.done_seq.to_string()),
        (
            "lease_owner",
            match (&k.lease_owner, k.leased) {
                (Some(o), true) => o.clone(),
                (Some(o), false) => format!("{o} (expired)"),
                (None, _) => "-".into(),
            },
        ),
        ("lease_until", opt_time(k.lease_until)),
        ("lease_epoch", k.lease_epoch.to_string()),
        ("failures", k.failures.to_string()),
        (
            "held",
            match (k.held_seq, k.held_at) {
                (Some(seq), Some(at)) => format!("at seq {seq} since {}", fmt_time(at)),
                (Some(seq), None) => format!("at seq {seq}"),
                (None, Some(at)) => format!("since {}", fmt_time(at)),
                (None, None) => "no".into(),
            },
        ),
        (
            "last_error",
            k.last_error
                .as_deref()
                .map_or_else(|| "-".into(), |e| one_line(e, 200)),
        ),
    ];
    for (name, v) in fields {
        println!("{:<12} {}", format!("{name}:"), clean(&v));
    }
    if events.is_empty() {
        println!(
            "no stored event{}",
            if after_seq > 0 {
                format!(" after seq {after_seq}")
            } else {
                String::new()
            }
        );
        return Ok(());
    }
    let rows = events
        .iter()
        .map(|e| {
            vec![
                e.id.to_string(),
                e.seq.to_string(),
                e.state.as_str().to_owned(),
                e.message_id.clone(),
                fmt_time(e.created_at),
                opt_time(e.dead_at),
                e.last_error
                    .as_deref()
                    .map_or_else(|| "-".into(), |e| one_line(e, 60)),
            ]
        })
        .collect();
    print_table(
        &[
            ">ID",
            ">SEQ",
            "STATE",
            "MESSAGE ID",
            "CREATED",
            "DEAD AT",
            "LAST ERROR",
        ],
        rows,
    );
    if let Some(last) = events.last().filter(|_| more) {
        eprintln!("(more may follow: next page with --after-seq {})", last.seq);
    }
    Ok(())
}

//! Batch enqueue (`taskq::enqueue::enqueue_many`) against a real database: rows and ids, payload
//! round-trip, options, commit/rollback, all-or-nothing validation, idempotency keys, empty
//! input and inputs larger than one statement.

use std::time::Duration;

use taskq::{Client, Enqueue, Error, Task, TaskContext, TaskError, TaskId, TaskState};
use taskq_tests::backends::{Db, TestBackend};

#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
struct Note {
    text: String,
}

impl Task for Note {
    const NAME: &'static str = "note";
    const QUEUE: &'static str = "notes";
    const MAX_ATTEMPTS: u32 = 7;
    const PRIORITY: i16 = 3;
    async fn run(self, _cx: TaskContext) -> Result<(), TaskError> {
        Ok(())
    }
}

fn note(text: impl Into<String>) -> Note {
    Note { text: text.into() }
}

async fn db_now<B: TestBackend>(db: &Db<B>) -> chrono::DateTime<chrono::Utc> {
    db.server_now().await
}

async fn payload_of<B: TestBackend>(db: &Db<B>, id: TaskId) -> Vec<u8> {
    let mut rows = db
        .blobs(&format!(
            "SELECT payload FROM taskq_tasks WHERE id = {}",
            id.0
        ))
        .await;
    assert_eq!(rows.len(), 1, "task {id} exists");
    rows.remove(0)
}

async fn empty_input_writes_nothing<B: TestBackend>(db: Db<B>) {
    let mut tx = db.begin().await;
    let out = taskq::enqueue::enqueue_many(&mut tx, Vec::<Note>::new())
        .await
        .unwrap();
    assert!(out.is_empty());
    tx.commit().await.unwrap();
    assert_eq!(db.count("1=1").await, 0);
}

async fn rows_get_their_ids_in_input_order_and_payloads_round_trip<B: TestBackend>(db: Db<B>) {
    // Texts that stress the encoding: quotes, backslashes, control characters, non-ASCII.
    let texts: Vec<String> = (0..300)
        .map(|i| format!("n{i} \"q\" \\ \u{0}\t\n é 漢字 🚀 {}", "x".repeat(i % 7)))
        .collect();
    let mut tx = db.begin().await;
    let out = taskq::enqueue::enqueue_many(&mut tx, texts.iter().map(note))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(out.len(), texts.len());
    assert!(out.iter().all(|e| !e.duplicate));
    assert!(
        out.windows(2).all(|w| w[0].id.0 < w[1].id.0),
        "ascending ids"
    );
    assert_eq!(db.count("1=1").await, 300);
    let client = Client::new(db.pool.clone());
    for (e, text) in out.iter().zip(&texts) {
        let info = client.get(e.id).await.unwrap();
        assert_eq!(info.state, TaskState::Pending);
        assert_eq!((info.queue.as_str(), info.name.as_str()), ("notes", "note"));
        assert_eq!((info.max_attempts, info.priority, info.attempt), (7, 3, 0));
        assert_eq!(info.idempotency_key, None);
        // Byte-exact: the stored payload is what single enqueue stores.
        assert_eq!(
            info.payload,
            serde_json::to_vec(&note(text.as_str())).unwrap()
        );
        assert_eq!(
            serde_json::from_value::<Note>(info.payload_json().unwrap()).unwrap(),
            note(text.as_str())
        );
    }
}

async fn per_task_options_are_applied<B: TestBackend>(db: Db<B>) {
    let client = Client::new(db.pool.clone());
    let at = db_now(&db).await + chrono::Duration::hours(5);
    let batch = vec![
        Enqueue::new(note("plain")),
        note("delayed")
            .enqueue_options()
            .with_delay(Duration::from_secs(3600)),
        note("at").enqueue_options().with_run_at(at),
        note("opts")
            .enqueue_options()
            .with_priority(-9)
            .with_queue("other")
            .with_max_attempts(2)
            .with_trace_context("00-aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa-bbbbbbbbbbbbbbbb-01"),
    ];
    let mut conn = db.pool.acquire().await.unwrap();
    let out = taskq::enqueue::enqueue_many(&mut conn, batch)
        .await
        .unwrap();
    let now = db_now(&db).await;
    let plain = client.get(out[0].id).await.unwrap();
    assert!(plain.run_at <= now);
    let delayed = client.get(out[1].id).await.unwrap();
    let d = delayed.run_at - now;
    assert!(d > chrono::Duration::minutes(59) && d <= chrono::Duration::minutes(60));
    let fixed = client.get(out[2].id).await.unwrap();
    assert_eq!(fixed.run_at, at.with_timezone(&chrono::Utc));
    let opts = client.get(out[3].id).await.unwrap();
    assert_eq!(
        (opts.priority, opts.queue.as_str(), opts.max_attempts),
        (-9, "other", 2)
    );
    assert_eq!(
        opts.trace_context.as_deref(),
        Some("00-aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa-bbbbbbbbbbbbbbbb-01")
    );
    assert_eq!(plain.trace_context, None);
    assert_eq!(payload_of(&db, out[3].id).await, br#"{"text":"opts"}"#);
}

async fn invisible_until_commit_and_gone_on_rollback<B: TestBackend>(db: Db<B>) {
    let mut tx = db.begin().await;
    taskq::enqueue::enqueue_many(&mut tx, (0..50).map(|i| note(i.to_string())))
        .await
        .unwrap();
    assert_eq!(db.count("1=1").await, 0, "not visible before commit");
    tx.rollback().await.unwrap();
    assert_eq!(db.count("1=1").await, 0, "rolled back");

    let mut tx = db.begin().await;
    taskq::enqueue::enqueue_many(&mut tx, (0..50).map(|i| note(i.to_string())))
        .await
        .unwrap();
    assert_eq!(db.count("1=1").await, 0);
    tx.commit().await.unwrap();
    assert_eq!(db.count("state = 'pending'").await, 50);
}

/// An invalid task and a check of the error it must produce.
type Case = (Enqueue<Note>, fn(&Error) -> bool);

async fn one_invalid_task_writes_nothing<B: TestBackend>(db: Db<B>) {
    // On a plain (autocommit) connection, so a partial write would stay.
    let mut conn = db.pool.acquire().await.unwrap();
    let cases: Vec<Case> = vec![
        (note("q").enqueue_options().with_queue(""), |e| {
            matches!(e, Error::InvalidName { what: "queue", .. })
        }),
        (note("m").enqueue_options().with_max_attempts(0), |e| {
            matches!(e, Error::InvalidOption(_))
        }),
        (note("big").enqueue_options().with_payload_limit(4), |e| {
            matches!(e, Error::PayloadTooLarge { .. })
        }),
        (
            note("d")
                .enqueue_options()
                .with_delay(taskq::defaults::MAX_DELAY + Duration::from_secs(1)),
            |e| matches!(e, Error::InvalidSchedule(_)),
        ),
        (
            note("k").enqueue_options().with_idempotency_key(" k"),
            |e| matches!(e, Error::InvalidName { .. }),
        ),
    ];
    for (bad, is_expected) in cases {
        let mut batch: Vec<Enqueue<Note>> =
            (0..20).map(|i| Enqueue::new(note(i.to_string()))).collect();
        batch.insert(10, bad);
        let e = taskq::enqueue::enqueue_many(&mut conn, batch)
            .await
            .unwrap_err();
        assert!(is_expected(&e), "unexpected error {e:?}");
        assert_eq!(db.count("1=1").await, 0, "nothing written for {e}");
    }
}

async fn idempotency_keys_in_a_batch_deduplicate_per_row<B: TestBackend>(db: Db<B>) {
    let existing = note("old")
        .enqueue_options()
        .with_idempotency_key("k1")
        .enqueue(&db.pool)
        .await
        .unwrap();
    let batch = vec![
        Enqueue::new(note("a")),
        note("b").enqueue_options().with_idempotency_key("k1"), // exists already
        note("c").enqueue_options().with_idempotency_key("k2"), // new
        Enqueue::new(note("d")),
        note("e").enqueue_options().with_idempotency_key("k2"), // repeats a key of this batch
        Enqueue::new(note("f")),
    ];
    let mut tx = db.begin().await;
    let out = taskq::enqueue::enqueue_many(&mut tx, batch).await.unwrap();
    tx.commit().await.unwrap();
    let dup: Vec<bool> = out.iter().map(|e| e.duplicate).collect();
    assert_eq!(dup, [false, true, false, false, true, false]);
    assert_eq!(out[1].id, existing.id);
    assert_eq!(out[4].id, out[2].id);
    // New rows have ascending ids in input order.
    let new: Vec<u64> = out
        .iter()
        .filter(|e| !e.duplicate)
        .map(|e| e.id.0)
        .collect();
    assert!(new.windows(2).all(|w| w[0] < w[1]));
    assert_eq!(db.count("1=1").await, 1 + 4);
    assert_eq!(payload_of(&db, out[2].id).await, br#"{"text":"c"}"#);
    assert_eq!(payload_of(&db, out[3].id).await, br#"{"text":"d"}"#);
}

async fn large_inputs_span_several_statements<B: TestBackend>(db: Db<B>) {
    let n = 12_345;
    let mut tx = db.begin().await;
    let out = taskq::enqueue::enqueue_many(&mut tx, (0..n).map(|i| note(format!("{i:0>200}"))))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(out.len(), n);
    assert_eq!(db.count("1=1").await, n as i64);
    // Every returned id is a row with the matching payload.
    let ids = db.ints("SELECT id FROM taskq_tasks ORDER BY id").await;
    let payloads = db
        .blobs("SELECT payload FROM taskq_tasks ORDER BY id")
        .await;
    let rows: Vec<(u64, Vec<u8>)> = ids.into_iter().map(|id| id as u64).zip(payloads).collect();
    assert_eq!(rows.len(), n);
    for ((i, e), (id, payload)) in out.iter().enumerate().zip(&rows) {
        assert_eq!(e.id.0, *id);
        assert_eq!(
            *payload,
            serde_json::to_vec(&note(format!("{i:0>200}"))).unwrap()
        );
    }
}

/// Under `innodb_autoinc_lock_mode=2` (MySQL 8's default, required by Galera) one statement's
/// ids need not be consecutive: four connections insert batches at once, together with
/// single-row inserts and an `auto_increment_increment` of 3 (as Galera sets it), so their
/// ids interleave. Every returned id still holds its own input's payload, in input order, and
/// the batches went out as multi-row statements (not one statement per row).
// MySQL only: InnoDB's auto-increment lock mode and auto_increment_increment (Galera).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ids_are_exact_under_autoinc_lock_mode_2_with_interleaved_inserts() {
    use taskq_tests::server::PrivateServer;
    let Some(server) = PrivateServer::start_with_args_or_skip(&[
        "--innodb-autoinc-lock-mode=2",
        "--auto-increment-increment=3",
        "--auto-increment-offset=2",
    ])
    .await
    else {
        return;
    };
    let url = server.create_database("mode2").await.unwrap();
    let pool = sqlx::mysql::MySqlPoolOptions::new()
        .max_connections(8)
        .connect(&url)
        .await
        .unwrap();
    taskq::migrate(&pool).await.unwrap();
    let mode: i64 = sqlx::query_scalar("SELECT @@innodb_autoinc_lock_mode")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(mode, 2);
    let mut producers = Vec::new();
    for p in 0..4 {
        let pool = pool.clone();
        producers.push(tokio::spawn(async move {
            let mut got = Vec::new();
            for round in 0..5 {
                let texts: Vec<String> = (0..300).map(|i| format!("p{p}-r{round}-{i}")).collect();
                let mut tx = pool.begin().await.unwrap();
                let out = taskq::enqueue::enqueue_many(&mut tx, texts.iter().map(note))
                    .await
                    .unwrap();
                // A single insert between batches, on another connection.
                note(format!("single-{p}-{round}"))
                    .enqueue(&pool)
                    .await
                    .unwrap();
                tx.commit().await.unwrap();
                got.extend(texts.into_iter().zip(out.into_iter().map(|e| e.id)));
            }
            got
        }));
    }
    let mut all = Vec::new();
    for p in producers {
        let got = p.await.unwrap();
        // Ascending in input order within each call.
        for w in got.chunks(300) {
            assert!(w.windows(2).all(|p| p[0].1.0 < p[1].1.0));
        }
        all.extend(got);
    }
    let rows: Vec<(u64, Vec<u8>)> = sqlx::query_as("SELECT id, payload FROM taskq_tasks")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(rows.len(), 4 * 5 * 301);
    let by_id: std::collections::HashMap<u64, Note> = rows
        .into_iter()
        .map(|(id, p)| (id, serde_json::from_slice(&p).unwrap()))
        .collect();
    let mut gaps = 0;
    for (text, id) in &all {
        assert_eq!(by_id.get(&id.0), Some(&note(text.clone())), "task {id}");
    }
    for call in all.chunks(300) {
        gaps += call.windows(2).filter(|w| w[1].1.0 != w[0].1.0 + 3).count();
    }
    // The marker column was used (the batched path), and ids did interleave somewhere or the
    // step of 3 was honoured throughout.
    let marked: i64 =
        sqlx::query_scalar("SELECT COUNT(*) FROM taskq_tasks WHERE enqueue_batch IS NOT NULL")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(
        marked,
        4 * 5 * 300,
        "every batch row went through the batched path"
    );
    eprintln!(
        "mode 2: {} batch rows, {gaps} places where another insert's id fell inside a batch",
        all.len()
    );
}

taskq_tests::conformance!(
    empty_input_writes_nothing,
    rows_get_their_ids_in_input_order_and_payloads_round_trip,
    per_task_options_are_applied,
    invisible_until_commit_and_gone_on_rollback,
    one_invalid_task_writes_nothing,
    idempotency_keys_in_a_batch_deduplicate_per_row,
    large_inputs_span_several_statements,
);

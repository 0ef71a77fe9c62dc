//! `Client`: status, list/count, cancel and retry of dead tasks.

use taskq::{Client, Error, Task, TaskContext, TaskError, TaskId, TaskState, client::ListFilter};
use taskq_tests::backends::{Db, TestBackend, blob};

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Ping(u32);

impl Task for Ping {
    const NAME: &'static str = "ping";
    async fn run(self, _cx: TaskContext) -> Result<(), TaskError> {
        Ok(())
    }
}

async fn set_state<B: TestBackend>(db: &Db<B>, id: TaskId, state: &str) {
    db.exec(&format!(
        "UPDATE taskq_tasks SET state = '{state}', finished_at = {} WHERE id = {}",
        db.now(),
        id.0
    ))
    .await;
}

async fn cancel_cancels_pending_tasks_and_requests_running_ones<B: TestBackend>(db: Db<B>) {
    let client = Client::new(db.pool.clone());
    let a = Ping(1).enqueue(&db.pool).await.unwrap().id;
    assert_eq!(
        client.cancel(a).await.unwrap(),
        taskq::client::Canceled::Now
    );
    let info = client.get(a).await.unwrap();
    assert_eq!(info.state, TaskState::Canceled);
    assert!(info.finished_at.is_some());

    let b = Ping(2).enqueue(&db.pool).await.unwrap().id;
    set_state(&db, b, "running").await;
    // A running task: the request is recorded, the row stays running.
    assert_eq!(
        client.cancel(b).await.unwrap(),
        taskq::client::Canceled::Requested
    );
    match client.cancel(a).await {
        Err(Error::WrongState {
            id,
            state: TaskState::Canceled,
            expected: "pending or running",
        }) => assert_eq!(id, a),
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        client.cancel(TaskId(999_999)).await,
        Err(Error::NotFound(TaskId(999_999)))
    ));
    assert!(matches!(
        client.get(TaskId(999_999)).await,
        Err(Error::NotFound(_))
    ));
    assert_eq!(client.get(b).await.unwrap().state, TaskState::Running);
}

async fn list_and_count_filter_by_queue_state_and_name<B: TestBackend>(db: Db<B>) {
    let client = Client::new(db.pool.clone());
    let mut ids = Vec::new();
    for i in 0..5 {
        ids.push(Ping(i).enqueue(&db.pool).await.unwrap().id);
    }
    for i in 0..3 {
        Ping(i)
            .enqueue_options()
            .with_queue("other")
            .enqueue(&db.pool)
            .await
            .unwrap();
    }
    set_state(&db, ids[0], "dead").await;
    let all = ListFilter::default();
    assert_eq!(client.count(&all).await.unwrap(), 8);
    let default_pending = ListFilter {
        queue: Some("default".into()),
        state: Some(TaskState::Pending),
        ..Default::default()
    };
    assert_eq!(client.count(&default_pending).await.unwrap(), 4);
    let page1 = client
        .list(&ListFilter {
            limit: Some(2),
            ..default_pending.clone()
        })
        .await
        .unwrap();
    assert_eq!(page1.iter().map(|t| t.id).collect::<Vec<_>>(), ids[1..3]);
    let page2 = client
        .list(&ListFilter {
            after_id: Some(page1[1].id),
            ..default_pending.clone()
        })
        .await
        .unwrap();
    assert_eq!(page2.iter().map(|t| t.id).collect::<Vec<_>>(), ids[3..5]);
    let by_name = ListFilter {
        name: Some("nope".into()),
        ..Default::default()
    };
    assert_eq!(client.count(&by_name).await.unwrap(), 0);
    let stats = client.stats().await.unwrap();
    let get = |q: &str, s: TaskState| {
        stats
            .iter()
            .find(|x| x.queue == q && x.state == s)
            .map(|x| x.count)
    };
    assert_eq!(get("default", TaskState::Pending), Some(4));
    assert_eq!(get("default", TaskState::Dead), Some(1));
    assert_eq!(get("other", TaskState::Pending), Some(3));
}

async fn retry_dead_resets_attempts_and_bumps_the_epoch<B: TestBackend>(db: Db<B>) {
    let client = Client::new(db.pool.clone());
    let id = Ping(1).enqueue(&db.pool).await.unwrap().id;
    assert!(matches!(
        client.retry_dead(id).await,
        Err(Error::WrongState {
            expected: "dead",
            ..
        })
    ));
    db.exec(&format!(
        "UPDATE taskq_tasks SET state = 'dead', attempt = 20, lease_epoch = 20 WHERE id = {}",
        id.0
    ))
    .await;
    client.retry_dead(id).await.unwrap();
    let info = client.get(id).await.unwrap();
    assert_eq!(
        (info.state, info.attempt, info.lease_epoch),
        (TaskState::Pending, 0, 21)
    );
    assert!(info.finished_at.is_none());
}

/// Doubles every row of the table `times` times (a portable way to make many rows).
async fn double_rows<B: TestBackend>(db: &Db<B>, times: u32) {
    for _ in 0..times {
        db.exec(
            "INSERT INTO taskq_tasks (queue, name, payload, state, priority, attempt, max_attempts,
               run_at, lease_epoch, created_at, updated_at, finished_at)
             SELECT queue, name, payload, state, priority, attempt, max_attempts,
               run_at, lease_epoch, created_at, updated_at, finished_at FROM taskq_tasks",
        )
        .await;
    }
}

async fn db_now_is_the_database_clock<B: TestBackend>(db: Db<B>) {
    let client = Client::new(db.pool.clone());
    let before = client.db_now().await.unwrap();
    let id = Ping(1).enqueue(&db.pool).await.unwrap().id;
    let after = client.db_now().await.unwrap();
    let created = client.get(id).await.unwrap().created_at;
    assert!(
        before <= created && created <= after,
        "{before} {created} {after}"
    );
    let server = db.server_now().await;
    assert!((server - after).num_seconds().abs() < 5);
}

async fn retry_all_dead_moves_every_dead_task_in_batches<B: TestBackend>(db: Db<B>) {
    let client = Client::new(db.pool.clone());
    let seed = Ping(0).enqueue(&db.pool).await.unwrap().id;
    db.exec(&format!(
        "UPDATE taskq_tasks SET state = 'dead', attempt = 5, lease_epoch = 7,
           finished_at = {} WHERE id = {}",
        db.now(),
        seed.0
    ))
    .await;
    double_rows(&db, 10).await; // 1024 dead tasks: more than two batches
    let batch = u64::from(Client::BATCH);
    assert!(1024 > 2 * batch);
    for i in 0..3 {
        let id = Ping(i)
            .enqueue_options()
            .with_queue("other")
            .enqueue(&db.pool)
            .await
            .unwrap()
            .id;
        set_state(&db, id, "dead").await;
    }
    // A dead task without finished_at (written by hand) is retried too.
    let bare = Ping(9)
        .enqueue_options()
        .with_queue("other")
        .enqueue(&db.pool)
        .await
        .unwrap()
        .id;
    db.exec(&format!(
        "UPDATE taskq_tasks SET state = 'dead' WHERE id = {}",
        bare.0
    ))
    .await;
    let pending = Ping(10).enqueue(&db.pool).await.unwrap().id;
    let canceled = Ping(11).enqueue(&db.pool).await.unwrap().id;
    client.cancel(canceled).await.unwrap();

    assert_eq!(client.retry_all_dead(Some("other")).await.unwrap(), 4);
    assert_eq!(db.count("queue = 'other' AND state = 'pending'").await, 4);
    assert_eq!(db.count("queue = 'default' AND state = 'dead'").await, 1024);
    assert_eq!(client.retry_all_dead(Some("nope")).await.unwrap(), 0);

    assert_eq!(client.retry_all_dead(None).await.unwrap(), 1024);
    assert_eq!(db.count("state = 'dead'").await, 0);
    assert_eq!(
        db.count(
            "queue = 'default' AND state = 'pending' AND attempt = 0 AND lease_epoch = 8
               AND finished_at IS NULL AND lease_until IS NULL"
        )
        .await,
        1024
    );
    assert_eq!(client.get(pending).await.unwrap().lease_epoch, 0);
    assert_eq!(
        client.get(canceled).await.unwrap().state,
        TaskState::Canceled
    );
    assert_eq!(client.retry_all_dead(None).await.unwrap(), 0);
}

async fn purge_deletes_old_terminal_tasks_only<B: TestBackend>(db: Db<B>) {
    use std::time::Duration;
    let client = Client::new(db.pool.clone());
    let old = |id: TaskId, state: &str, days: u64| {
        format!(
            "UPDATE taskq_tasks SET state = '{state}', finished_at = {} WHERE id = {}",
            db.ago(Duration::from_secs(days * 86_400)),
            id.0
        )
    };
    let seed = Ping(0).enqueue(&db.pool).await.unwrap().id;
    db.exec(&old(seed, "succeeded", 10)).await;
    double_rows(&db, 10).await; // 1024 old succeeded tasks
    let mut keep = Vec::new();
    for (i, (state, days)) in [
        ("dead", 10),
        ("canceled", 10),
        ("succeeded", 1),
        ("dead", 1),
    ]
    .into_iter()
    .enumerate()
    {
        let id = Ping(i as u32).enqueue(&db.pool).await.unwrap().id;
        db.exec(&old(id, state, days)).await;
        if days == 1 {
            keep.push(id);
        }
    }
    // Old but not terminal: never purged.
    let running = Ping(20).enqueue(&db.pool).await.unwrap().id;
    db.exec(&old(running, "running", 30)).await;
    let pending = Ping(21).enqueue(&db.pool).await.unwrap().id;
    let week = Duration::from_secs(7 * 86_400);

    assert!(matches!(
        client.purge(Some(TaskState::Pending), week).await,
        Err(Error::InvalidOption(_))
    ));
    assert!(matches!(
        client.purge(Some(TaskState::Running), week).await,
        Err(Error::InvalidOption(_))
    ));
    assert_eq!(
        client
            .purge(Some(TaskState::Succeeded), week)
            .await
            .unwrap(),
        1024
    );
    assert_eq!(db.count("state = 'dead'").await, 2);
    assert_eq!(client.purge(None, week).await.unwrap(), 2); // old dead + old canceled
    assert_eq!(client.purge(None, week).await.unwrap(), 0);
    for id in keep.into_iter().chain([running, pending]) {
        client.get(id).await.unwrap();
    }
    assert_eq!(db.count("1 = 1").await, 4);
    assert_eq!(
        client
            .purge(None, Duration::from_secs(3_600))
            .await
            .unwrap(),
        2
    );
    assert_eq!(db.count("1 = 1").await, 2);
}

// MySQL only: the address of a MySQL pool that cannot connect (a SQLite file has none).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_database_is_named_with_what_to_check() {
    if !taskq_tests::loopback_or_skip() {
        return;
    }
    let pool = sqlx::mysql::MySqlPoolOptions::new()
        .acquire_timeout(std::time::Duration::from_secs(1))
        .connect_lazy("mysql://root@127.0.0.1:1/x")
        .unwrap();
    // The client knows the pool's address and looks for the cause behind the pool's timeout.
    let e = Client::new(pool.clone()).stats().await.unwrap_err();
    assert!(matches!(e, Error::Connect { .. }), "{e:#?}");
    assert_eq!(
        e.to_string(),
        "cannot connect to the database at 127.0.0.1:1 (connection refused): is the server \
         running, and are the host and port in the database URL right?"
    );
    // Enqueueing through the pool finds the cause the same way.
    let e = Ping(1).enqueue(&pool).await.unwrap_err();
    assert!(matches!(e, Error::Connect { .. }), "{e:#?}");
    assert!(
        e.to_string()
            .starts_with("cannot connect to the database at 127.0.0.1:1 (connection refused)"),
        "{e}"
    );
}

async fn a_database_without_taskq_tables_says_to_migrate<B: TestBackend>(db: Db<B>) {
    db.exec("DROP TABLE taskq_tasks").await;
    let e = Client::new(db.pool.clone())
        .get(TaskId(1))
        .await
        .unwrap_err();
    let text = e.to_string();
    // The database's own error text differs by backend; taskq's hint is the same.
    let (start, end) = match db.label() {
        "mysql" => (
            "database error: 1146 (42S02): Table '",
            "taskq_tasks' doesn't exist",
        ),
        _ => (
            "database error: (code: 1) no such table: taskq_tasks",
            "no such table: taskq_tasks",
        ),
    };
    assert!(text.starts_with(start), "{text}");
    assert!(
        text.ends_with(&format!(
            "{end} (taskq's tables are missing: run taskq::migrate(&pool) \
             at start-up, or `taskq migrate`)"
        )),
        "{text}"
    );
    assert_eq!(format!("{e:?}"), text, "Debug repeats nothing");
}

async fn newest_first_pages_finished_per_minute_and_purge_count<B: TestBackend>(db: Db<B>) {
    let client = Client::new(db.pool.clone());
    let mut ids = vec![];
    for n in 0..5 {
        ids.push(Ping(n).enqueue(&db.pool).await.unwrap().id);
    }
    let newest = ListFilter {
        limit: Some(2),
        newest_first: true,
        ..Default::default()
    };
    let page1: Vec<TaskId> = client
        .list(&newest)
        .await
        .unwrap()
        .iter()
        .map(|t| t.id)
        .collect();
    assert_eq!(page1, [ids[4], ids[3]]);
    let page2 = ListFilter {
        after_id: Some(ids[3]),
        ..newest.clone()
    };
    let page2: Vec<TaskId> = client
        .list(&page2)
        .await
        .unwrap()
        .iter()
        .map(|t| t.id)
        .collect();
    assert_eq!(page2, [ids[2], ids[1]]);

    // Two dead now, one succeeded now, one dead finished 3 minutes ago.
    set_state(&db, ids[0], "dead").await;
    set_state(&db, ids[1], "dead").await;
    set_state(&db, ids[2], "succeeded").await;
    set_state(&db, ids[3], "dead").await;
    db.set_ago(
        &format!("id = {}", ids[3].0),
        "finished_at",
        std::time::Duration::from_secs(190),
    )
    .await;
    let mut per = client.finished_per_minute(10).await.unwrap();
    per.sort_by_key(|p| (p.minutes_ago, p.state.as_str() != "succeeded"));
    let got: Vec<(u32, TaskState, u64)> = per
        .iter()
        .map(|p| (p.minutes_ago, p.state, p.count))
        .collect();
    assert_eq!(
        got,
        [
            (0, TaskState::Succeeded, 1),
            (0, TaskState::Dead, 2),
            (3, TaskState::Dead, 1)
        ]
    );
    // A window that ends before the older one leaves it out.
    assert_eq!(client.finished_per_minute(2).await.unwrap().len(), 2);

    let two_min = std::time::Duration::from_secs(120);
    assert_eq!(
        client
            .purge_count(Some(TaskState::Dead), two_min)
            .await
            .unwrap(),
        1
    );
    assert_eq!(
        client
            .purge_count(None, std::time::Duration::ZERO)
            .await
            .unwrap(),
        4
    );
    assert!(matches!(
        client.purge_count(Some(TaskState::Pending), two_min).await,
        Err(Error::InvalidOption(_))
    ));
    assert_eq!(
        client.purge(Some(TaskState::Dead), two_min).await.unwrap(),
        1
    );
    assert_eq!(
        client
            .purge_count(Some(TaskState::Dead), two_min)
            .await
            .unwrap(),
        0
    );
}

/// Inserts a task row with an explicit id (any queue, name, state).
async fn insert_at<B: TestBackend>(db: &Db<B>, id: u64, queue: &str, name: &str, state: &str) {
    let now = db.now();
    db.exec(&format!(
        "INSERT INTO taskq_tasks (id, queue, name, payload, state, max_attempts, run_at, created_at, updated_at)
         VALUES ({id}, '{queue}', '{name}', {}, '{state}', 3, {now}, {now}, {now})",
        blob(b"{}")
    ))
    .await;
}

/// Every id `filter` lists, page after page of `limit`.
async fn all_pages(client: &Client, mut filter: ListFilter, limit: u32) -> Vec<u64> {
    filter.limit = Some(limit);
    let mut ids = Vec::new();
    loop {
        let page = client.list(&filter).await.unwrap();
        assert!(page.len() <= limit as usize);
        ids.extend(page.iter().map(|t| t.id.0));
        match page.last() {
            Some(t) if page.len() == limit as usize => filter.after_id = Some(t.id),
            _ => return ids,
        }
    }
}

async fn a_queue_filter_without_a_state_pages_beyond_the_primary_key_probe<B: TestBackend>(
    db: Db<B>,
) {
    let client = Client::new(db.pool.clone());
    let probe = Client::LIST_PROBE_IDS;
    // A small queue spread over ids far apart (several probe windows), in every state, and
    // a big queue filling the ids in between near both ends.
    let states = [
        "pending",
        "running",
        "succeeded",
        "dead",
        "canceled",
        "expired",
    ];
    let small: Vec<u64> = (0..14u64).map(|i| 5 + i * (probe / 3 + 7)).collect();
    for (i, id) in small.iter().enumerate() {
        let name = if i % 2 == 0 { "even" } else { "odd" };
        insert_at(&db, *id, "small", name, states[i % 6]).await;
    }
    let last = *small.last().unwrap();
    for id in (1..40).chain(last - 30..last + 40) {
        if !small.contains(&id) {
            insert_at(&db, id, "big", "t", states[(id % 6) as usize]).await;
        }
    }
    let big: Vec<u64> = db
        .ints("SELECT id FROM taskq_tasks WHERE queue = 'big' ORDER BY id")
        .await
        .into_iter()
        .map(|id| id as u64)
        .collect();
    let odd: Vec<u64> = small.iter().copied().skip(1).step_by(2).collect();
    for limit in [1, 2, 3, 50] {
        for newest_first in [false, true] {
            let rev = |mut v: Vec<u64>| {
                if newest_first {
                    v.reverse();
                }
                v
            };
            let of = |queue: &str, name: Option<&str>| ListFilter {
                queue: Some(queue.into()),
                name: name.map(str::to_owned),
                newest_first,
                ..Default::default()
            };
            assert_eq!(
                all_pages(&client, of("small", None), limit).await,
                rev(small.clone()),
                "small, limit {limit}, newest first {newest_first}"
            );
            assert_eq!(
                all_pages(&client, of("small", Some("odd")), limit).await,
                rev(odd.clone()),
                "small odd, limit {limit}, newest first {newest_first}"
            );
            assert_eq!(
                all_pages(&client, of("big", None), limit.max(20)).await,
                rev(big.clone()),
                "big, newest first {newest_first}"
            );
            assert_eq!(
                all_pages(&client, of("none", None), limit).await,
                Vec::<u64>::new()
            );
        }
    }
    // A cursor in the middle of a gap, both ways.
    let mid = ListFilter {
        queue: Some("small".into()),
        after_id: Some(TaskId(small[7] + 1)),
        limit: Some(3),
        ..Default::default()
    };
    let ids = |v: Vec<taskq::client::TaskInfo>| v.iter().map(|t| t.id.0).collect::<Vec<_>>();
    assert_eq!(ids(client.list(&mid).await.unwrap()), small[8..11].to_vec());
    let mid_desc = ListFilter {
        newest_first: true,
        ..mid
    };
    assert_eq!(
        ids(client.list(&mid_desc).await.unwrap()),
        vec![small[7], small[6], small[5]]
    );
}

taskq_tests::conformance!(
    cancel_cancels_pending_tasks_and_requests_running_ones,
    list_and_count_filter_by_queue_state_and_name,
    retry_dead_resets_attempts_and_bumps_the_epoch,
    db_now_is_the_database_clock,
    retry_all_dead_moves_every_dead_task_in_batches,
    purge_deletes_old_terminal_tasks_only,
    a_database_without_taskq_tables_says_to_migrate,
    newest_first_pages_finished_per_minute_and_purge_count,
    a_queue_filter_without_a_state_pages_beyond_the_primary_key_probe,
);

// MySQL only: a network that goes silent needs a TCP connection (SQLite has none; its lock
// waits end at its busy timeout).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_calls_end_at_the_deadline_when_the_network_goes_silent() {
    use std::time::{Duration, Instant};
    use taskq_tests::proxy::ChaosProxy;
    if !taskq_tests::loopback_or_skip() {
        return;
    }
    let Some(db) = taskq_tests::TestDb::new_or_skip().await else {
        return;
    };
    let upstream = format!("{}:{}", db.options.get_host(), db.options.get_port())
        .parse()
        .expect("the test server is addressed by IP");
    let proxy = ChaosProxy::start(upstream).await;
    let pool = sqlx::mysql::MySqlPoolOptions::new()
        .max_connections(4)
        .connect_lazy_with(db.options.clone().port(proxy.addr().port()));
    assert_eq!(
        Client::new(pool.clone()).timeout(),
        Duration::from_secs(30),
        "the default"
    );
    let deadline = Duration::from_millis(500);
    let client = Client::new(pool).with_timeout(deadline);
    let id = Ping(1).enqueue(&db.pool).await.unwrap().id;
    assert_eq!(client.get(id).await.unwrap().state, TaskState::Pending);
    // The network goes silent: what is sent is swallowed, nothing comes back.
    proxy.set_black_hole(true);
    proxy.black_hole_all();
    let calls: Vec<(&str, _)> = vec![
        (
            "get",
            Box::pin(async { client.get(id).await.map(drop) })
                as std::pin::Pin<Box<dyn std::future::Future<Output = taskq::Result<()>>>>,
        ),
        (
            "list",
            Box::pin(async { client.list(&ListFilter::default()).await.map(drop) }),
        ),
        ("stats", Box::pin(async { client.stats().await.map(drop) })),
        (
            "cancel",
            Box::pin(async { client.cancel(id).await.map(drop) }),
        ),
        (
            "pause_queue",
            Box::pin(async { client.pause_queue("default").await }),
        ),
        (
            "retry_all_dead",
            Box::pin(async { client.retry_all_dead(None).await.map(drop) }),
        ),
    ];
    for (what, call) in calls {
        let asked = Instant::now();
        let e = tokio::time::timeout(Duration::from_secs(10), call)
            .await
            .unwrap_or_else(|_| panic!("{what} still waits after 10 s"))
            .unwrap_err();
        assert!(
            matches!(e, Error::Timeout(d) if d == deadline),
            "{what}: {e:?}"
        );
        assert!(e.to_string().contains("did not answer within 500ms"), "{e}");
        assert!(
            asked.elapsed() < Duration::from_secs(5),
            "{what}: {:?}",
            asked.elapsed()
        );
    }
    // Nothing was changed.
    assert_eq!(db.count("state = 'pending'").await, 1);
}

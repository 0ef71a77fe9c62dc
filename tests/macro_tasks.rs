//! `#[taskq::task]` against a real database: payloads round-trip, attributes land in the row,
//! the enqueue helpers work, tasks from another module register and run, and start-up
//! catches missing data and duplicate names.

#[path = "macro_support/mod.rs"]
mod macro_support;

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use taskq::{
    __private::DataRequirement, Backoff, Client, Error, Task, TaskContext, TaskError, TaskId,
    TaskState, client::TaskInfo, context::FromTaskContext, worker::WorkerBuilder,
};
use taskq_tests::backends::{Db, TestBackend};

use macro_support::{ChargeInvoice, Ledger, ParseAmount};

// ---------------------------------------------------------------------------------------------
// Tasks of this test binary

/// A nested payload type.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Address {
    street: String,
    zip: Option<u32>,
}

/// An enum payload type.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub enum Kind {
    Unit,
    Tuple(i32, String),
    Struct { x: f64 },
}

/// Many payload shapes, plus an injected context in the middle.
#[taskq::task(queue = "macro_rich")]
#[allow(clippy::too_many_arguments)]
pub async fn rich_payload(
    id: i64,
    big: u64,
    small: i8,
    text: String,
    unicode: String,
    list: Vec<u32>,
    _cx: TaskContext,
    map: BTreeMap<String, i64>,
    some: Option<String>,
    none: Option<String>,
    addr: Address,
    kind: Vec<Kind>,
    float: f64,
    flag: bool,
    r#type: String,
    #[serde(default)] added_later: u32,
) -> Result<(), TaskError> {
    let _ = (
        id, big, small, text, unicode, list, map, some, none, addr, kind, float, flag,
    );
    let _ = (r#type, added_later);
    Ok(())
}

/// Everything left at its default.
#[taskq::task]
async fn plain_defaults(n: i32) -> Result<(), TaskError> {
    let _ = n;
    Ok(())
}

/// Every attribute given.
#[taskq::task(
    name = "macro_tests.attrs.v2",
    queue = "macro_attrs",
    max_attempts = 3,
    priority = -7,
    timeout = "2s",
    backoff = "exponential(500ms, 1m)",
    max_snoozes = 3,
    ttl = "1h"
)]
async fn with_attrs(n: i32) -> Result<(), TaskError> {
    let _ = n;
    Ok(())
}

/// Shared data reached through a custom `#[inject]` extractor.
#[derive(Clone)]
struct TenantName(String);

struct Tenant(String);

impl FromTaskContext for Tenant {
    fn from_task_context(cx: &TaskContext) -> Result<Self, TaskError> {
        cx.data::<TenantName>()
            .map(|t| Tenant(t.0))
            .ok_or_else(|| TaskError::permanent(Error::Config("no tenant".into())))
    }
    fn requirement() -> Option<DataRequirement> {
        Some(DataRequirement::of::<TenantName>())
    }
}

#[taskq::task(queue = "macro_tenant")]
async fn per_tenant(#[inject] tenant: Tenant, n: u32) -> Result<(), TaskError> {
    if tenant.0 == "acme" && n == 1 {
        Ok(())
    } else {
        Err(TaskError::msg("wrong tenant"))
    }
}

/// Two tasks claiming the same stable name: start-up must refuse them.
mod clash {
    use taskq::TaskError;

    #[taskq::task(name = "macro_tests.same")]
    pub async fn first_same(a: u8) -> Result<(), TaskError> {
        let _ = a;
        Ok(())
    }

    #[taskq::task(name = "macro_tests.same")]
    pub async fn second_same(b: u8) -> Result<(), TaskError> {
        let _ = b;
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// Helpers

async fn row<B: TestBackend>(db: &Db<B>, id: TaskId) -> TaskInfo {
    Client::new(db.pool.clone()).get(id).await.unwrap()
}

async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !check().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn wait_state<B: TestBackend>(db: &Db<B>, id: TaskId, state: TaskState) -> TaskInfo {
    eventually(&format!("task {id} to be {state}"), || async {
        row(db, id).await.state == state
    })
    .await;
    row(db, id).await
}

/// A running worker stopped through its shutdown signal.
struct Running {
    stop: tokio::sync::oneshot::Sender<()>,
    handle: tokio::task::JoinHandle<taskq::Result<taskq::worker::ShutdownReport>>,
}

impl Running {
    fn start(builder: WorkerBuilder) -> Self {
        let (stop, rx) = tokio::sync::oneshot::channel::<()>();
        let worker = builder
            .poll_interval(Duration::from_millis(10), Duration::from_millis(50))
            .shutdown_signal(async move {
                let _ = rx.await;
            })
            .build()
            .expect("worker builds");
        Self {
            stop,
            handle: tokio::spawn(worker.run()),
        }
    }
    async fn stop(self) {
        let _ = self.stop.send(());
        self.handle.await.expect("worker task").expect("worker run");
    }
}

fn sample() -> RichPayload {
    RichPayload {
        id: -42,
        big: u64::MAX,
        small: i8::MIN,
        text: "quotes \" and \\ backslashes\nand newlines".into(),
        unicode: "héllo 🌍 \u{0}".into(),
        list: vec![1, 2, 3],
        map: BTreeMap::from([("a".to_owned(), 1), ("z".to_owned(), -1)]),
        some: Some("x".into()),
        none: None,
        addr: Address {
            street: "Main St".into(),
            zip: None,
        },
        kind: vec![
            Kind::Unit,
            Kind::Tuple(7, "t".into()),
            Kind::Struct { x: 0.1 + 0.2 },
        ],
        float: std::f64::consts::PI,
        flag: true,
        r#type: "keyword field".into(),
        added_later: 9,
    }
}

// ---------------------------------------------------------------------------------------------
// Tests

async fn payload_round_trips_through_json_exactly<B: TestBackend>(db: Db<B>) {
    let sent = sample();
    let done = sent.clone().enqueue(&db.pool).await.unwrap();
    assert!(!done.duplicate);

    let stored = row(&db, done.id).await;
    assert_eq!(stored.name, "rich_payload");
    let json = stored.payload_json().unwrap();
    // The injected context is not payload; the raw identifier is stored without `r#`.
    let keys: Vec<&str> = json
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    for key in ["id", "big", "type", "added_later"] {
        assert!(keys.contains(&key), "{key} missing from {json}");
    }
    assert!(
        !keys.contains(&"_cx") && !keys.contains(&"r#type"),
        "{json}"
    );
    assert_eq!(json["big"], serde_json::json!(u64::MAX));

    let back: RichPayload = serde_json::from_value(json.clone()).unwrap();
    assert_eq!(format!("{back:?}"), format!("{sent:?}"));
    assert_eq!(serde_json::to_value(&back).unwrap(), json);
    assert_eq!(back.float.to_bits(), sent.float.to_bits());

    // `#[serde(default)]` on a parameter: payloads queued before the field existed decode.
    let mut old = json;
    old.as_object_mut().unwrap().remove("added_later");
    let back: RichPayload = serde_json::from_value(old).unwrap();
    assert_eq!(back.added_later, 0);
}

/// `taskq::limits`, the former name of `taskq::defaults`, still names the same items
/// (deprecated).
#[test]
#[allow(deprecated)]
fn the_former_limits_module_names_the_defaults() {
    use taskq::{defaults, limits};
    assert_eq!(limits::DEFAULT_QUEUE, defaults::DEFAULT_QUEUE);
    assert_eq!(limits::MAX_DELAY, defaults::MAX_DELAY);
    assert_eq!(limits::MAX_QUEUE_LIMIT, defaults::MAX_QUEUE_LIMIT);
}

async fn defaults_and_attributes_land_in_the_row<B: TestBackend>(db: Db<B>) {
    let plain = PlainDefaults { n: 1 }.enqueue(&db.pool).await.unwrap();
    let t = row(&db, plain.id).await;
    assert_eq!(t.name, "plain_defaults");
    assert_eq!(t.queue, taskq::defaults::DEFAULT_QUEUE);
    assert_eq!(t.max_attempts, taskq::defaults::DEFAULT_MAX_ATTEMPTS);
    assert_eq!(t.priority, 0);
    assert_eq!(t.state, TaskState::Pending);
    assert_eq!(<PlainDefaults as Task>::TIMEOUT, None);
    assert_eq!(<PlainDefaults as Task>::BACKOFF, Backoff::DEFAULT);
    assert_eq!(
        <PlainDefaults as Task>::MAX_SNOOZES,
        taskq::defaults::DEFAULT_MAX_SNOOZES
    );
    assert_eq!(<PlainDefaults as Task>::TTL, None);
    assert_eq!((t.snoozes, t.deadline), (0, None));

    let mut tx = db.begin().await;
    let attrs = WithAttrs { n: 2 }.enqueue_tx(&mut tx).await.unwrap();
    tx.commit().await.unwrap();
    let t = row(&db, attrs.id).await;
    assert_eq!(t.name, "macro_tests.attrs.v2");
    assert_eq!(t.queue, "macro_attrs");
    assert_eq!(t.max_attempts, 3);
    assert_eq!(t.priority, -7);
    assert_eq!(<WithAttrs as Task>::TIMEOUT, Some(Duration::from_secs(2)));
    assert_eq!(
        <WithAttrs as Task>::BACKOFF,
        Backoff::exponential(Duration::from_millis(500), Duration::from_secs(60))
    );
    assert_eq!(<WithAttrs as Task>::MAX_SNOOZES, 3);
    assert_eq!(<WithAttrs as Task>::TTL, Some(Duration::from_secs(3600)));
    // The ttl becomes the row's deadline, an hour after the insert on the database clock.
    assert_eq!(t.deadline, Some(t.created_at + chrono::Duration::hours(1)));
}

async fn enqueue_helpers_apply_their_options<B: TestBackend>(db: Db<B>) {
    // enqueue_tx is the caller's transaction: a rollback leaves nothing behind.
    let mut tx = db.begin().await;
    let _ = PlainDefaults { n: 0 }.enqueue_tx(&mut tx).await.unwrap();
    tx.rollback().await.unwrap();
    assert_eq!(db.count("name = 'plain_defaults'").await, 0);

    let delayed = PlainDefaults { n: 1 }
        .with_delay(Duration::from_secs(3600))
        .enqueue(&db.pool)
        .await
        .unwrap();
    let cond = format!(
        "id = {} AND run_at > {} AND run_at < {}",
        delayed.id,
        db.from_now(Duration::from_secs(3500)),
        db.from_now(Duration::from_secs(3700))
    );
    assert_eq!(db.count(&cond).await, 1, "run_at is about an hour ahead");

    let at = chrono::Utc::now() + chrono::Duration::days(2);
    let scheduled = PlainDefaults { n: 2 }
        .with_run_at(at)
        .enqueue(&db.pool)
        .await
        .unwrap();
    let t = row(&db, scheduled.id).await;
    assert!(
        (t.run_at - at).num_milliseconds().abs() <= 1,
        "{} vs {at}",
        t.run_at
    );

    let urgent = PlainDefaults { n: 3 }
        .with_priority(-100)
        .enqueue(&db.pool)
        .await
        .unwrap();
    assert_eq!(row(&db, urgent.id).await.priority, -100);

    let first = PlainDefaults { n: 4 }
        .with_idempotency_key("n-4")
        .enqueue(&db.pool)
        .await
        .unwrap();
    let again = PlainDefaults { n: 4 }
        .with_idempotency_key("n-4")
        .enqueue(&db.pool)
        .await
        .unwrap();
    assert!(!first.duplicate && again.duplicate);
    assert_eq!(first.id, again.id);

    let custom = PlainDefaults { n: 5 }
        .enqueue_options()
        .with_queue("elsewhere")
        .with_max_attempts(2)
        .enqueue(&db.pool)
        .await
        .unwrap();
    let t = row(&db, custom.id).await;
    assert_eq!((t.queue.as_str(), t.max_attempts), ("elsewhere", 2));

    let ttl = PlainDefaults { n: 6 }
        .with_ttl(Duration::from_secs(90))
        .enqueue(&db.pool)
        .await
        .unwrap();
    let t = row(&db, ttl.id).await;
    assert_eq!(
        t.deadline,
        Some(t.created_at + chrono::Duration::seconds(90))
    );
    let until = chrono::DateTime::parse_from_rfc3339("2030-01-01T00:00:00Z")
        .unwrap()
        .with_timezone(&chrono::Utc);
    let deadline = PlainDefaults { n: 7 }
        .with_deadline(until)
        .with_priority(2)
        .enqueue(&db.pool)
        .await
        .unwrap();
    let t = row(&db, deadline.id).await;
    assert_eq!((t.deadline, t.priority), (Some(until), 2));
}

async fn a_task_from_another_module_registers_and_runs_with_its_data<B: TestBackend>(db: Db<B>) {
    let registered = taskq::registry::registered();
    let reg = registered
        .iter()
        .find(|r| r.name() == "charge_invoice")
        .expect("charge_invoice is registered through inventory");
    assert_eq!(reg.queue(), "macro_billing");
    assert!(
        reg.type_name().ends_with("macro_support::ChargeInvoice"),
        "{}",
        reg.type_name()
    );

    let ledger = Ledger::default();
    let ok = ChargeInvoice {
        invoice_id: 7,
        memo: "first".into(),
    }
    .enqueue(&db.pool)
    .await
    .unwrap();
    let failing = ChargeInvoice {
        invoice_id: 8,
        memo: "always fails".into(),
    }
    .enqueue(&db.pool)
    .await
    .unwrap();
    let bad_input = ParseAmount { raw: "12x".into() }
        .enqueue(&db.pool)
        .await
        .unwrap();

    let worker = Running::start(
        taskq::Worker::builder(db.pool.clone())
            .register::<ChargeInvoice>()
            .register::<ParseAmount>()
            .data(ledger.clone()),
    );
    let t = wait_state(&db, ok.id, TaskState::Succeeded).await;
    assert_eq!(t.attempt, 1);
    // A user error converted by `?`/Into is retried until attempts run out.
    let t = wait_state(&db, failing.id, TaskState::Dead).await;
    assert_eq!(t.attempt, 3);
    assert!(
        t.last_error
            .as_deref()
            .unwrap()
            .contains("card declined for invoice 8"),
        "{:?}",
        t.last_error
    );
    // `.permanent()` skips the retries.
    let t = wait_state(&db, bad_input.id, TaskState::Dead).await;
    assert_eq!(t.attempt, 1);
    assert!(
        t.last_error.as_deref().unwrap().contains("invalid digit"),
        "{:?}",
        t.last_error
    );
    worker.stop().await;

    let seen = ledger.0.lock().unwrap().clone();
    assert!(
        seen.contains(&(ok.id.0, 1, 7, "first".to_owned())),
        "{seen:?}"
    );
    let failing_runs: Vec<u32> = seen
        .iter()
        .filter(|(id, ..)| *id == failing.id.0)
        .map(|(_, attempt, ..)| *attempt)
        .collect();
    assert_eq!(failing_runs, [1, 2, 3]);
}

async fn custom_injected_parameters_run<B: TestBackend>(db: Db<B>) {
    let id = PerTenant { n: 1 }.enqueue(&db.pool).await.unwrap().id;
    let worker = Running::start(
        taskq::Worker::builder(db.pool.clone())
            .register::<PerTenant>()
            .data(TenantName("acme".into())),
    );
    wait_state(&db, id, TaskState::Succeeded).await;
    worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_handler_stays_callable_directly() {
    let ledger = Ledger::default();
    let mut data = taskq::context::DataMap::new();
    data.insert(ledger.clone());
    let cx = TaskContext::for_test(99, data);
    let cancel = cx.cancel_signal().clone();
    macro_support::charge_invoice(1, "direct".into(), cx, taskq::Data(ledger.clone()), cancel)
        .await
        .unwrap();
    assert_eq!(ledger.0.lock().unwrap()[0], (99, 1, 1, "direct".to_owned()));

    // And through the Task impl, as a worker would.
    let mut data = taskq::context::DataMap::new();
    data.insert(ledger.clone());
    ChargeInvoice {
        invoice_id: 2,
        memo: "via run".into(),
    }
    .run(TaskContext::for_test(100, data))
    .await
    .unwrap();
    assert_eq!(
        ledger.0.lock().unwrap()[1],
        (100, 1, 2, "via run".to_owned())
    );
}

async fn missing_data_fails_at_start_up<B: TestBackend>(db: Db<B>) {
    let err = taskq::Worker::builder(db.pool.clone())
        .register::<ChargeInvoice>()
        .build()
        .err()
        .expect("build fails without the Ledger data");
    match err {
        Error::MissingData { task, ty } => {
            assert_eq!(task, "charge_invoice");
            assert!(ty.ends_with("macro_support::Ledger"), "{ty}");
        }
        other => panic!("expected MissingData, got {other:?}"),
    }

    let err = taskq::Worker::builder(db.pool.clone())
        .register::<PerTenant>()
        .build()
        .err()
        .expect("build fails without the TenantName data");
    assert!(
        matches!(
            err,
            Error::MissingData {
                task: "per_tenant",
                ..
            }
        ),
        "{err:?}"
    );

    // Tasks without data need none.
    assert!(
        taskq::Worker::builder(db.pool.clone())
            .register::<PlainDefaults>()
            .build()
            .is_ok()
    );
}

async fn duplicate_names_fail_at_start_up_naming_both_types<B: TestBackend>(db: Db<B>) {
    let err = taskq::Worker::builder(db.pool.clone())
        .register_all()
        .build()
        .err()
        .expect("two tasks named macro_tests.same");
    match &err {
        Error::DuplicateTaskName {
            name,
            first,
            second,
        } => {
            assert_eq!(name, "macro_tests.same");
            let mut types = [*first, *second];
            types.sort();
            assert!(types[0].ends_with("clash::FirstSame"), "{types:?}");
            assert!(types[1].ends_with("clash::SecondSame"), "{types:?}");
        }
        other => panic!("expected DuplicateTaskName, got {other:?}"),
    }
    let msg = err.to_string();
    assert!(
        msg.contains("FirstSame") && msg.contains("SecondSame"),
        "{msg}"
    );
    // Silence "never constructed": these exist only to clash.
    let _ = (clash::FirstSame { a: 1 }, clash::SecondSame { b: 2 });
}

taskq_tests::conformance!(
    payload_round_trips_through_json_exactly,
    defaults_and_attributes_land_in_the_row,
    enqueue_helpers_apply_their_options,
    custom_injected_parameters_run,
    missing_data_fails_at_start_up,
    duplicate_names_fail_at_start_up_naming_both_types,
    a_task_from_another_module_registers_and_runs_with_its_data,
);

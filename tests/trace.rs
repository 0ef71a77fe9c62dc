//! Trace context travels from the enqueuing request, through the row, to the handler and the
//! worker's span-link hook. (Log levels are checked in `logs.rs`.)

use std::sync::{Arc, Mutex};
use std::time::Duration;

use taskq::{Client, Task, TaskContext, TaskError, TaskState};
use taskq_tests::{RunningWorker, TestDb, fast_worker, wait_until};

tokio::task_local! {
    /// Stands in for the tracing context of an incoming request.
    static REQUEST_TRACE: String;
}

#[derive(Clone, Default)]
struct Seen(Arc<Mutex<Vec<Option<String>>>>);

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Traced(u32);

impl Task for Traced {
    const NAME: &'static str = "traced";
    async fn run(self, cx: TaskContext) -> Result<(), TaskError> {
        let seen = cx.data::<Seen>().unwrap();
        seen.0
            .lock()
            .unwrap()
            .push(cx.trace_context().map(str::to_owned));
        Ok(())
    }
}

const TP: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trace_context_goes_from_the_request_to_the_handler() {
    let Some(db) = TestDb::new_or_skip().await else {
        return;
    };
    assert!(taskq::settings::set_trace_context_hook(|| REQUEST_TRACE
        .try_with(Clone::clone)
        .ok()));
    // Inside a "traced request", outside one, and with an explicit context.
    let inside = REQUEST_TRACE
        .scope(TP.to_owned(), async {
            Traced(1).enqueue(&db.pool).await.unwrap().id
        })
        .await;
    let outside = Traced(2).enqueue(&db.pool).await.unwrap().id;
    let explicit = Traced(3)
        .enqueue_options()
        .with_trace_context("00-aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa-bbbbbbbbbbbbbbbb-01")
        .enqueue(&db.pool)
        .await
        .unwrap()
        .id;
    let client = Client::new(db.pool.clone());
    assert_eq!(
        client.get(inside).await.unwrap().trace_context.as_deref(),
        Some(TP)
    );
    assert_eq!(client.get(outside).await.unwrap().trace_context, None);

    let seen = Seen::default();
    let links: Arc<Mutex<Vec<String>>> = Arc::default();
    let links2 = links.clone();
    let w = RunningWorker::spawn(
        fast_worker(&db.pool)
            .register::<Traced>()
            .data(seen.clone())
            .trace_link(move |_span, ctx| links2.lock().unwrap().push(ctx.to_owned())),
    );
    wait_until(Duration::from_secs(10), "3 succeeded", || async {
        db.count("state = 'succeeded'").await == 3
    })
    .await;
    w.stop().await;
    let mut handler_saw = seen.0.lock().unwrap().clone();
    handler_saw.sort();
    assert_eq!(
        handler_saw,
        [
            None,
            Some(TP.into()),
            Some("00-aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa-bbbbbbbbbbbbbbbb-01".into())
        ]
    );
    let mut linked = links.lock().unwrap().clone();
    linked.sort();
    assert_eq!(
        linked,
        [
            TP,
            "00-aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa-bbbbbbbbbbbbbbbb-01"
        ]
    );
    assert_eq!(
        client.get(explicit).await.unwrap().state,
        TaskState::Succeeded
    );
}

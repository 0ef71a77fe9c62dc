//! The task: a no-op handler that can record when it started, and a worker running it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use taskq::{Task, TaskContext, TaskError};

use crate::Res;

pub const QUEUE: &str = "bench";
pub const TASK: &str = "bench_noop";
/// Pad so a payload is ~256 bytes of JSON.
const PAD: usize = 233;

#[derive(serde::Serialize, serde::Deserialize)]
pub struct Noop {
    seq: u64,
    pad: String,
}

pub static RECORD: AtomicBool = AtomicBool::new(false);
pub static STARTS: Mutex<Vec<(u64, Instant)>> = Mutex::new(Vec::new());

impl Task for Noop {
    const NAME: &'static str = TASK;
    const QUEUE: &'static str = QUEUE;
    async fn run(self, _cx: TaskContext) -> Result<(), TaskError> {
        if RECORD.load(Ordering::Relaxed) {
            let now = Instant::now();
            STARTS.lock().unwrap().push((self.seq, now));
        }
        Ok(())
    }
}

pub fn noop(seq: u64) -> Noop {
    Noop {
        seq,
        pad: "x".repeat(PAD),
    }
}

/// A running worker for the bench queue.
pub struct Running {
    stop: tokio::sync::oneshot::Sender<()>,
    handle: tokio::task::JoinHandle<taskq::Result<taskq::worker::ShutdownReport>>,
    stats: Arc<taskq::worker::WorkerStats>,
}

pub fn start_worker<DB: taskq::Backend>(pool: &sqlx::Pool<DB>, concurrency: usize) -> Res<Running> {
    let (stop, rx) = tokio::sync::oneshot::channel::<()>();
    let worker = taskq::Worker::builder(pool.clone())
        .register::<Noop>()
        .queue(QUEUE, concurrency)
        .retention(taskq::worker::Retention::disabled())
        .shutdown_signal(async move {
            let _ = rx.await;
        })
        .build()?;
    let stats = worker.stats();
    Ok(Running {
        stop,
        handle: tokio::spawn(worker.run()),
        stats,
    })
}

impl Running {
    pub fn succeeded(&self) -> u64 {
        self.stats.snapshot().succeeded
    }
    pub async fn wait_for(&self, n: u64, timeout: Duration) -> Res<()> {
        let deadline = Instant::now() + timeout;
        while self.succeeded() < n {
            if Instant::now() > deadline {
                return Err(format!(
                    "worker did {} of {n} tasks in {timeout:?}",
                    self.succeeded()
                )
                .into());
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        Ok(())
    }
    pub async fn stop(self) -> Res<taskq::worker::ShutdownReport> {
        let _ = self.stop.send(());
        Ok(self.handle.await??)
    }
}

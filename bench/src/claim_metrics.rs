//! Claim durations from the worker's `taskq_claim_duration_seconds` histogram, through a
//! `metrics` recorder, and their percentiles.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// Claim transaction durations recorded while [`CLAIMS_ON`] is set, in seconds (from the
/// worker's `taskq_claim_duration_seconds` histogram).
pub static CLAIMS: Mutex<Vec<f64>> = Mutex::new(Vec::new());
pub static CLAIMS_ON: AtomicBool = AtomicBool::new(false);

/// A `metrics` recorder that keeps `taskq_claim_duration_seconds` and drops everything else.
pub struct ClaimRecorder;

struct ClaimHistogram;

impl metrics::HistogramFn for ClaimHistogram {
    fn record(&self, value: f64) {
        if CLAIMS_ON.load(Ordering::Relaxed) {
            CLAIMS.lock().unwrap().push(value);
        }
    }
}

impl metrics::Recorder for ClaimRecorder {
    fn describe_counter(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn describe_gauge(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn describe_histogram(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn register_counter(&self, _: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Counter {
        metrics::Counter::noop()
    }
    fn register_gauge(&self, _: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Gauge {
        metrics::Gauge::noop()
    }
    fn register_histogram(
        &self,
        key: &metrics::Key,
        _: &metrics::Metadata<'_>,
    ) -> metrics::Histogram {
        if key.name() == "taskq_claim_duration_seconds" {
            metrics::Histogram::from_arc(Arc::new(ClaimHistogram))
        } else {
            metrics::Histogram::noop()
        }
    }
}

/// p50, p99 and max of `v`, in milliseconds (`v` in seconds).
pub fn percentiles_ms(mut v: Vec<f64>) -> (f64, f64, f64) {
    if v.is_empty() {
        return (0.0, 0.0, 0.0);
    }
    v.sort_by(f64::total_cmp);
    let q = |p: f64| v[((v.len() as f64 - 1.0) * p).round() as usize] * 1000.0;
    (q(0.50), q(0.99), q(1.0))
}

//! Retry policy: capped exponential backoff with jitter.

use std::time::Duration;

/// Delay between failed attempts: `base * 2^(attempt-1)`, capped at `max`, then jittered
/// down by up to `jitter` (a fraction in `0.0..=1.0`) so that tasks failing together do not
/// retry together.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Backoff {
    /// Delay after the first failed attempt.
    pub base: Duration,
    /// Upper bound of any delay.
    pub max: Duration,
    /// Fraction of the delay that is randomised away (0 = none, 1 = full jitter).
    pub jitter: f64,
}

impl Backoff {
    /// The default: 1 s, doubling, capped at 1 h, up to 25% jitter.
    pub const DEFAULT: Backoff =
        Backoff::exponential(Duration::from_secs(1), Duration::from_secs(3600));

    /// Exponential backoff from `base` capped at `max`, with the default 25% jitter.
    pub const fn exponential(base: Duration, max: Duration) -> Self {
        Self {
            base,
            max,
            jitter: 0.25,
        }
    }

    /// The same delay after every failure (no jitter).
    pub const fn constant(delay: Duration) -> Self {
        Self {
            base: delay,
            max: delay,
            jitter: 0.0,
        }
    }

    /// Returns a copy with another jitter fraction (clamped to `0.0..=1.0`; NaN is 0).
    pub const fn with_jitter(mut self, jitter: f64) -> Self {
        self.jitter = if jitter.is_nan() {
            0.0
        } else {
            jitter.clamp(0.0, 1.0)
        };
        self
    }

    /// What is wrong with this backoff, if anything: a `jitter` (a public field, so it can be
    /// set without [`with_jitter`](Self::with_jitter)) that is NaN or outside `0.0..=1.0`.
    /// [`WorkerBuilder::build`](crate::worker::WorkerBuilder::build) refuses a task whose backoff has
    /// one ([`Error::Config`](crate::Error::Config)).
    pub(crate) fn problem(&self) -> Option<String> {
        (!(0.0..=1.0).contains(&self.jitter))
            .then(|| format!("jitter {} is outside 0.0..=1.0", self.jitter))
    }

    /// The un-jittered delay after failed attempt number `attempt` (1-based).
    pub fn nominal(&self, attempt: u32) -> Duration {
        let exp = attempt.saturating_sub(1).min(62);
        let factor = 1u64 << exp;
        let base_ns = self.base.as_nanos().min(u64::MAX as u128) as u64;
        let max_ns = self.max.as_nanos().min(u64::MAX as u128) as u64;
        Duration::from_nanos(base_ns.saturating_mul(factor).min(max_ns))
    }

    /// The delay to use after failed attempt `attempt`, jittered with `unit` in `0.0..1.0`.
    /// Never panics: a jitter or unit out of range (or NaN) counts as the nearest bound (0
    /// for NaN).
    pub fn delay(&self, attempt: u32, unit: f64) -> Duration {
        let unit01 = |x: f64| if x.is_nan() { 0.0 } else { x.clamp(0.0, 1.0) };
        let nominal = self.nominal(attempt);
        nominal.mul_f64(1.0 - unit01(self.jitter) * unit01(unit))
    }

    /// The delay with a random jitter.
    pub fn delay_random(&self, attempt: u32) -> Duration {
        self.delay(attempt, fastrand::f64())
    }
}

impl Default for Backoff {
    fn default() -> Self {
        Self::DEFAULT
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_then_caps() {
        let b = Backoff::exponential(Duration::from_secs(1), Duration::from_secs(10));
        let secs: Vec<u64> = (1..=6).map(|a| b.nominal(a).as_secs()).collect();
        assert_eq!(secs, [1, 2, 4, 8, 10, 10]);
        assert_eq!(b.nominal(1000), Duration::from_secs(10));
    }

    #[test]
    fn jitter_stays_within_bounds() {
        let b = Backoff::DEFAULT;
        assert_eq!(b.delay(3, 0.0), Duration::from_secs(4));
        assert_eq!(b.delay(3, 1.0), Duration::from_secs(3));
        for _ in 0..1000 {
            let d = b.delay_random(3);
            assert!(
                d >= Duration::from_secs(3) && d <= Duration::from_secs(4),
                "{d:?}"
            );
        }
    }

    #[test]
    fn an_invalid_jitter_is_named_and_never_panics() {
        let base = Backoff::exponential(Duration::from_secs(1), Duration::from_secs(8));
        for jitter in [2.0, -0.5, f64::NAN, f64::INFINITY] {
            let b = Backoff { jitter, ..base };
            assert!(b.problem().unwrap().contains("jitter"), "{jitter}");
            for unit in [0.0, 0.5, 1.0, f64::NAN] {
                assert!(
                    b.delay(4, unit) <= Duration::from_secs(8),
                    "{jitter} {unit}"
                );
            }
        }
        assert_eq!(base.with_jitter(f64::NAN).jitter, 0.0);
        assert_eq!(base.with_jitter(7.0).jitter, 1.0);
        assert_eq!(base.problem(), None);
        assert_eq!(Backoff::DEFAULT.problem(), None);
    }

    #[test]
    fn constant_never_varies() {
        let b = Backoff::constant(Duration::from_millis(250));
        assert_eq!(b.delay(1, 0.9), b.delay(7, 0.1));
    }
}

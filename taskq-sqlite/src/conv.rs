//! Conversions between the seam's values and SQLite's: ids and epochs are `INTEGER` (`i64`)
//! here and `u64` on the seam; states are stored as text.

use taskq_driver::state::{ParseStateError, TaskState};

/// A seam id or epoch as SQLite's signed integer.
pub(crate) fn sid(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// Ids as SQLite's signed integers.
pub(crate) fn sids(v: &[u64]) -> Vec<i64> {
    v.iter().map(|&x| sid(x)).collect()
}

/// `(id, epoch)` pairs as SQLite's signed integers.
pub(crate) fn signed(leases: &[(u64, u64)]) -> Vec<(i64, i64)> {
    leases.iter().map(|&(i, e)| (sid(i), sid(e))).collect()
}

/// A stored id or epoch as the seam's.
pub(crate) fn uid(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

/// A stored state.
pub(crate) fn state(s: &str) -> sqlx::Result<TaskState> {
    s.parse()
        .map_err(|e: ParseStateError| sqlx::Error::Decode(e.into()))
}

/// A value as the JSON text a statement binds (batches of ids, leases, rows).
pub(crate) fn json<T: serde::Serialize + ?Sized>(v: &T) -> sqlx::Result<String> {
    serde_json::to_string(v).map_err(|e| sqlx::Error::Encode(Box::new(e)))
}

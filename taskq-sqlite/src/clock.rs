//! The database clock, and the conversions between stored times and `DateTime<Utc>`.
//!
//! Every stored time is INTEGER microseconds since the Unix epoch (UTC), written by SQL from
//! the view `taskq_clock` (see the migration): callers send durations, never their clock.
//! (On SQLite the database clock is the clock of the host running the statement; every
//! process sharing a database file runs on one host.)

use chrono::{DateTime, Utc};
use sqlx::SqliteConnection;

/// A stored time (µs since the Unix epoch) as a `DateTime<Utc>`.
pub(crate) fn time_from_us(us: i64) -> sqlx::Result<DateTime<Utc>> {
    DateTime::from_timestamp_micros(us)
        .ok_or_else(|| sqlx::Error::Decode(format!("stored time out of range: {us} µs").into()))
}

/// A stored time that may be NULL.
pub(crate) fn opt_time(us: Option<i64>) -> sqlx::Result<Option<DateTime<Utc>>> {
    us.map(time_from_us).transpose()
}

/// A `DateTime<Utc>` as stored (µs since the Unix epoch).
pub(crate) fn time_to_us(t: DateTime<Utc>) -> i64 {
    t.timestamp_micros()
}

/// The database clock in microseconds since the Unix epoch (millisecond resolution).
pub(crate) async fn db_clock_us(conn: &mut SqliteConnection) -> sqlx::Result<i64> {
    sqlx::query_scalar!(r#"SELECT us AS "us!: i64" FROM taskq_clock"#)
        .fetch_one(conn)
        .await
}

/// The database clock, against which every stored time is written.
pub(crate) async fn db_now(conn: &mut SqliteConnection) -> sqlx::Result<DateTime<Utc>> {
    time_from_us(db_clock_us(conn).await?)
}

//! The database clock (`UTC_TIMESTAMP(6)`), against which every stored time is written.

use chrono::{DateTime, Utc};
use sqlx::MySqlConnection;
use taskq_driver::driver::Clock;

use crate::MySqlDriver;

/// The database clock in microseconds since the Unix epoch (no time zone involved), for the
/// window of a unique task.
pub async fn db_clock_us(conn: &mut MySqlConnection) -> sqlx::Result<i64> {
    sqlx::query_scalar!(
        r#"SELECT TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) AS "us!: i64""#
    )
    .fetch_one(conn)
    .await
}

impl Clock for MySqlDriver {
    /// The database clock (`UTC_TIMESTAMP(6)`), against which every stored time is written.
    async fn db_now(&self) -> sqlx::Result<DateTime<Utc>> {
        sqlx::query_scalar!(r#"SELECT UTC_TIMESTAMP(6) AS "now!: DateTime<Utc>""#)
            .fetch_one(&self.pool)
            .await
    }

    /// The database clock, read on `conn`.
    async fn db_now_on(&self, conn: &mut MySqlConnection) -> sqlx::Result<DateTime<Utc>> {
        sqlx::query_scalar!(r#"SELECT UTC_TIMESTAMP(6) AS "now!: DateTime<Utc>""#)
            .fetch_one(&mut *conn)
            .await
    }
}

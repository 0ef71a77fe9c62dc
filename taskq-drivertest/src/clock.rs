//! The database clock (`Clock`, `Enqueue::db_clock_us`) and the statement budget.

use taskq_driver::budget::STATEMENT_BYTES;
use taskq_driver::driver::Driver;

use crate::support::*;

/// `db_now`, `db_now_on` and `db_clock_us` read one clock: read in turn, each is at or after
/// the one before, and all within a few seconds.
pub async fn the_database_clock_reads_the_same_through_every_call<D: Driver>(d: D) {
    let mut c = conn(&d).await;
    let t1 = D::db_clock_us(&mut c).await.expect("db_clock_us");
    let n1 = d.db_now().await.expect("db_now").timestamp_micros();
    let n2 = d
        .db_now_on(&mut c)
        .await
        .expect("db_now_on")
        .timestamp_micros();
    let t2 = D::db_clock_us(&mut c).await.expect("db_clock_us");
    assert!(
        t1 <= n1 && n1 <= n2 && n2 <= t2,
        "{}: {t1} <= {n1} <= {n2} <= {t2}",
        backend::<D>()
    );
    assert!(t2 - t1 < 10_000_000, "{} µs apart", t2 - t1);
    // A task inserted between two reads is created between them.
    let a = insert::<D>(&mut c, task("q", "a")).await;
    let t3 = D::db_clock_us(&mut c).await.expect("db_clock_us");
    let created = get(&d, a).await.created_at.timestamp_micros();
    assert!(t2 <= created && created <= t3, "{t2} <= {created} <= {t3}");
}

/// The statement budget is usable: a statement carries at most `STATEMENT_BYTES` of rows,
/// and a row that fits a statement can be sent.
pub async fn the_statement_budget_fits_a_statement<D: Driver>(d: D) {
    let mut c = conn(&d).await;
    let b = d.statement_budget(&mut c).await.expect("statement_budget");
    assert!(
        0 < b.statement && b.statement <= STATEMENT_BYTES,
        "{}: {b:?}",
        backend::<D>()
    );
    assert!(b.row >= b.statement, "{b:?}");
}

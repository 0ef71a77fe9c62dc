//! Recurring (cron) schedules (`taskq_schedules`): one row per schedule name, declared by the
//! workers that carry the schedule and advanced by compare-and-set, so each tick is enqueued
//! once however many workers run.

use sqlx::SqliteConnection;
use taskq_driver::read::ScheduleInfo;
use taskq_driver::rows::{Inserted, NameList, ScheduleDecl, ScheduleFire, ScheduleState};
use taskq_driver::state::TaskId;

use crate::clock::{opt_time, time_from_us, time_to_us};
use crate::connect::begin_write;
use crate::enqueue::task_insert;

/// Creates or updates a schedule's row with this worker's definition. A new row, or one whose
/// expression or time zone differs, gets `watermark = now` (never moved back) and the given
/// `next_tick`, so ticks before this deploy never fire; an unchanged one keeps its watermark
/// and next tick. (In SQLite's upsert every assignment reads the old row, so the comparisons
/// see the old expression and time zone.)
pub(crate) async fn schedule_declare(
    conn: &mut SqliteConnection,
    d: &ScheduleDecl<'_>,
) -> sqlx::Result<()> {
    let next_tick = d.next_tick.map(time_to_us);
    sqlx::query!(
        r#"INSERT INTO taskq_schedules
             (name, task_name, queue, expression, timezone, missed_ticks, watermark, next_tick,
              declared_at, created_at, updated_at)
           SELECT ?1, ?2, ?3, ?4, ?5, ?6, c.us, ?7, c.us, c.us, c.us
           FROM taskq_clock AS c WHERE true
           ON CONFLICT (name) DO UPDATE
             SET watermark = CASE WHEN expression = excluded.expression
                                   AND timezone = excluded.timezone THEN watermark
                                  ELSE MAX(watermark, excluded.watermark) END,
                 next_tick = CASE WHEN expression = excluded.expression
                                   AND timezone = excluded.timezone THEN next_tick
                                  ELSE excluded.next_tick END,
                 expression = excluded.expression, timezone = excluded.timezone,
                 task_name = excluded.task_name, queue = excluded.queue,
                 missed_ticks = excluded.missed_ticks,
                 declared_at = excluded.declared_at, updated_at = excluded.updated_at"#,
        d.name,
        d.task_name,
        d.queue,
        d.expression,
        d.timezone,
        d.missed_ticks,
        next_tick,
    )
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// The database clock and the rows of the schedules named in `names`.
pub(crate) async fn schedule_states(
    conn: &mut SqliteConnection,
    names: &NameList,
) -> sqlx::Result<Vec<ScheduleState>> {
    let json = names.json();
    let rows = sqlx::query!(
        r#"SELECT (SELECT us FROM taskq_clock) AS "now!: i64", name AS "name!: String",
             expression AS "expression!: String", timezone AS "timezone!: String",
             watermark AS "watermark!: i64"
           FROM taskq_schedules WHERE name IN (SELECT value FROM json_each(?1))
           ORDER BY name"#,
        json
    )
    .fetch_all(&mut *conn)
    .await?;
    rows.into_iter()
        .map(|r| {
            Ok(ScheduleState {
                now: time_from_us(r.now)?,
                name: r.name,
                expression: r.expression,
                timezone: r.timezone,
                watermark: time_from_us(r.watermark)?,
            })
        })
        .collect()
}

/// One step of a schedule, in one transaction: moves the watermark from `old_watermark` to
/// `new_watermark` — only if the row still has `old_watermark` and this worker's expression
/// and time zone — and inserts the tasks of the ticks in between. Returns the task ids (new or
/// the existing holder of a tick's key), or `None` when the compare-and-set found the row
/// changed (another worker took the step, or declared another definition): then nothing is
/// written.
pub(crate) async fn schedule_fire(
    conn: &mut SqliteConnection,
    f: &ScheduleFire<'_>,
) -> sqlx::Result<Option<Vec<TaskId>>> {
    let last_tick = f.tasks.last().and_then(|t| t.run_at).map(time_to_us);
    let worker_id = (!f.tasks.is_empty()).then_some(f.worker_id);
    let new_watermark = time_to_us(f.new_watermark);
    let next_tick = f.next_tick.map(time_to_us);
    let old_watermark = time_to_us(f.old_watermark);
    let mut tx = begin_write(conn).await?;
    let moved = sqlx::query!(
        r#"UPDATE taskq_schedules AS s
           SET watermark = ?1, next_tick = ?2, last_tick = COALESCE(?3, s.last_tick),
               last_worker_id = COALESCE(?4, s.last_worker_id), updated_at = c.us
           FROM taskq_clock AS c
           WHERE s.name = ?5 AND s.watermark = ?6 AND s.expression = ?7 AND s.timezone = ?8"#,
        new_watermark,
        next_tick,
        last_tick,
        worker_id,
        f.name,
        old_watermark,
        f.expression,
        f.timezone,
    )
    .execute(&mut *tx)
    .await?;
    if moved.rows_affected() != 1 {
        tx.rollback().await?;
        return Ok(None);
    }
    let mut ids = Vec::with_capacity(f.tasks.len());
    for t in &f.tasks {
        ids.push(match task_insert(&mut tx, t).await? {
            Inserted::New(id) | Inserted::Duplicate(id) => id,
        });
    }
    tx.commit().await?;
    Ok(Some(ids))
}

/// Every schedule row, by name.
pub(crate) async fn schedule_list(conn: &mut SqliteConnection) -> sqlx::Result<Vec<ScheduleInfo>> {
    let rows = sqlx::query!(
        r#"SELECT name AS "name!: String", task_name AS "task_name!: String",
             queue AS "queue!: String", expression AS "expression!: String",
             timezone AS "timezone!: String", missed_ticks AS "missed_ticks!: String",
             watermark AS "watermark!: i64", last_tick AS "last_tick?: i64",
             last_worker_id AS "last_worker_id?: String", next_tick AS "next_tick?: i64",
             declared_at AS "declared_at!: i64", created_at AS "created_at!: i64",
             updated_at AS "updated_at!: i64"
           FROM taskq_schedules ORDER BY name"#
    )
    .fetch_all(&mut *conn)
    .await?;
    rows.into_iter()
        .map(|r| {
            Ok(ScheduleInfo {
                name: r.name,
                task_name: r.task_name,
                queue: r.queue,
                expression: r.expression,
                timezone: r.timezone,
                missed_ticks: r.missed_ticks,
                watermark: time_from_us(r.watermark)?,
                last_tick: opt_time(r.last_tick)?,
                last_worker_id: r.last_worker_id,
                next_tick: opt_time(r.next_tick)?,
                declared_at: time_from_us(r.declared_at)?,
                created_at: time_from_us(r.created_at)?,
                updated_at: time_from_us(r.updated_at)?,
            })
        })
        .collect()
}

/// Deletes a schedule's row; returns whether it existed.
pub(crate) async fn schedule_delete(conn: &mut SqliteConnection, name: &str) -> sqlx::Result<bool> {
    let done = sqlx::query!("DELETE FROM taskq_schedules WHERE name = ?1", name)
        .execute(&mut *conn)
        .await?;
    Ok(done.rows_affected() == 1)
}

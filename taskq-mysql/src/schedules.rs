//! Recurring schedules (`taskq_schedules`): declare, read, fire (a compare-and-set of the
//! watermark plus the ticks' tasks), list, delete.

use chrono::{DateTime, Utc};
use sqlx::{Connection, MySqlConnection};
use taskq_driver::driver::Schedules;

use crate::MySqlDriver;
use crate::enqueue::task_insert;
use taskq_driver::read::ScheduleInfo;
use taskq_driver::rows::{Inserted, NameList, ScheduleDecl, ScheduleFire, ScheduleState};
use taskq_driver::state::TaskId;

impl Schedules for MySqlDriver {
    /// Creates or updates a schedule's row with this worker's definition. A new row, or one
    /// whose expression or time zone differs, gets `watermark = now` (so ticks before this
    /// deploy never fire) and the given `next_tick`; an unchanged one keeps its watermark.
    /// The assignments run in order and read the old row until they overwrite a column, so
    /// `watermark` and `next_tick` compare against the old expression and time zone.
    async fn schedule_declare(
        &self,
        conn: &mut MySqlConnection,
        d: &ScheduleDecl<'_>,
    ) -> sqlx::Result<()> {
        let next_tick = d.next_tick.map(|t| t.naive_utc());
        sqlx::query!(
            r#"INSERT INTO taskq_schedules
                 (name, task_name, queue, expression, timezone, missed_ticks, watermark, next_tick,
                  declared_at, created_at, updated_at)
               VALUES (?, ?, ?, ?, ?, ?, UTC_TIMESTAMP(6), ?,
                  UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))
               ON DUPLICATE KEY UPDATE
                 watermark = IF(expression = ? AND timezone = ?, watermark,
                                GREATEST(watermark, UTC_TIMESTAMP(6))),
                 next_tick = IF(expression = ? AND timezone = ?, next_tick, ?),
                 expression = ?, timezone = ?, task_name = ?, queue = ?, missed_ticks = ?,
                 declared_at = UTC_TIMESTAMP(6), updated_at = UTC_TIMESTAMP(6)"#,
            d.name,
            d.task_name,
            d.queue,
            d.expression,
            d.timezone,
            d.missed_ticks,
            next_tick,
            d.expression,
            d.timezone,
            d.expression,
            d.timezone,
            next_tick,
            d.expression,
            d.timezone,
            d.task_name,
            d.queue,
            d.missed_ticks,
        )
        .execute(&mut *conn)
        .await?;
        Ok(())
    }

    /// The database clock and the rows of the schedules named in `names`: one plain read of the (small) schedules table.
    async fn schedule_states(
        &self,
        conn: &mut MySqlConnection,
        names: &NameList,
    ) -> sqlx::Result<Vec<ScheduleState>> {
        let names_json = names.json();
        sqlx::query_as!(
            ScheduleState,
            r#"SELECT UTC_TIMESTAMP(6) AS "now!: DateTime<Utc>", name, expression, timezone,
                 watermark AS "watermark: DateTime<Utc>"
               FROM taskq_schedules
               WHERE JSON_CONTAINS(?, JSON_QUOTE(name))"#,
            names_json
        )
        .fetch_all(&mut *conn)
        .await
    }

    /// One step of a schedule, in one transaction: moves the watermark from `old_watermark`
    /// to `new_watermark` — only if the row still has `old_watermark` and this worker's
    /// expression and time zone — and inserts the tasks of the ticks in between. Returns the
    /// task ids, or `None` when the compare-and-set found the row changed (another worker took
    /// the step, or declared another definition): then nothing is written.
    ///
    /// Workers that race for the same step queue on the row lock of the `UPDATE`; the first
    /// moves the watermark, the others re-read the committed row and match nothing. So each
    /// tick is enqueued once however many workers run, and an old tick never fires again even
    /// after retention deleted its task (the idempotency key `cron:<name>:<tick>` guards the
    /// row as well while it is kept).
    async fn schedule_fire(
        &self,
        conn: &mut MySqlConnection,
        f: &ScheduleFire<'_>,
    ) -> sqlx::Result<Option<Vec<TaskId>>> {
        let mut tx = conn.begin().await?;
        let last_tick = f.tasks.last().and_then(|t| t.run_at).map(|t| t.naive_utc());
        let worker_id = (!f.tasks.is_empty()).then_some(f.worker_id);
        let moved = sqlx::query!(
            r#"UPDATE taskq_schedules
               SET watermark = ?, next_tick = ?, last_tick = COALESCE(?, last_tick),
                   last_worker_id = COALESCE(?, last_worker_id), updated_at = UTC_TIMESTAMP(6)
               WHERE name = ? AND watermark = ? AND expression = ? AND timezone = ?"#,
            f.new_watermark.naive_utc(),
            f.next_tick.map(|t| t.naive_utc()),
            last_tick,
            worker_id,
            f.name,
            f.old_watermark.naive_utc(),
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
    async fn schedule_list(&self) -> sqlx::Result<Vec<ScheduleInfo>> {
        sqlx::query_as!(
            ScheduleInfo,
            r#"SELECT name, task_name, queue, expression, timezone, missed_ticks,
                 watermark AS "watermark: DateTime<Utc>", last_tick AS "last_tick: DateTime<Utc>",
                 last_worker_id, next_tick AS "next_tick: DateTime<Utc>",
                 declared_at AS "declared_at: DateTime<Utc>", created_at AS "created_at: DateTime<Utc>",
                 updated_at AS "updated_at: DateTime<Utc>"
               FROM taskq_schedules ORDER BY name"#
        )
        .fetch_all(&self.pool)
        .await
    }

    /// Deletes a schedule's row; returns whether it existed.
    async fn schedule_delete(&self, conn: &mut MySqlConnection, name: &str) -> sqlx::Result<bool> {
        let done = sqlx::query!("DELETE FROM taskq_schedules WHERE name = ?", name)
            .execute(&mut *conn)
            .await?;
        Ok(done.rows_affected() == 1)
    }
}

//! Workflows (`taskq_workflows`, `taskq_workflow_steps`, `taskq_workflow_deps`): the insert of a
//! workflow on the caller's connection, the settle that lets the steps after an ended step go
//! on (in the worker's write-back transaction, or on its own for the reaper's sweep), reads,
//! and cancel. What an end does to a step after it is `taskq_driver::rules::workflow`'s.

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, NaiveDateTime, Utc};
use serde::Serialize;
use sqlx::{Connection, MySqlConnection};

use crate::MySqlDriver;
use crate::enqueue::task_insert_rows;
use taskq_driver::driver::Workflows;
use taskq_driver::rows::{
    NewTask, NewWorkflow, Settled, StepOutput, WorkflowCanceled, WorkflowInserted, WorkflowRow,
    WorkflowStepRow,
};
use taskq_driver::rules::workflow::{
    CANCELED_BY_DEPENDENCY, DependencyEnd, StepCounts, dependency_end,
};
use taskq_driver::state::{TaskId, TaskState};

/// Inserts a workflow and its steps in a savepoint of the caller's transaction (a transaction
/// of its own outside one): the workflow row, the steps' tasks (one multi-row batch), their
/// workflow and state (`waiting` for a step that runs after another), the step rows and the
/// edges. Five statements, or six with edges, and those of the batch insert.
pub async fn workflow_insert(
    conn: &mut MySqlConnection,
    wf: &NewWorkflow<'_>,
) -> sqlx::Result<WorkflowInserted> {
    let mut tx = conn.begin().await?;
    let id = sqlx::query!(
        "INSERT INTO taskq_workflows (name, created_at) VALUES (?, UTC_TIMESTAMP(6))",
        wf.name
    )
    .execute(&mut *tx)
    .await?
    .last_insert_id();
    let rows: Vec<NewTask<'_>> = wf.steps.iter().map(|s| s.task).collect();
    let task_ids = task_insert_rows(&mut tx, &rows).await?;
    let states: Vec<(u64, bool)> = wf
        .steps
        .iter()
        .zip(&task_ids)
        .map(|(s, t)| (t.0, !s.after.is_empty()))
        .collect();
    sqlx::query!(
        r#"UPDATE JSON_TABLE(?, '$[*]' COLUMNS (id BIGINT UNSIGNED PATH '$[0]',
                                             waits TINYINT PATH '$[1]')) AS j
             STRAIGHT_JOIN taskq_tasks t FORCE INDEX (PRIMARY) ON t.id = j.id
           SET t.workflow_id = ?, t.state = IF(j.waits, 'waiting', 'pending')"#,
        json(&states)?,
        id
    )
    .execute(&mut *tx)
    .await?;
    #[derive(Serialize)]
    struct StepJson<'a>(u64, u32, &'a str, usize, bool);
    let steps: Vec<StepJson<'_>> = wf
        .steps
        .iter()
        .zip(&task_ids)
        .enumerate()
        .map(|(i, (s, t))| StepJson(t.0, i as u32, s.step, s.after.len(), s.runs_after_failure))
        .collect();
    sqlx::query!(
        r#"INSERT INTO taskq_workflow_steps
             (task_id, workflow_id, seq, step, deps_left, runs_after_failure)
           SELECT j.task_id, ?, j.seq, j.step, j.deps, j.raf
           FROM JSON_TABLE(?, '$[*]' COLUMNS (task_id BIGINT UNSIGNED PATH '$[0]',
                                             seq INT UNSIGNED PATH '$[1]',
                                             step VARCHAR(255) PATH '$[2]',
                                             deps INT PATH '$[3]',
                                             raf TINYINT PATH '$[4]')) AS j"#,
        id,
        json(&steps)?
    )
    .execute(&mut *tx)
    .await?;
    let ids = &task_ids;
    let edges: Vec<(u64, u64)> = wf
        .steps
        .iter()
        .zip(ids)
        .flat_map(|(s, t)| s.after.iter().map(move |&d| (ids[d].0, t.0)))
        .collect();
    if !edges.is_empty() {
        sqlx::query!(
            r#"INSERT INTO taskq_workflow_deps (dep_task_id, task_id)
               SELECT j.dep, j.step
               FROM JSON_TABLE(?, '$[*]' COLUMNS (dep BIGINT UNSIGNED PATH '$[0]',
                                                 step BIGINT UNSIGNED PATH '$[1]')) AS j"#,
            json(&edges)?
        )
        .execute(&mut *tx)
        .await?;
    }
    tx.commit().await?;
    Ok(WorkflowInserted { id, task_ids })
}

fn json<T: Serialize>(v: &T) -> sqlx::Result<String> {
    serde_json::to_string(v).map_err(|e| sqlx::Error::Encode(Box::new(e)))
}

fn state_of(s: Option<&str>) -> sqlx::Result<TaskState> {
    // A dependency whose task was deleted has ended for the steps after it, as if canceled.
    let Some(s) = s else {
        return Ok(TaskState::Canceled);
    };
    s.parse::<TaskState>()
        .map_err(|e| sqlx::Error::Decode(Box::new(e)))
}

/// One edge the settle reads, locked, with both ends' states.
struct EdgeRow {
    dep_task_id: u64,
    task_id: u64,
    settled: bool,
    dep_state: Option<String>,
    step_state: Option<String>,
    queue: Option<String>,
    deps_left: i32,
    runs_after_failure: bool,
    canceled_by_dep: bool,
}

/// Settles the ended steps among `ended` on `conn` (inside the caller's transaction): rounds of
/// one locking read of their edges (unsettled ones; in the first round also the settled ones
/// to a step canceled by a dependency, which a success of that dependency after an operator's
/// retry brings back) and the writes that apply them, until no step is canceled or brought back.
pub(crate) async fn settle(conn: &mut MySqlConnection, ended: &[u64]) -> sqlx::Result<Settled> {
    let mut out = Settled::default();
    let mut frontier: Vec<u64> = ended.to_vec();
    let mut first = true;
    while !frontier.is_empty() {
        frontier.sort_unstable();
        frontier.dedup();
        let rows = sqlx::query_as!(
            EdgeRow,
            r#"SELECT e.dep_task_id AS "dep_task_id: u64", e.task_id AS "task_id: u64",
                 e.settled AS "settled: bool", d.state AS "dep_state: String",
                 t.state AS "step_state: String", t.queue AS "queue: String", s.deps_left,
                 s.runs_after_failure AS "runs_after_failure: bool",
                 s.canceled_by_dep AS "canceled_by_dep: bool"
               FROM JSON_TABLE(?, '$[*]' COLUMNS (id BIGINT UNSIGNED PATH '$')) AS j
                 STRAIGHT_JOIN taskq_workflow_deps e FORCE INDEX (PRIMARY) ON e.dep_task_id = j.id
                 STRAIGHT_JOIN taskq_workflow_steps s FORCE INDEX (PRIMARY) ON s.task_id = e.task_id
                 LEFT JOIN taskq_tasks t FORCE INDEX (PRIMARY) ON t.id = e.task_id
                 LEFT JOIN taskq_tasks d FORCE INDEX (PRIMARY) ON d.id = e.dep_task_id
               WHERE e.settled = 0 OR (? AND s.canceled_by_dep = 1)
               ORDER BY e.task_id, e.dep_task_id
               FOR UPDATE"#,
            json(&frontier)?,
            first
        )
        .fetch_all(&mut *conn)
        .await?;
        let mut pairs: Vec<(u64, u64)> = Vec::new();
        let mut counts: BTreeMap<u64, (i32, i32)> = BTreeMap::new();
        let mut cancels: BTreeSet<u64> = BTreeSet::new();
        let mut revive: BTreeSet<u64> = BTreeSet::new();
        let mut queues: BTreeMap<u64, String> = BTreeMap::new();
        for r in rows {
            let dep = state_of(r.dep_state.as_deref())?;
            // A step whose task was deleted: the edge is settled, to no effect.
            let Some(step_state) = r.step_state.as_deref() else {
                if !r.settled {
                    pairs.push((r.dep_task_id, r.task_id));
                }
                continue;
            };
            let step = state_of(Some(step_state))?;
            if r.settled {
                // A step canceled by its dependencies, after one of them succeeded: its
                // retry by an operator worked, so the step waits again for its dependencies.
                if dep == TaskState::Succeeded && step == TaskState::Canceled && r.canceled_by_dep {
                    revive.insert(r.task_id);
                }
                continue;
            }
            let Some(effect) = dependency_end(dep, r.runs_after_failure) else {
                continue;
            };
            pairs.push((r.dep_task_id, r.task_id));
            match effect {
                DependencyEnd::Counts => {
                    let c = counts.entry(r.task_id).or_insert((r.deps_left, 0));
                    c.1 += 1;
                    if step == TaskState::Waiting {
                        queues.insert(r.task_id, r.queue.unwrap_or_default());
                    }
                }
                DependencyEnd::Cancels if step == TaskState::Waiting => {
                    cancels.insert(r.task_id);
                }
                DependencyEnd::Cancels => {}
            }
        }
        if !pairs.is_empty() {
            sqlx::query!(
                r#"UPDATE JSON_TABLE(?, '$[*]' COLUMNS (dep BIGINT UNSIGNED PATH '$[0]',
                                                     step BIGINT UNSIGNED PATH '$[1]')) AS j
                     STRAIGHT_JOIN taskq_workflow_deps e FORCE INDEX (PRIMARY)
                       ON e.dep_task_id = j.dep AND e.task_id = j.step
                   SET e.settled = 1"#,
                json(&pairs)?
            )
            .execute(&mut *conn)
            .await?;
        }
        let dec: Vec<(u64, i32)> = counts.iter().map(|(id, (_, n))| (*id, *n)).collect();
        if !dec.is_empty() {
            sqlx::query!(
                r#"UPDATE JSON_TABLE(?, '$[*]' COLUMNS (id BIGINT UNSIGNED PATH '$[0]',
                                                     n INT PATH '$[1]')) AS j
                     STRAIGHT_JOIN taskq_workflow_steps s FORCE INDEX (PRIMARY) ON s.task_id = j.id
                   SET s.deps_left = s.deps_left - j.n"#,
                json(&dec)?
            )
            .execute(&mut *conn)
            .await?;
        }
        let cancel: Vec<u64> = cancels.iter().copied().collect();
        if !cancel.is_empty() {
            let ids = json(&cancel)?;
            sqlx::query!(
                r#"UPDATE JSON_TABLE(?, '$[*]' COLUMNS (id BIGINT UNSIGNED PATH '$')) AS j
                     STRAIGHT_JOIN taskq_tasks t FORCE INDEX (PRIMARY) ON t.id = j.id
                     STRAIGHT_JOIN taskq_workflow_steps s FORCE INDEX (PRIMARY) ON s.task_id = j.id
                   SET t.state = 'canceled', t.finished_at = UTC_TIMESTAMP(6),
                       t.updated_at = UTC_TIMESTAMP(6), t.last_error = ?, s.canceled_by_dep = 1
                   WHERE t.state = 'waiting'"#,
                ids,
                CANCELED_BY_DEPENDENCY
            )
            .execute(&mut *conn)
            .await?;
        }
        let release: Vec<u64> = counts
            .iter()
            .filter(|(id, (left, n))| {
                left - n <= 0 && queues.contains_key(id) && !cancels.contains(id)
            })
            .map(|(id, _)| *id)
            .collect();
        if !release.is_empty() {
            sqlx::query!(
                r#"UPDATE JSON_TABLE(?, '$[*]' COLUMNS (id BIGINT UNSIGNED PATH '$')) AS j
                     STRAIGHT_JOIN taskq_tasks t FORCE INDEX (PRIMARY) ON t.id = j.id
                   SET t.state = 'pending', t.run_at = GREATEST(t.run_at, UTC_TIMESTAMP(6)),
                       t.updated_at = UTC_TIMESTAMP(6)
                   WHERE t.state = 'waiting'"#,
                json(&release)?
            )
            .execute(&mut *conn)
            .await?;
            for id in release {
                let q = queues.remove(&id).unwrap_or_default();
                out.released.push((TaskId(id), q));
            }
        }
        out.edges += pairs.len() as u64;
        out.canceled.extend(cancel.iter().map(|id| TaskId(*id)));
        frontier = cancel;
        if !revive.is_empty() {
            frontier.extend(revive_steps(conn, &revive.into_iter().collect::<Vec<_>>()).await?);
        }
        first = false;
    }
    Ok(out)
}

/// Brings back steps canceled by their dependencies: `waiting` again, every edge to them
/// unsettled and `deps_left` their number; returns their dependencies, which the settle's next
/// round applies again (a success counts, a dependency still failed cancels the step again).
async fn revive_steps(conn: &mut MySqlConnection, ids: &[u64]) -> sqlx::Result<Vec<u64>> {
    let ids = json(&ids)?;
    sqlx::query!(
        r#"UPDATE JSON_TABLE(?, '$[*]' COLUMNS (id BIGINT UNSIGNED PATH '$')) AS j
             STRAIGHT_JOIN taskq_tasks t FORCE INDEX (PRIMARY) ON t.id = j.id
             STRAIGHT_JOIN taskq_workflow_steps s FORCE INDEX (PRIMARY) ON s.task_id = j.id
           SET t.state = 'waiting', t.finished_at = NULL, t.last_error = NULL,
               t.updated_at = UTC_TIMESTAMP(6), s.canceled_by_dep = 0,
               s.deps_left = (SELECT COUNT(*) FROM taskq_workflow_deps e WHERE e.task_id = s.task_id)
           WHERE t.state = 'canceled' AND s.canceled_by_dep = 1"#,
        ids
    )
    .execute(&mut *conn)
    .await?;
    sqlx::query!(
        r#"UPDATE JSON_TABLE(?, '$[*]' COLUMNS (id BIGINT UNSIGNED PATH '$')) AS j
             STRAIGHT_JOIN taskq_workflow_deps e FORCE INDEX (ix_taskq_workflow_step_deps)
               ON e.task_id = j.id
           SET e.settled = 0"#,
        ids
    )
    .execute(&mut *conn)
    .await?;
    sqlx::query_scalar!(
        r#"SELECT e.dep_task_id AS "id: u64"
           FROM JSON_TABLE(?, '$[*]' COLUMNS (id BIGINT UNSIGNED PATH '$')) AS j
             STRAIGHT_JOIN taskq_workflow_deps e FORCE INDEX (ix_taskq_workflow_step_deps)
               ON e.task_id = j.id"#,
        ids
    )
    .fetch_all(&mut *conn)
    .await
}

struct WorkflowHead {
    id: u64,
    name: String,
    created_at: NaiveDateTime,
    canceled_at: Option<NaiveDateTime>,
}

fn utc(t: NaiveDateTime) -> DateTime<Utc> {
    t.and_utc()
}

/// Per workflow of `ids`, its steps per state.
async fn step_counts(d: &MySqlDriver, ids: &[u64]) -> sqlx::Result<BTreeMap<u64, StepCounts>> {
    let rows = sqlx::query!(
        r#"SELECT s.workflow_id AS "workflow_id: u64", t.state AS "state: String",
             COUNT(*) AS "n!: i64"
           FROM JSON_TABLE(?, '$[*]' COLUMNS (id BIGINT UNSIGNED PATH '$')) AS j
             STRAIGHT_JOIN taskq_workflow_steps s FORCE INDEX (ix_taskq_workflow_seq)
               ON s.workflow_id = j.id
             STRAIGHT_JOIN taskq_tasks t FORCE INDEX (PRIMARY) ON t.id = s.task_id
           GROUP BY s.workflow_id, t.state"#,
        json(&ids)?
    )
    .fetch_all(&d.pool)
    .await?;
    let mut out: BTreeMap<u64, StepCounts> = BTreeMap::new();
    for r in rows {
        out.entry(r.workflow_id)
            .or_default()
            .add(state_of(Some(&r.state))?, r.n as u64);
    }
    Ok(out)
}

async fn with_counts(d: &MySqlDriver, heads: Vec<WorkflowHead>) -> sqlx::Result<Vec<WorkflowRow>> {
    let ids: Vec<u64> = heads.iter().map(|h| h.id).collect();
    let mut counts = step_counts(d, &ids).await?;
    Ok(heads
        .into_iter()
        .map(|h| WorkflowRow {
            counts: counts.remove(&h.id).unwrap_or_default(),
            id: h.id,
            name: h.name,
            created_at: utc(h.created_at),
            canceled_at: h.canceled_at.map(utc),
        })
        .collect())
}

impl Workflows for MySqlDriver {
    /// Reads up to `limit` ended (or deleted) dependencies with an unsettled edge through
    /// `ix_taskq_workflow_unsettled` (the edges of steps not yet ended: the active workflows'),
    /// then settles them in one transaction.
    async fn workflow_settle_stranded(
        &self,
        conn: &mut MySqlConnection,
        limit: u32,
    ) -> sqlx::Result<Settled> {
        let ids = sqlx::query_scalar!(
            r#"SELECT DISTINCT e.dep_task_id AS "id: u64"
               FROM taskq_workflow_deps e FORCE INDEX (ix_taskq_workflow_unsettled)
                 LEFT JOIN taskq_tasks d FORCE INDEX (PRIMARY) ON d.id = e.dep_task_id
               WHERE e.settled = 0
                 AND (d.id IS NULL OR d.state IN ('succeeded', 'dead', 'canceled', 'expired'))
               LIMIT ?"#,
            limit
        )
        .fetch_all(&mut *conn)
        .await?;
        if ids.is_empty() {
            return Ok(Settled::default());
        }
        let mut tx = conn.begin().await?;
        let out = settle(&mut tx, &ids).await?;
        tx.commit().await?;
        Ok(out)
    }

    async fn workflow_get(&self, id: u64) -> sqlx::Result<Option<WorkflowRow>> {
        let head = sqlx::query_as!(
            WorkflowHead,
            r#"SELECT id AS "id: u64", name, created_at AS "created_at: NaiveDateTime",
                 canceled_at AS "canceled_at: NaiveDateTime"
               FROM taskq_workflows WHERE id = ?"#,
            id
        )
        .fetch_optional(&self.pool)
        .await?;
        match head {
            Some(h) => Ok(with_counts(self, vec![h]).await?.pop()),
            None => Ok(None),
        }
    }

    async fn workflow_steps(&self, id: u64) -> sqlx::Result<Vec<WorkflowStepRow>> {
        let steps = sqlx::query!(
            r#"SELECT s.step, s.task_id AS "task_id: u64", t.name, t.queue,
                 t.state AS "state: String",
                 s.runs_after_failure AS "runs_after_failure: bool",
                 s.canceled_by_dep AS "canceled_by_dep: bool", t.output
               FROM taskq_workflow_steps s FORCE INDEX (ix_taskq_workflow_seq)
                 STRAIGHT_JOIN taskq_tasks t FORCE INDEX (PRIMARY) ON t.id = s.task_id
               WHERE s.workflow_id = ?
               ORDER BY s.seq"#,
            id
        )
        .fetch_all(&self.pool)
        .await?;
        let edges = sqlx::query!(
            r#"SELECT e.task_id AS "task_id: u64", ds.step AS "dep_step"
               FROM taskq_workflow_steps s FORCE INDEX (ix_taskq_workflow_seq)
                 STRAIGHT_JOIN taskq_workflow_deps e FORCE INDEX (ix_taskq_workflow_step_deps)
                   ON e.task_id = s.task_id
                 STRAIGHT_JOIN taskq_workflow_steps ds FORCE INDEX (PRIMARY)
                   ON ds.task_id = e.dep_task_id
               WHERE s.workflow_id = ?
               ORDER BY e.task_id, ds.seq"#,
            id
        )
        .fetch_all(&self.pool)
        .await?;
        let mut after: BTreeMap<u64, Vec<String>> = BTreeMap::new();
        for e in edges {
            after.entry(e.task_id).or_default().push(e.dep_step);
        }
        steps
            .into_iter()
            .map(|s| {
                Ok(WorkflowStepRow {
                    state: state_of(Some(&s.state))?,
                    after: after.remove(&s.task_id).unwrap_or_default(),
                    step: s.step,
                    task_id: TaskId(s.task_id),
                    name: s.name,
                    queue: s.queue,
                    runs_after_failure: s.runs_after_failure,
                    canceled_by_dependency: s.canceled_by_dep,
                    output: s.output,
                })
            })
            .collect()
    }

    /// One row: the reading step's row by primary key, the named step by
    /// `uq_taskq_workflow_step`, the edge between them by primary key, the named step's task
    /// by primary key. No row: `task` is no step; no named step, no edge: the typed refusals.
    async fn workflow_step_output(&self, task: TaskId, step: &str) -> sqlx::Result<StepOutput> {
        let row = sqlx::query!(
            r#"SELECT d.task_id AS "dep?: u64", e.task_id AS "edge?: u64", t.output AS "output?: String"
               FROM taskq_workflow_steps s
                 LEFT JOIN taskq_workflow_steps d
                   ON d.workflow_id = s.workflow_id AND d.step = ?
                 LEFT JOIN taskq_workflow_deps e ON e.dep_task_id = d.task_id AND e.task_id = s.task_id
                 LEFT JOIN taskq_tasks t ON t.id = d.task_id
               WHERE s.task_id = ?"#,
            step,
            task.0
        )
        .fetch_optional(&self.pool)
        .await?;
        Ok(match row {
            None => StepOutput::NotAStep,
            Some(r) if r.dep.is_none() => StepOutput::UnknownStep,
            Some(r) if r.edge.is_none() => StepOutput::NotADependency,
            Some(r) => StepOutput::Output(r.output),
        })
    }

    async fn workflow_list(
        &self,
        name: Option<&str>,
        before_id: u64,
        limit: u32,
    ) -> sqlx::Result<Vec<WorkflowRow>> {
        let heads = sqlx::query_as!(
            WorkflowHead,
            r#"SELECT id AS "id: u64", name, created_at AS "created_at: NaiveDateTime",
                 canceled_at AS "canceled_at: NaiveDateTime"
               FROM taskq_workflows
               WHERE id < ? AND (? IS NULL OR name = ?)
               ORDER BY id DESC
               LIMIT ?"#,
            before_id,
            name,
            name,
            limit
        )
        .fetch_all(&self.pool)
        .await?;
        with_counts(self, heads).await
    }

    /// Locks the workflow row, marks it canceled, cancels its waiting and pending steps and
    /// asks its running ones to cancel (four statements). The edges from the steps it cancels
    /// are settled by the reaper's sweep (the steps after them are canceled already).
    async fn workflow_cancel(
        &self,
        conn: &mut MySqlConnection,
        id: u64,
    ) -> sqlx::Result<WorkflowCanceled> {
        let found = sqlx::query_scalar!(
            r#"SELECT id AS "id: u64" FROM taskq_workflows WHERE id = ? FOR UPDATE"#,
            id
        )
        .fetch_optional(&mut *conn)
        .await?;
        if found.is_none() {
            return Ok(WorkflowCanceled::default());
        }
        sqlx::query!(
            r#"UPDATE taskq_workflows SET canceled_at = COALESCE(canceled_at, UTC_TIMESTAMP(6))
               WHERE id = ?"#,
            id
        )
        .execute(&mut *conn)
        .await?;
        let canceled = sqlx::query!(
            r#"UPDATE taskq_workflow_steps s FORCE INDEX (ix_taskq_workflow_seq)
                 STRAIGHT_JOIN taskq_tasks t FORCE INDEX (PRIMARY) ON t.id = s.task_id
               SET t.state = 'canceled', t.finished_at = UTC_TIMESTAMP(6),
                   t.updated_at = UTC_TIMESTAMP(6)
               WHERE s.workflow_id = ? AND t.state IN ('waiting', 'pending')"#,
            id
        )
        .execute(&mut *conn)
        .await?
        .rows_affected();
        let cancel_requested = sqlx::query!(
            r#"UPDATE taskq_workflow_steps s FORCE INDEX (ix_taskq_workflow_seq)
                 STRAIGHT_JOIN taskq_tasks t FORCE INDEX (PRIMARY) ON t.id = s.task_id
               SET t.cancel_requested_at = COALESCE(t.cancel_requested_at, UTC_TIMESTAMP(6)),
                   t.updated_at = UTC_TIMESTAMP(6)
               WHERE s.workflow_id = ? AND t.state = 'running'"#,
            id
        )
        .execute(&mut *conn)
        .await?
        .rows_affected();
        Ok(WorkflowCanceled {
            found: true,
            canceled,
            cancel_requested,
        })
    }

    /// Reads the `scan` oldest workflows without a step task left (one read through the
    /// primary key and `ix_taskq_workflow_seq`), then deletes their edges, steps and rows in
    /// one transaction.
    async fn workflow_prune(&self, conn: &mut MySqlConnection, scan: u32) -> sqlx::Result<u64> {
        let ids = sqlx::query_scalar!(
            r#"SELECT w.id AS "id: u64"
               FROM (SELECT id FROM taskq_workflows ORDER BY id LIMIT ?) AS w
               WHERE NOT EXISTS (
                 SELECT 1 FROM taskq_workflow_steps s FORCE INDEX (ix_taskq_workflow_seq)
                   STRAIGHT_JOIN taskq_tasks t FORCE INDEX (PRIMARY) ON t.id = s.task_id
                 WHERE s.workflow_id = w.id)"#,
            scan
        )
        .fetch_all(&mut *conn)
        .await?;
        if ids.is_empty() {
            return Ok(0);
        }
        let ids = json(&ids)?;
        let mut tx = conn.begin().await?;
        sqlx::query!(
            r#"DELETE e FROM JSON_TABLE(?, '$[*]' COLUMNS (id BIGINT UNSIGNED PATH '$')) AS j
                 STRAIGHT_JOIN taskq_workflow_steps s FORCE INDEX (ix_taskq_workflow_seq)
                   ON s.workflow_id = j.id
                 STRAIGHT_JOIN taskq_workflow_deps e FORCE INDEX (ix_taskq_workflow_step_deps)
                   ON e.task_id = s.task_id"#,
            ids
        )
        .execute(&mut *tx)
        .await?;
        sqlx::query!(
            r#"DELETE s FROM JSON_TABLE(?, '$[*]' COLUMNS (id BIGINT UNSIGNED PATH '$')) AS j
                 STRAIGHT_JOIN taskq_workflow_steps s FORCE INDEX (ix_taskq_workflow_seq)
                   ON s.workflow_id = j.id"#,
            ids
        )
        .execute(&mut *tx)
        .await?;
        let n = sqlx::query!(
            r#"DELETE w FROM JSON_TABLE(?, '$[*]' COLUMNS (id BIGINT UNSIGNED PATH '$')) AS j
                 STRAIGHT_JOIN taskq_workflows w FORCE INDEX (PRIMARY) ON w.id = j.id"#,
            ids
        )
        .execute(&mut *tx)
        .await?
        .rows_affected();
        tx.commit().await?;
        Ok(n)
    }
}

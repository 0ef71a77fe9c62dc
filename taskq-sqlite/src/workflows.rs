//! Workflows (`taskq_workflows`, `taskq_workflow_steps`, `taskq_workflow_deps`) on SQLite: the
//! same statements as taskq-mysql's `workflows.rs` in SQLite's dialect (`json_each`, `UPDATE …
//! FROM`); the database's one writer at a time stands in for MySQL's row locks. What an end
//! does to a step after it is `taskq_driver::rules::workflow`'s.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;
use sqlx::{SqliteConnection, SqlitePool};

use crate::clock::{opt_time, time_from_us};
use crate::connect::begin_write;
use crate::conv::{json, sid, state, uid};
use crate::enqueue::task_insert_many;
use taskq_driver::rows::{
    Inserted, NewTask, NewWorkflow, Settled, StepOutput, WorkflowCanceled, WorkflowInserted,
    WorkflowRow, WorkflowStepRow,
};
use taskq_driver::rules::workflow::{
    CANCELED_BY_DEPENDENCY, DependencyEnd, StepCounts, dependency_end,
};
use taskq_driver::state::{TaskId, TaskState};

/// Inserts a workflow and its steps atomically (a savepoint of the caller's transaction, or a
/// `BEGIN IMMEDIATE` transaction of its own): the workflow row, the steps' tasks (multi-row
/// batches), their workflow and state, the step rows and the edges.
pub(crate) async fn workflow_insert(
    conn: &mut SqliteConnection,
    wf: &NewWorkflow<'_>,
) -> sqlx::Result<WorkflowInserted> {
    let mut tx = begin_write(conn).await?;
    let id = sqlx::query_scalar!(
        r#"INSERT INTO taskq_workflows (name, created_at)
           SELECT ?1, c.us FROM taskq_clock AS c
           RETURNING id AS "id!: i64""#,
        wf.name
    )
    .fetch_one(&mut *tx)
    .await?;
    let rows: Vec<NewTask<'_>> = wf.steps.iter().map(|s| s.task).collect();
    let task_ids = task_insert_many(&mut tx, &rows)
        .await?
        .into_iter()
        .map(|i| match i {
            Inserted::New(id) | Inserted::Duplicate(id) => id,
        })
        .collect::<Vec<TaskId>>();
    let states: Vec<(i64, bool)> = wf
        .steps
        .iter()
        .zip(&task_ids)
        .map(|(s, t)| (sid(t.0), !s.after.is_empty()))
        .collect();
    sqlx::query!(
        r#"UPDATE taskq_tasks AS t
           SET workflow_id = ?2,
               state = CASE WHEN j.value ->> '$[1]' THEN 'waiting' ELSE 'pending' END
           FROM json_each(?1) AS j
           WHERE t.id = j.value ->> '$[0]'"#,
        json(&states)?,
        id
    )
    .execute(&mut *tx)
    .await?;
    #[derive(Serialize)]
    struct StepJson<'a>(i64, u32, &'a str, usize, bool);
    let steps: Vec<StepJson<'_>> = wf
        .steps
        .iter()
        .zip(&task_ids)
        .enumerate()
        .map(|(i, (s, t))| {
            StepJson(
                sid(t.0),
                i as u32,
                s.step,
                s.after.len(),
                s.runs_after_failure,
            )
        })
        .collect();
    sqlx::query!(
        r#"INSERT INTO taskq_workflow_steps
             (task_id, workflow_id, seq, step, deps_left, runs_after_failure)
           SELECT j.value ->> '$[0]', ?2, j.value ->> '$[1]', j.value ->> '$[2]',
                  j.value ->> '$[3]', j.value ->> '$[4]'
           FROM json_each(?1) AS j"#,
        json(&steps)?,
        id
    )
    .execute(&mut *tx)
    .await?;
    let ids = &task_ids;
    let edges: Vec<(i64, i64)> = wf
        .steps
        .iter()
        .zip(ids)
        .flat_map(|(s, t)| s.after.iter().map(move |&d| (sid(ids[d].0), sid(t.0))))
        .collect();
    if !edges.is_empty() {
        sqlx::query!(
            r#"INSERT INTO taskq_workflow_deps (dep_task_id, task_id)
               SELECT j.value ->> '$[0]', j.value ->> '$[1]' FROM json_each(?1) AS j"#,
            json(&edges)?
        )
        .execute(&mut *tx)
        .await?;
    }
    tx.commit().await?;
    Ok(WorkflowInserted {
        id: uid(id),
        task_ids,
    })
}

/// A dependency's state; one whose task was deleted has ended as if canceled.
fn dep_state(s: Option<&str>) -> sqlx::Result<TaskState> {
    s.map_or(Ok(TaskState::Canceled), state)
}

/// Settles the ended steps among `ended` on `conn` (inside the caller's write transaction), in
/// rounds as taskq-mysql's `settle` does: read the edges (unsettled; in the first round also
/// those to a step canceled by a dependency, which a success after an operator's retry brings
/// back), then apply them, until no step is canceled or brought back.
pub(crate) async fn settle(conn: &mut SqliteConnection, ended: &[u64]) -> sqlx::Result<Settled> {
    let mut out = Settled::default();
    let mut frontier: Vec<i64> = ended.iter().map(|&i| sid(i)).collect();
    let mut first = true;
    while !frontier.is_empty() {
        frontier.sort_unstable();
        frontier.dedup();
        let rows = sqlx::query!(
            r#"SELECT e.dep_task_id AS "dep_task_id!: i64", e.task_id AS "task_id!: i64",
                 e.settled AS "settled!: bool", d.state AS "dep_state?: String",
                 t.state AS "step_state?: String", t.queue AS "queue?: String",
                 s.deps_left AS "deps_left!: i64",
                 s.runs_after_failure AS "runs_after_failure!: bool",
                 s.canceled_by_dep AS "canceled_by_dep!: bool"
               FROM json_each(?1) AS j
                 JOIN taskq_workflow_deps AS e ON e.dep_task_id = j.value
                 JOIN taskq_workflow_steps AS s ON s.task_id = e.task_id
                 LEFT JOIN taskq_tasks AS t ON t.id = e.task_id
                 LEFT JOIN taskq_tasks AS d ON d.id = e.dep_task_id
               WHERE e.settled = 0 OR (?2 AND s.canceled_by_dep = 1)
               ORDER BY e.task_id, e.dep_task_id"#,
            json(&frontier)?,
            first
        )
        .fetch_all(&mut *conn)
        .await?;
        let mut pairs: Vec<(i64, i64)> = Vec::new();
        let mut counts: BTreeMap<i64, (i64, i64)> = BTreeMap::new();
        let mut cancels: BTreeSet<i64> = BTreeSet::new();
        let mut revive: BTreeSet<i64> = BTreeSet::new();
        let mut queues: BTreeMap<i64, String> = BTreeMap::new();
        for r in rows {
            let dep = dep_state(r.dep_state.as_deref())?;
            // A step whose task was deleted: the edge is settled, to no effect.
            let Some(step_state) = r.step_state.as_deref() else {
                if !r.settled {
                    pairs.push((r.dep_task_id, r.task_id));
                }
                continue;
            };
            let step = state(step_state)?;
            if r.settled {
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
                    counts.entry(r.task_id).or_insert((r.deps_left, 0)).1 += 1;
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
                r#"UPDATE taskq_workflow_deps AS e SET settled = 1
                   FROM json_each(?1) AS j
                   WHERE e.dep_task_id = j.value ->> '$[0]' AND e.task_id = j.value ->> '$[1]'"#,
                json(&pairs)?
            )
            .execute(&mut *conn)
            .await?;
        }
        let dec: Vec<(i64, i64)> = counts.iter().map(|(id, (_, n))| (*id, *n)).collect();
        if !dec.is_empty() {
            sqlx::query!(
                r#"UPDATE taskq_workflow_steps AS s SET deps_left = s.deps_left - (j.value ->> '$[1]')
                   FROM json_each(?1) AS j
                   WHERE s.task_id = j.value ->> '$[0]'"#,
                json(&dec)?
            )
            .execute(&mut *conn)
            .await?;
        }
        let cancel: Vec<i64> = cancels.iter().copied().collect();
        if !cancel.is_empty() {
            let ids = json(&cancel)?;
            sqlx::query!(
                r#"UPDATE taskq_tasks AS t
                   SET state = 'canceled', finished_at = c.us, updated_at = c.us, last_error = ?2
                   FROM json_each(?1) AS j, taskq_clock AS c
                   WHERE t.id = j.value AND t.state = 'waiting'"#,
                ids,
                CANCELED_BY_DEPENDENCY
            )
            .execute(&mut *conn)
            .await?;
            sqlx::query!(
                r#"UPDATE taskq_workflow_steps SET canceled_by_dep = 1
                   WHERE task_id IN (SELECT value FROM json_each(?1))"#,
                ids
            )
            .execute(&mut *conn)
            .await?;
        }
        let release: Vec<i64> = counts
            .iter()
            .filter(|(id, (left, n))| {
                left - n <= 0 && queues.contains_key(id) && !cancels.contains(id)
            })
            .map(|(id, _)| *id)
            .collect();
        if !release.is_empty() {
            sqlx::query!(
                r#"UPDATE taskq_tasks AS t
                   SET state = 'pending', run_at = MAX(t.run_at, c.us), updated_at = c.us
                   FROM json_each(?1) AS j, taskq_clock AS c
                   WHERE t.id = j.value AND t.state = 'waiting'"#,
                json(&release)?
            )
            .execute(&mut *conn)
            .await?;
            for id in release {
                let q = queues.remove(&id).unwrap_or_default();
                out.released.push((TaskId(uid(id)), q));
            }
        }
        out.edges += pairs.len() as u64;
        out.canceled
            .extend(cancel.iter().map(|id| TaskId(uid(*id))));
        frontier = cancel;
        if !revive.is_empty() {
            let ids: Vec<i64> = revive.into_iter().collect();
            frontier.extend(revive_steps(conn, &ids).await?);
        }
        first = false;
    }
    Ok(out)
}

/// Brings back steps canceled by their dependencies (see taskq-mysql's `revive_steps`);
/// returns their dependencies.
async fn revive_steps(conn: &mut SqliteConnection, ids: &[i64]) -> sqlx::Result<Vec<i64>> {
    let ids = json(ids)?;
    let revived = sqlx::query_scalar!(
        r#"UPDATE taskq_tasks AS t
           SET state = 'waiting', finished_at = NULL, last_error = NULL, updated_at = c.us
           FROM json_each(?1) AS j, taskq_clock AS c
           WHERE t.id = j.value AND t.state = 'canceled'
             AND EXISTS (SELECT 1 FROM taskq_workflow_steps AS s
                         WHERE s.task_id = t.id AND s.canceled_by_dep = 1)
           RETURNING id AS "id!: i64""#,
        ids
    )
    .fetch_all(&mut *conn)
    .await?;
    let ids = json(&revived)?;
    sqlx::query!(
        r#"UPDATE taskq_workflow_steps AS s
           SET canceled_by_dep = 0,
               deps_left = (SELECT COUNT(*) FROM taskq_workflow_deps AS e
                            WHERE e.task_id = s.task_id)
           WHERE s.task_id IN (SELECT value FROM json_each(?1))"#,
        ids
    )
    .execute(&mut *conn)
    .await?;
    sqlx::query!(
        r#"UPDATE taskq_workflow_deps SET settled = 0
           WHERE task_id IN (SELECT value FROM json_each(?1))"#,
        ids
    )
    .execute(&mut *conn)
    .await?;
    sqlx::query_scalar!(
        r#"SELECT dep_task_id AS "id!: i64" FROM taskq_workflow_deps
           WHERE task_id IN (SELECT value FROM json_each(?1))"#,
        ids
    )
    .fetch_all(&mut *conn)
    .await
}

/// Settles in a write transaction of its own.
async fn workflow_settle(conn: &mut SqliteConnection, ended: &[u64]) -> sqlx::Result<Settled> {
    let mut tx = begin_write(conn).await?;
    let out = settle(&mut tx, ended).await?;
    tx.commit().await?;
    Ok(out)
}

/// Up to `limit` ended (or deleted) dependencies with an unsettled edge (the partial index
/// `ix_taskq_workflow_unsettled`), settled in one transaction.
pub(crate) async fn workflow_settle_stranded(
    conn: &mut SqliteConnection,
    limit: u32,
) -> sqlx::Result<Settled> {
    let ids = sqlx::query_scalar!(
        r#"SELECT DISTINCT e.dep_task_id AS "id!: i64"
           FROM taskq_workflow_deps AS e
             LEFT JOIN taskq_tasks AS d ON d.id = e.dep_task_id
           WHERE e.settled = 0
             AND (d.id IS NULL OR d.state IN ('succeeded', 'dead', 'canceled', 'expired'))
           LIMIT ?1"#,
        limit
    )
    .fetch_all(&mut *conn)
    .await?;
    if ids.is_empty() {
        return Ok(Settled::default());
    }
    let ids: Vec<u64> = ids.into_iter().map(uid).collect();
    workflow_settle(conn, &ids).await
}

struct Head {
    id: i64,
    name: String,
    created_at: i64,
    canceled_at: Option<i64>,
}

async fn with_counts(pool: &SqlitePool, heads: Vec<Head>) -> sqlx::Result<Vec<WorkflowRow>> {
    let ids: Vec<i64> = heads.iter().map(|h| h.id).collect();
    let rows = sqlx::query!(
        r#"SELECT s.workflow_id AS "workflow_id!: i64", t.state AS "state!: String",
             COUNT(*) AS "n!: i64"
           FROM json_each(?1) AS j
             JOIN taskq_workflow_steps AS s ON s.workflow_id = j.value
             JOIN taskq_tasks AS t ON t.id = s.task_id
           GROUP BY s.workflow_id, t.state"#,
        json(&ids)?
    )
    .fetch_all(pool)
    .await?;
    let mut counts: BTreeMap<i64, StepCounts> = BTreeMap::new();
    for r in rows {
        counts
            .entry(r.workflow_id)
            .or_default()
            .add(state(&r.state)?, uid(r.n));
    }
    heads
        .into_iter()
        .map(|h| {
            Ok(WorkflowRow {
                counts: counts.remove(&h.id).unwrap_or_default(),
                id: uid(h.id),
                name: h.name,
                created_at: time_from_us(h.created_at)?,
                canceled_at: opt_time(h.canceled_at)?,
            })
        })
        .collect()
}

/// A workflow with its steps per state.
pub(crate) async fn workflow_get(pool: &SqlitePool, id: u64) -> sqlx::Result<Option<WorkflowRow>> {
    let head = sqlx::query_as!(
        Head,
        r#"SELECT id AS "id!: i64", name, created_at, canceled_at
           FROM taskq_workflows WHERE id = ?1"#,
        sid(id)
    )
    .fetch_optional(pool)
    .await?;
    match head {
        Some(h) => Ok(with_counts(pool, vec![h]).await?.pop()),
        None => Ok(None),
    }
}

/// A page of workflows, newest first.
pub(crate) async fn workflow_list(
    pool: &SqlitePool,
    name: Option<&str>,
    before_id: u64,
    limit: u32,
) -> sqlx::Result<Vec<WorkflowRow>> {
    let heads = sqlx::query_as!(
        Head,
        r#"SELECT id AS "id!: i64", name, created_at, canceled_at
           FROM taskq_workflows
           WHERE id < ?1 AND (?2 IS NULL OR name = ?2)
           ORDER BY id DESC
           LIMIT ?3"#,
        sid(before_id),
        name,
        limit
    )
    .fetch_all(pool)
    .await?;
    with_counts(pool, heads).await
}

/// A workflow's steps in insert order, each with the names of the steps it runs after.
pub(crate) async fn workflow_steps(
    pool: &SqlitePool,
    id: u64,
) -> sqlx::Result<Vec<WorkflowStepRow>> {
    let steps = sqlx::query!(
        r#"SELECT s.step, s.task_id AS "task_id!: i64", t.name, t.queue,
             t.state AS "state!: String",
             s.runs_after_failure AS "runs_after_failure!: bool",
             s.canceled_by_dep AS "canceled_by_dep!: bool", t.output AS "output?: String"
           FROM taskq_workflow_steps AS s JOIN taskq_tasks AS t ON t.id = s.task_id
           WHERE s.workflow_id = ?1
           ORDER BY s.seq"#,
        sid(id)
    )
    .fetch_all(pool)
    .await?;
    let edges = sqlx::query!(
        r#"SELECT e.task_id AS "task_id!: i64", ds.step AS "dep_step!: String"
           FROM taskq_workflow_steps AS s
             JOIN taskq_workflow_deps AS e ON e.task_id = s.task_id
             JOIN taskq_workflow_steps AS ds ON ds.task_id = e.dep_task_id
           WHERE s.workflow_id = ?1
           ORDER BY e.task_id, ds.seq"#,
        sid(id)
    )
    .fetch_all(pool)
    .await?;
    let mut after: BTreeMap<i64, Vec<String>> = BTreeMap::new();
    for e in edges {
        after.entry(e.task_id).or_default().push(e.dep_step);
    }
    steps
        .into_iter()
        .map(|s| {
            Ok(WorkflowStepRow {
                state: state(&s.state)?,
                after: after.remove(&s.task_id).unwrap_or_default(),
                step: s.step,
                task_id: TaskId(uid(s.task_id)),
                name: s.name,
                queue: s.queue,
                runs_after_failure: s.runs_after_failure,
                canceled_by_dependency: s.canceled_by_dep,
                output: s.output,
            })
        })
        .collect()
}

/// The output of step `step` of the workflow `task` is a step of, for `task` to read: one read
/// of the reading step's row, the named step (`uq_taskq_workflow_step`), the edge between them
/// and the named step's task, each by key (MySQL's statement).
pub(crate) async fn workflow_step_output(
    pool: &SqlitePool,
    task: TaskId,
    step: &str,
) -> sqlx::Result<StepOutput> {
    let row = sqlx::query!(
        r#"SELECT d.task_id AS "dep?: i64", e.task_id AS "edge?: i64", t.output AS "output?: String"
           FROM taskq_workflow_steps AS s
             LEFT JOIN taskq_workflow_steps AS d ON d.workflow_id = s.workflow_id AND d.step = ?1
             LEFT JOIN taskq_workflow_deps AS e ON e.dep_task_id = d.task_id AND e.task_id = s.task_id
             LEFT JOIN taskq_tasks AS t ON t.id = d.task_id
           WHERE s.task_id = ?2"#,
        step,
        sid(task.0)
    )
    .fetch_optional(pool)
    .await?;
    Ok(match row {
        None => StepOutput::NotAStep,
        Some(r) if r.dep.is_none() => StepOutput::UnknownStep,
        Some(r) if r.edge.is_none() => StepOutput::NotADependency,
        Some(r) => StepOutput::Output(r.output),
    })
}

/// Cancels a workflow on the caller's transaction: marks it canceled, cancels its waiting and
/// pending steps, asks its running ones to cancel.
pub(crate) async fn workflow_cancel(
    conn: &mut SqliteConnection,
    id: u64,
) -> sqlx::Result<WorkflowCanceled> {
    let id = sid(id);
    let found = sqlx::query!(
        r#"UPDATE taskq_workflows
           SET canceled_at = COALESCE(canceled_at, (SELECT us FROM taskq_clock))
           WHERE id = ?1"#,
        id
    )
    .execute(&mut *conn)
    .await?
    .rows_affected();
    if found == 0 {
        return Ok(WorkflowCanceled::default());
    }
    let canceled = sqlx::query!(
        r#"UPDATE taskq_tasks AS t
           SET state = 'canceled', finished_at = c.us, updated_at = c.us
           FROM taskq_workflow_steps AS s, taskq_clock AS c
           WHERE s.workflow_id = ?1 AND t.id = s.task_id AND t.state IN ('waiting', 'pending')"#,
        id
    )
    .execute(&mut *conn)
    .await?
    .rows_affected();
    let cancel_requested = sqlx::query!(
        r#"UPDATE taskq_tasks AS t
           SET cancel_requested_at = COALESCE(t.cancel_requested_at, c.us), updated_at = c.us
           FROM taskq_workflow_steps AS s, taskq_clock AS c
           WHERE s.workflow_id = ?1 AND t.id = s.task_id AND t.state = 'running'"#,
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

/// Deletes the workflows, among the `scan` oldest, without a step task left, with their steps
/// and edges, in one write transaction; how many workflows.
pub(crate) async fn workflow_prune(conn: &mut SqliteConnection, scan: u32) -> sqlx::Result<u64> {
    let mut tx = begin_write(conn).await?;
    let ids = sqlx::query_scalar!(
        r#"SELECT w.id AS "id!: i64"
           FROM (SELECT id FROM taskq_workflows ORDER BY id LIMIT ?1) AS w
           WHERE NOT EXISTS (
             SELECT 1 FROM taskq_workflow_steps AS s JOIN taskq_tasks AS t ON t.id = s.task_id
             WHERE s.workflow_id = w.id)"#,
        scan
    )
    .fetch_all(&mut *tx)
    .await?;
    if ids.is_empty() {
        return Ok(0);
    }
    let ids = json(&ids)?;
    sqlx::query!(
        r#"DELETE FROM taskq_workflow_deps
           WHERE task_id IN (SELECT s.task_id FROM taskq_workflow_steps AS s
                             WHERE s.workflow_id IN (SELECT value FROM json_each(?1)))"#,
        ids
    )
    .execute(&mut *tx)
    .await?;
    sqlx::query!(
        r#"DELETE FROM taskq_workflow_steps
           WHERE workflow_id IN (SELECT value FROM json_each(?1))"#,
        ids
    )
    .execute(&mut *tx)
    .await?;
    let n = sqlx::query!(
        r#"DELETE FROM taskq_workflows WHERE id IN (SELECT value FROM json_each(?1))"#,
        ids
    )
    .execute(&mut *tx)
    .await?
    .rows_affected();
    tx.commit().await?;
    Ok(n)
}

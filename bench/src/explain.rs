//! `EXPLAIN` of taskq's claim reads, as text.

use sqlx::MySqlPool;
use sqlx::Row;
use sqlx::types::chrono::NaiveDateTime;

use crate::Res;

/// `EXPLAIN` of taskq's claim query, as text rows.
pub async fn explain_claim(pool: &MySqlPool) -> Res<Vec<String>> {
    // The three reads of taskq's claim: candidates from the head of the queue, candidates
    // past a seek position (here: the first due row), and the locking read by primary key.
    let first: (i16, NaiveDateTime, u64) = sqlx::query_as(
        "SELECT priority, run_at, id FROM taskq_tasks
         WHERE state = 'pending' AND queue = 'bench' AND run_at <= UTC_TIMESTAMP(6)
         ORDER BY priority, run_at, id LIMIT 1",
    )
    .fetch_one(pool)
    .await?;
    let candidates = "SELECT id FROM taskq_tasks
         WHERE state = 'pending' AND queue = 'bench' AND run_at <= UTC_TIMESTAMP(6)
           AND JSON_CONTAINS('[\"bench_noop\"]', JSON_QUOTE(name))";
    let order = "ORDER BY priority, run_at, id LIMIT 32";
    let mut out = Vec::new();
    for (label, sql) in [
        ("candidates, from the head", format!("EXPLAIN {candidates} {order}")),
        (
            "candidates, past a seek position",
            format!(
                "EXPLAIN {candidates} AND (priority > ? OR (priority = ? AND run_at > ?)
                   OR (priority = ? AND run_at = ? AND id > ?)) {order}"
            ),
        ),
        (
            "lock by primary key",
            "EXPLAIN SELECT t.id FROM JSON_TABLE('[1,2,3]', '$[*]' COLUMNS (id BIGINT UNSIGNED PATH '$')) AS j
               STRAIGHT_JOIN taskq_tasks t FORCE INDEX (PRIMARY) ON t.id = j.id
             WHERE t.state = 'pending' AND t.run_at <= UTC_TIMESTAMP(6)
             LIMIT 16 FOR UPDATE SKIP LOCKED"
                .to_owned(),
        ),
    ] {
        let mut q = sqlx::query(sqlx::AssertSqlSafe(sql));
        if label.contains("seek") {
            q = q
                .bind(first.0)
                .bind(first.0)
                .bind(first.1)
                .bind(first.0)
                .bind(first.1)
                .bind(first.2);
        }
        let rows = q.fetch_all(pool).await?;
        out.push(format!("-- {label}"));
        out.extend(explain_lines(&rows));
    }
    Ok(out)
}

/// `EXPLAIN` rows as a header line and one ` | `-separated line per row.
pub fn explain_lines(rows: &[sqlx::mysql::MySqlRow]) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(first) = rows.first() {
        use sqlx::Column;
        out.push(
            first
                .columns()
                .iter()
                .map(|c| c.name().to_owned())
                .collect::<Vec<_>>()
                .join(" | "),
        );
    }
    for r in rows {
        let cells: Vec<String> = (0..r.len())
            .map(|i| {
                if let Ok(v) = r.try_get::<Option<String>, _>(i) {
                    v.unwrap_or_else(|| "NULL".into())
                } else if let Ok(v) = r.try_get::<Option<i64>, _>(i) {
                    v.map_or("NULL".into(), |v| v.to_string())
                } else if let Ok(v) = r.try_get::<Option<u64>, _>(i) {
                    v.map_or("NULL".into(), |v| v.to_string())
                } else if let Ok(v) = r.try_get::<Option<Vec<u8>>, _>(i) {
                    v.map_or("NULL".into(), |v| String::from_utf8_lossy(&v).into_owned())
                } else {
                    "?".into()
                }
            })
            .collect();
        out.push(cells.join(" | "));
    }
    out
}

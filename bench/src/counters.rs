//! Process and server counters: this process's CPU time and memory, and the server's global
//! statement counters (`SHOW GLOBAL STATUS`) and their deltas over a measurement.

use std::collections::HashMap;

use sqlx::MySqlPool;

use crate::Res;

/// User + system CPU seconds of this process.
pub fn cpu_secs() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let rest = stat.rsplit_once(')').map(|x| x.1).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // Fields 14 and 15 of /proc/<pid>/stat; `rest` starts at field 3. USER_HZ is 100 on Linux.
    (ticks(11) + ticks(12)) / 100.0
}

/// A `VmXXX:` value of /proc/self/status, in KiB.
pub fn vm_kib(key: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with(key))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Resets the peak RSS (VmHWM) of this process to its current RSS.
pub fn reset_peak_rss() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

pub const COUNTERS: &[&str] = &[
    "Questions",
    "Com_select",
    "Com_insert",
    "Com_update",
    "Com_delete",
    "Com_begin",
    "Com_commit",
    "Com_stmt_execute",
    "Handler_read_next",
];

pub async fn server_status(pool: &MySqlPool) -> Res<HashMap<String, i64>> {
    let rows: Vec<(String, String)> = sqlx::query_as(
        "SHOW GLOBAL STATUS WHERE Variable_name IN ('Questions', 'Com_select', 'Com_insert', \
         'Com_update', 'Com_delete', 'Com_begin', 'Com_commit', 'Com_stmt_execute', \
         'Handler_read_next')",
    )
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(k, v)| (k, v.parse().unwrap_or(0)))
        .collect())
}

/// Counter deltas; `Questions` excludes the second `SHOW STATUS` itself.
pub fn status_delta(a: &HashMap<String, i64>, b: &HashMap<String, i64>) -> HashMap<String, i64> {
    COUNTERS
        .iter()
        .map(|k| {
            let mut d = b.get(*k).copied().unwrap_or(0) - a.get(*k).copied().unwrap_or(0);
            if *k == "Questions" {
                d -= 1;
            }
            ((*k).to_owned(), d)
        })
        .collect()
}

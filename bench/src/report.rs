//! What a report shows besides the figures: the machine, the server's settings, rates, and
//! the SVG chart.

use serde_json::{Value, json};
use sqlx::MySqlPool;

use crate::Res;

pub fn machine() -> Value {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split_once(':'))
        .map(|x| x.1.trim().to_owned())
        .unwrap_or_default();
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let mem_kib: u64 = meminfo
        .lines()
        .find(|l| l.starts_with("MemTotal:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    json!({
        "cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        "cpu_model": model,
        "mem_gib": (mem_kib as f64 / 1048576.0 * 10.0).round() / 10.0,
        "loadavg_at_start": load.trim(),
    })
}

pub async fn server_settings(pool: &MySqlPool) -> Res<Value> {
    let version: String = sqlx::query_scalar("SELECT VERSION()")
        .fetch_one(pool)
        .await?;
    let rows: Vec<(String, String)> = sqlx::query_as(
        "SHOW GLOBAL VARIABLES WHERE Variable_name IN ('innodb_flush_log_at_trx_commit',
           'innodb_buffer_pool_size', 'log_bin', 'sync_binlog', 'innodb_autoinc_lock_mode',
           'innodb_log_file_size', 'max_connections', 'transaction_isolation', 'tx_isolation')",
    )
    .fetch_all(pool)
    .await?;
    let mut m = serde_json::Map::new();
    m.insert("version".into(), json!(version));
    for (k, v) in rows {
        m.insert(k, json!(v));
    }
    Ok(Value::Object(m))
}

pub fn fmt_rate(v: f64) -> String {
    if v >= 10_000.0 {
        format!("{:.1}k", v / 1000.0)
    } else if v >= 1000.0 {
        format!("{:.2}k", v / 1000.0)
    } else {
        format!("{v:.0}")
    }
}

/// One bar of the chart.
pub struct Bar {
    pub label: String,
    pub value: f64,
    pub raw: bool,
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// Horizontal bar chart: throughput (left) and pickup latency (right).
pub fn svg(title: &str, bars: &[Bar], lat: &[(String, f64)]) -> String {
    let row = 22.0;
    let left = 250.0;
    let width = 420.0;
    let top = 60.0;
    let h = top + row * bars.len().max(lat.len()) as f64 + 60.0;
    let total_w = left + width + 60.0 + 200.0 + 280.0;
    let max = bars.iter().map(|b| b.value).fold(1.0, f64::max);
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{total_w:.0}\" height=\"{h:.0}\" \
         font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"10\" y=\"22\" font-size=\"15\" font-weight=\"bold\">{}</text>\n\
         <text x=\"10\" y=\"42\" fill=\"#555\">tasks/s (or tx/s); grey = hand-written SQL \
         ceiling, blue = taskq</text>\n",
        esc(title)
    );
    for (i, b) in bars.iter().enumerate() {
        let y = top + row * i as f64;
        let w = (b.value / max * width).max(1.0);
        let color = if b.raw { "#9e9e9e" } else { "#1f77b4" };
        s += &format!(
            "<text x=\"{:.0}\" y=\"{:.0}\" text-anchor=\"end\">{}</text>\
             <rect x=\"{left:.0}\" y=\"{:.0}\" width=\"{w:.1}\" height=\"{:.0}\" fill=\"{color}\"/>\
             <text x=\"{:.1}\" y=\"{:.0}\">{}</text>\n",
            left - 8.0,
            y + 15.0,
            esc(&b.label),
            y + 3.0,
            row - 6.0,
            left + w + 4.0,
            y + 15.0,
            fmt_rate(b.value)
        );
    }
    // Latency panel.
    let lx = left + width + 60.0 + 200.0;
    let lw = 220.0;
    let lmax = lat.iter().map(|l| l.1).fold(1.0, f64::max);
    s += &format!(
        "<text x=\"{:.0}\" y=\"42\" fill=\"#555\">enqueue-commit → handler-start, ms</text>\n",
        lx - 190.0
    );
    for (i, (label, v)) in lat.iter().enumerate() {
        let y = top + row * i as f64;
        let w = (v / lmax * lw).max(1.0);
        s += &format!(
            "<text x=\"{:.0}\" y=\"{:.0}\" text-anchor=\"end\">{}</text>\
             <rect x=\"{lx:.0}\" y=\"{:.0}\" width=\"{w:.1}\" height=\"{:.0}\" fill=\"#ff7f0e\"/>\
             <text x=\"{:.1}\" y=\"{:.0}\">{v:.1}</text>\n",
            lx - 8.0,
            y + 15.0,
            esc(label),
            y + 3.0,
            row - 6.0,
            lx + w + 4.0,
            y + 15.0,
        );
    }
    s += "</svg>\n";
    s
}

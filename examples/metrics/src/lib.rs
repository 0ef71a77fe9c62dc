//! Shared pieces of the metrics example: a task, and installing the Prometheus exporter.

use std::net::SocketAddr;

use taskq::TaskError;

/// A task that fails its first attempt when `fail_first` is set, so every outcome shows up.
#[taskq::task(queue = "reports", max_attempts = 3, backoff = "constant(50ms)")]
pub async fn build_report(
    day: u32,
    fail_first: bool,
    cx: taskq::TaskContext,
) -> Result<(), TaskError> {
    if fail_first && cx.attempt() == 1 {
        return Err(TaskError::msg(format!("day {day}: upstream not ready")));
    }
    Ok(())
}

/// Installs the global Prometheus recorder with an HTTP listener on `addr` (`/metrics`).
pub fn install_exporter(addr: SocketAddr) -> Result<(), Box<dyn std::error::Error>> {
    metrics_exporter_prometheus::PrometheusBuilder::new()
        .with_http_listener(addr)
        .install()?;
    Ok(())
}

/// `GET /metrics` over a plain TCP connection (no HTTP client dependency).
pub async fn scrape(addr: SocketAddr) -> std::io::Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    s.write_all(
        format!("GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await?;
    let mut body = String::new();
    s.read_to_string(&mut body).await?;
    Ok(body)
}

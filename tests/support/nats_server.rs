//! A private `nats-server` with JetStream for fault tests: its own port on `127.0.0.1` and its
//! own store directory, so a test can stop it (the broker is gone: connections close, new ones
//! are refused) and start it again on the same port and store (the streams and their messages
//! are back).
//!
//! ```ignore
//! let Some(mut nats) = PrivateNats::start_or_skip() else { return };
//! nats.stop();             // SIGTERM, waits for the process to exit
//! nats.start();            // same port, same store
//! ```
//!
//! Without a `nats-server` binary (on `PATH`, or `TASKQ_TEST_NATS_SERVER`), the test prints
//! `SKIPPED nats: <test>: ...` and passes, unless `TASKQ_REQUIRE_BROKERS` is set.

use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::brokers;

/// A `nats-server -js` process of this test, killed (and its store removed) when dropped.
pub struct PrivateNats {
    exe: PathBuf,
    port: u16,
    store: PathBuf,
    max_payload: Option<u32>,
    child: Option<Child>,
}

impl PrivateNats {
    /// Starts one on a free port with a fresh store directory; `None` (after a `SKIPPED`
    /// line) when there is no `nats-server` binary, unless `TASKQ_REQUIRE_BROKERS` is set.
    pub fn start_or_skip() -> Option<Self> {
        Self::start_with_or_skip(None)
    }

    /// Like [`start_or_skip`](Self::start_or_skip), with the server's `max_payload` (bytes)
    /// set when given.
    pub fn start_with_or_skip(max_payload: Option<u32>) -> Option<Self> {
        let exe = std::env::var_os("TASKQ_TEST_NATS_SERVER")
            .map(PathBuf::from)
            .or_else(|| which("nats-server"));
        let Some(exe) = exe else {
            brokers::skip(
                "nats",
                "no nats-server binary on PATH (or TASKQ_TEST_NATS_SERVER)",
            );
            return None;
        };
        // A namespace without loopback (`unshare -n`) can spawn the server but never reach it.
        if let Err(why) = crate::loopback_check() {
            brokers::skip("loopback", &why);
            return None;
        }
        let port = free_port();
        let store = std::env::temp_dir().join(format!("taskq-nats-{:016x}", fastrand::u64(..)));
        std::fs::create_dir_all(&store).expect("create the store directory");
        let mut server = Self {
            exe,
            port,
            store,
            max_payload,
            child: None,
        };
        server.start();
        Some(server)
    }

    /// `nats://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// `127.0.0.1:<port>`.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.port))
    }

    /// Whether the process runs.
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// Starts the process (if not running) on the port and store, and waits (at most 20 s)
    /// until it accepts connections.
    pub fn start(&mut self) {
        if self.child.is_some() {
            return;
        }
        let mut cmd = Command::new(&self.exe);
        cmd.args([
            "-a",
            "127.0.0.1",
            "-p",
            &self.port.to_string(),
            "-js",
            "-sd",
        ])
        .arg(&self.store)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
        if let Some(max) = self.max_payload {
            // Only from a config file; the rest of the options stay on the command line.
            let conf = self.store.join("max_payload.conf");
            std::fs::write(&conf, format!("max_payload: {max}\n")).expect("write the config");
            cmd.arg("-c").arg(conf);
        }
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {}: {e}", self.exe.display()));
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        while TcpStream::connect_timeout(&self.addr(), Duration::from_millis(200)).is_err() {
            assert!(
                Instant::now() < deadline,
                "nats-server on port {} did not answer within 20 s",
                self.port
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Stops the process with SIGTERM (a clean shutdown: the store is flushed) and waits for
    /// it to exit (SIGKILL after 10 s).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status();
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                if let Ok(Some(_)) = child.try_wait() {
                    break;
                }
                if Instant::now() > deadline {
                    let _ = child.kill();
                    let _ = child.wait();
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }

    /// Kills the process with SIGKILL (a crash) and reaps it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for PrivateNats {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.store);
    }
}

fn which(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .chain(["/usr/sbin".into(), "/usr/local/bin".into()])
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// A port nothing listens on right now (bound, then released).
fn free_port() -> u16 {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|l| l.local_addr())
        .expect("bind a free port")
        .port()
}

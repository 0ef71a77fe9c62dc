//! A private MariaDB (or MySQL) server owned by one test.
//!
//! Fault tests must not touch the shared server, so [`PrivateServer::start`] initialises a fresh
//! datadir under [`std::env::temp_dir`], starts `mariadbd` on its own port and socket as a child
//! process, and waits until `SELECT 1` answers over TCP. The test can then [`kill`] it
//! (SIGKILL), [`pause`] it (SIGSTOP), [`restart`] it on the same datadir and port (InnoDB crash
//! recovery), or [`stop`] it gracefully. Dropping the value kills the process and deletes the
//! datadir.
//!
//! Binaries are looked up on `PATH`, then in `/usr/sbin`, `/usr/local/mysql/bin` and
//! `/usr/local/bin`; `TASKQ_MARIADBD` and `TASKQ_MARIADB_INSTALL_DB` override them. When no
//! server binary exists (or the loopback interface is down), [`PrivateServer::start_or_skip`]
//! prints `SKIPPED private server: <test>: <why>` and returns `None`, so tests can return early;
//! set `TASKQ_REQUIRE_PRIVATE_SERVER=1` (as CI should) to make that a failure instead.
//!
//! Root logs in over TCP with an empty password (`--auth-root-authentication-method=normal`);
//! no `--skip-grant-tables` is needed. Durability settings are the server defaults
//! (`innodb_flush_log_at_trx_commit=1`), so a committed row survives [`kill`].
//!
//! [`kill`]: PrivateServer::kill
//! [`pause`]: PrivateServer::pause
//! [`restart`]: PrivateServer::restart
//! [`stop`]: PrivateServer::stop

use std::fmt;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use sqlx::mysql::MySqlConnectOptions;
use sqlx::{ConnectOptions, Connection, MySqlConnection};
use tokio::process::{Child, Command};

/// Prefix of the temporary directories, `taskq-private-db-<pid>-<random>`. Each holds `data/`
/// (the datadir), `tmp/` (the server's tmpdir: a shared `/tmp` made concurrent bootstraps
/// collide on temporary table files), `server.log`, `install.log`, `server.pid` and `s.sock`.
const DIR_PREFIX: &str = "taskq-private-db-";

/// How long [`PrivateServer::start`] and [`PrivateServer::restart`] wait for `SELECT 1`.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// Why a private server could not be started.
#[derive(Debug)]
pub enum StartError {
    /// No server binary on this machine: the test should be skipped.
    Unavailable(String),
    /// The binaries exist but starting failed: the test should fail.
    Failed(String),
}

impl fmt::Display for StartError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StartError::Unavailable(msg) => write!(f, "private database unavailable: {msg}"),
            StartError::Failed(msg) => write!(f, "private database failed to start: {msg}"),
        }
    }
}

impl std::error::Error for StartError {}

/// Which server family the binary belongs to; they initialise a datadir differently.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flavor {
    MariaDb,
    MySql,
}

/// The binaries used to initialise and run a server.
#[derive(Debug, Clone)]
pub(crate) struct Binaries {
    server: PathBuf,
    /// `mariadb-install-db` / `mysql_install_db`; `None` for MySQL (`mysqld --initialize-insecure`).
    install_db: Option<PathBuf>,
    flavor: Flavor,
}

/// A MariaDB/MySQL server process with its own temporary datadir, port and socket.
pub struct PrivateServer {
    bins: Binaries,
    dir: PathBuf,
    port: u16,
    extra_args: Vec<String>,
    child: Option<Child>,
    keep_dir: bool,
}

impl fmt::Debug for PrivateServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PrivateServer")
            .field("server", &self.bins.server)
            .field("dir", &self.dir)
            .field("port", &self.port)
            .field("pid", &self.pid())
            .finish()
    }
}

impl PrivateServer {
    /// Starts a fresh private server and waits until it answers `SELECT 1`.
    pub async fn start() -> Result<Self, StartError> {
        Self::start_with_args(&[]).await
    }

    /// Like [`start`](Self::start), with extra server options (e.g. `--max-connections=500`),
    /// kept for every [`restart`](Self::restart).
    pub async fn start_with_args(extra_args: &[&str]) -> Result<Self, StartError> {
        let bins = find_binaries()?;
        loopback_works()?;
        sweep_stale_dirs();
        let mut last_err = String::new();
        // The free port is only reserved until the listener is dropped; retry if it got taken.
        for _ in 0..3 {
            let dir = std::env::temp_dir().join(format!(
                "{DIR_PREFIX}{}-{:016x}",
                std::process::id(),
                fastrand::u64(..)
            ));
            let mut server = PrivateServer {
                bins: bins.clone(),
                dir,
                port: free_port().map_err(|e| StartError::Failed(format!("free port: {e}")))?,
                extra_args: extra_args.iter().map(|s| (*s).to_owned()).collect(),
                child: None,
                keep_dir: false,
            };
            std::fs::create_dir_all(server.dir.join("tmp"))
                .map_err(|e| StartError::Failed(format!("create {}: {e}", server.dir.display())))?;
            server.install_db().await.map_err(StartError::Failed)?;
            match server.spawn_and_wait().await {
                Ok(()) => return Ok(server),
                Err(e) => {
                    let port_taken =
                        e.contains("Address already in use") || e.contains("Bind on TCP/IP port");
                    last_err = e;
                    if !port_taken {
                        break;
                    }
                }
            }
        }
        Err(StartError::Failed(last_err))
    }

    /// Starts a private server, or prints `SKIPPED private server: <test>: <why>` and returns
    /// `None` when the machine has no server binary or no loopback (unless
    /// `TASKQ_REQUIRE_PRIVATE_SERVER` is set). Panics when the binaries exist but fail.
    ///
    /// ```ignore
    /// let Some(server) = PrivateServer::start_or_skip().await else { return };
    /// ```
    pub async fn start_or_skip() -> Option<Self> {
        Self::start_with_args_or_skip(&[]).await
    }

    /// [`start_or_skip`](Self::start_or_skip) with extra server options, as
    /// [`start_with_args`](Self::start_with_args).
    pub async fn start_with_args_or_skip(extra_args: &[&str]) -> Option<Self> {
        match Self::start_with_args(extra_args).await {
            Ok(server) => Some(server),
            Err(StartError::Unavailable(msg))
                if std::env::var_os("TASKQ_REQUIRE_PRIVATE_SERVER").is_none() =>
            {
                report_skip(&msg);
                None
            }
            Err(e) => panic!("{e}"),
        }
    }

    /// Whether a server binary exists on this machine and its loopback works (what
    /// [`start_or_skip`](Self::start_or_skip) checks before skipping).
    pub fn available() -> bool {
        find_binaries().is_ok() && loopback_works().is_ok()
    }

    /// `mysql://root@127.0.0.1:PORT`, without a database.
    pub fn url(&self) -> String {
        format!("mysql://root@127.0.0.1:{}", self.port)
    }

    /// `mysql://root@127.0.0.1:PORT/NAME`.
    pub fn database_url(&self, name: &str) -> String {
        format!("{}/{name}", self.url())
    }

    /// The TCP address the server listens on (stays the same across restarts).
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.port))
    }

    /// The TCP port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Connect options for `root` on this server, with `database` selected if non-empty.
    pub fn connect_options(&self, database: &str) -> MySqlConnectOptions {
        MySqlConnectOptions::new()
            .host("127.0.0.1")
            .port(self.port)
            .username("root")
            .database(database)
            .disable_statement_logging()
    }

    /// Opens one connection without a database selected.
    pub async fn connect(&self) -> sqlx::Result<MySqlConnection> {
        self.connect_options("").connect().await
    }

    /// Creates database `name` (if missing) and returns its URL.
    pub async fn create_database(&self, name: &str) -> sqlx::Result<String> {
        let mut conn = self.connect().await?;
        let sql = format!(
            "CREATE DATABASE IF NOT EXISTS `{}`",
            name.replace('`', "``")
        );
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
            .execute(&mut conn)
            .await?;
        conn.close().await?;
        Ok(self.database_url(name))
    }

    /// The temporary directory holding the datadir, logs and socket (removed on drop).
    pub fn root_dir(&self) -> &Path {
        &self.dir
    }

    /// The datadir (`<root_dir>/data`).
    pub fn datadir(&self) -> PathBuf {
        self.dir.join("data")
    }

    /// The server's error log (`<root_dir>/server.log`).
    pub fn log_path(&self) -> PathBuf {
        self.dir.join("server.log")
    }

    /// The last `lines` lines of the server's error log, for failure messages.
    pub fn log_tail(&self, lines: usize) -> String {
        tail(&self.log_path(), lines)
    }

    /// The server's process id while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().and_then(Child::id)
    }

    /// Whether the server process is running (it may still be paused or not yet answering).
    pub fn is_running(&mut self) -> bool {
        match self.child.as_mut() {
            Some(child) => matches!(child.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// Keeps the temporary directory after drop (for post-mortem debugging); the process is still killed.
    pub fn keep_datadir(&mut self) {
        self.keep_dir = true;
    }

    /// Kills the server with SIGKILL and waits until the process has exited. No-op if it is
    /// not running. A paused (SIGSTOPped) server is killed too.
    pub async fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.start_kill();
            let _ = child.wait().await;
        }
    }

    /// Shuts the server down gracefully (SIGTERM) and waits up to 60 s for it to exit, then
    /// kills it if it has not.
    pub async fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        if let Some(pid) = child.id() {
            signal(pid, "CONT");
            signal(pid, "TERM");
        }
        if tokio::time::timeout(Duration::from_secs(60), child.wait())
            .await
            .is_err()
        {
            let _ = child.start_kill();
            let _ = child.wait().await;
        }
    }

    /// Suspends the server process (SIGSTOP): connections stay open but nothing answers.
    pub fn pause(&self) {
        if let Some(pid) = self.pid() {
            signal(pid, "STOP");
        }
    }

    /// Resumes a [`pause`](Self::pause)d server (SIGCONT).
    pub fn resume(&self) {
        if let Some(pid) = self.pid() {
            signal(pid, "CONT");
        }
    }

    /// Starts the server again on the same datadir and port and waits until it answers.
    /// A running server is killed first (SIGKILL), so this is also "crash and recover".
    pub async fn restart(&mut self) -> Result<(), StartError> {
        self.kill().await;
        // The old process is gone, but give the port a few tries in case something else grabbed
        // it in the meantime (the server itself uses SO_REUSEADDR, so TIME_WAIT is no problem).
        let mut last = String::new();
        for _ in 0..5 {
            match self.spawn_and_wait().await {
                Ok(()) => return Ok(()),
                Err(e) => {
                    let port_taken =
                        e.contains("Address already in use") || e.contains("Bind on TCP/IP port");
                    last = e;
                    if !port_taken {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            }
        }
        Err(StartError::Failed(last))
    }

    /// Initialises the datadir.
    pub(crate) async fn install_db(&self) -> Result<(), String> {
        let root = self.dir.display().to_string();
        let log = std::fs::File::create(self.dir.join("install.log"))
            .map_err(|e| format!("create install.log: {e}"))?;
        let log2 = log.try_clone().map_err(|e| e.to_string())?;
        let mut cmd = match (&self.bins.install_db, self.bins.flavor) {
            (Some(install_db), Flavor::MariaDb) => {
                let mut cmd = Command::new(install_db);
                cmd.arg("--no-defaults")
                    .arg(format!("--datadir={root}/data"))
                    .arg(format!("--tmpdir={root}/tmp"))
                    .arg("--auth-root-authentication-method=normal")
                    .arg("--skip-test-db");
                if let Some(basedir) = basedir_for(&self.bins.server) {
                    cmd.arg(format!("--basedir={}", basedir.display()));
                }
                if is_root() {
                    cmd.arg("--user=root");
                }
                cmd
            }
            _ => {
                let mut cmd = Command::new(&self.bins.server);
                cmd.arg("--no-defaults")
                    .arg("--initialize-insecure")
                    .arg(format!("--datadir={root}/data"))
                    .arg(format!("--tmpdir={root}/tmp"));
                if is_root() {
                    cmd.arg("--user=root");
                }
                cmd
            }
        };
        cmd.stdin(Stdio::null())
            .stdout(log)
            .stderr(log2)
            .kill_on_drop(true);
        let status = cmd
            .status()
            .await
            .map_err(|e| format!("run {cmd:?}: {e}"))?;
        if !status.success() {
            let log = std::fs::read_to_string(self.dir.join("install.log")).unwrap_or_default();
            let errors: Vec<&str> = log
                .lines()
                .filter(|l| l.contains("ERROR") || l.contains("rror:"))
                .take(20)
                .collect();
            return Err(format!(
                "{cmd:?} exited with {status}; errors in its log:\n{}",
                errors.join("\n")
            ));
        }
        Ok(())
    }

    /// A server that is not started: `dir` is created (with `tmp/`), nothing else.
    pub(crate) fn unstarted(
        bins: Binaries,
        port: u16,
        extra_args: Vec<String>,
    ) -> Result<Self, StartError> {
        let dir = std::env::temp_dir().join(format!(
            "{DIR_PREFIX}{}-{:016x}",
            std::process::id(),
            fastrand::u64(..)
        ));
        std::fs::create_dir_all(dir.join("tmp"))
            .map_err(|e| StartError::Failed(format!("create {}: {e}", dir.display())))?;
        Ok(PrivateServer {
            bins,
            dir,
            port,
            extra_args,
            child: None,
            keep_dir: false,
        })
    }

    /// Replaces the extra server options used by the next start.
    pub fn set_extra_args(&mut self, args: Vec<String>) {
        self.extra_args = args;
    }

    /// The extra server options.
    pub fn extra_args(&self) -> &[String] {
        &self.extra_args
    }

    /// Runs the server binary once on this datadir with the usual options plus `args`
    /// (e.g. `--wsrep-recover`), its error log going to `<root_dir>/<log_name>`, and waits for
    /// it to exit. Returns that log.
    pub async fn run_once(&self, args: &[&str], log_name: &str) -> Result<String, String> {
        let log = self.dir.join(log_name);
        let mut cmd = self.command();
        cmd.args(args)
            .arg(format!("--log-error={}", log.display()))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true);
        let status = cmd
            .status()
            .await
            .map_err(|e| format!("run {cmd:?}: {e}"))?;
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if status.success() {
            Ok(text)
        } else {
            Err(format!("{cmd:?} exited with {status}; log:\n{text}"))
        }
    }

    /// The server command with every option but stdio.
    fn command(&self) -> Command {
        let root = self.dir.display().to_string();
        let mut cmd = Command::new(&self.bins.server);
        cmd.arg("--no-defaults")
            .arg(format!("--datadir={root}/data"))
            .arg(format!("--tmpdir={root}/tmp"))
            .arg(format!("--port={}", self.port))
            .arg("--bind-address=127.0.0.1")
            .arg(format!("--socket={root}/s.sock"))
            .arg(format!("--pid-file={root}/server.pid"))
            .arg(format!("--log-error={root}/server.log"))
            .arg("--skip-log-bin")
            .arg("--innodb-buffer-pool-size=32M");
        if self.bins.flavor == Flavor::MySql {
            cmd.arg("--mysqlx=OFF");
        }
        if is_root() {
            cmd.arg("--user=root");
        }
        cmd.args(&self.extra_args);
        cmd
    }

    /// Spawns the server process and waits until `SELECT 1` answers or it exits.
    pub(crate) async fn spawn_and_wait(&mut self) -> Result<(), String> {
        let log_len_before = self.spawn()?;
        self.wait_ready(log_len_before).await
    }

    /// Spawns the server process; returns the length of its log before, for [`Self::wait_ready`].
    pub(crate) fn spawn(&mut self) -> Result<u64, String> {
        let mut cmd = self.command();
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true);
        let log_len_before = std::fs::metadata(self.log_path()).map_or(0, |m| m.len());
        let child = cmd
            .spawn()
            .map_err(|e| format!("spawn {}: {e}", self.bins.server.display()))?;
        self.child = Some(child);
        Ok(log_len_before)
    }

    /// Waits until `SELECT 1` answers, or the process exits, or [`READY_TIMEOUT`] passes.
    pub(crate) async fn wait_ready(&mut self, log_len_before: u64) -> Result<(), String> {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                self.child = None;
                return Err(format!(
                    "server exited with {status} before answering; log:\n{}",
                    log_since(&self.log_path(), log_len_before)
                ));
            }
            let probe = async {
                let mut conn = self.connect().await?;
                sqlx::query_scalar::<_, i32>("SELECT 1")
                    .fetch_one(&mut conn)
                    .await?;
                conn.close().await
            };
            if let Ok(Ok(())) = tokio::time::timeout(Duration::from_secs(2), probe).await {
                return Ok(());
            }
            if Instant::now() > deadline {
                self.kill().await;
                return Err(format!(
                    "server did not answer SELECT 1 within {READY_TIMEOUT:?}; log:\n{}",
                    log_since(&self.log_path(), log_len_before)
                ));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for PrivateServer {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.start_kill();
            // Wait (briefly, synchronously) for the process to be gone before deleting its files.
            let deadline = Instant::now() + Duration::from_secs(5);
            while matches!(child.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        if !self.keep_dir {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// Finds the server and install binaries (environment overrides, `PATH`, usual locations).
pub(crate) fn find_binaries() -> Result<Binaries, StartError> {
    let server = std::env::var_os("TASKQ_MARIADBD")
        .map(PathBuf::from)
        .or_else(|| {
            find_program(
                &["mariadbd", "mysqld"],
                &[
                    "/usr/sbin",
                    "/usr/local/mysql/bin",
                    "/usr/local/bin",
                    "/usr/bin",
                ],
            )
        })
        .ok_or_else(|| {
            StartError::Unavailable(
                "no mariadbd or mysqld on PATH, in /usr/sbin or /usr/local/mysql/bin \
                 (set TASKQ_MARIADBD)"
                    .to_owned(),
            )
        })?;
    if !server.is_file() {
        // Only reachable through a TASKQ_MARIADBD that points nowhere: a misconfiguration.
        return Err(StartError::Failed(format!(
            "{} does not exist",
            server.display()
        )));
    }
    let version = std::process::Command::new(&server)
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    let flavor = if version.contains("MariaDB") || server.ends_with("mariadbd") {
        Flavor::MariaDb
    } else {
        Flavor::MySql
    };
    let install_db = match flavor {
        Flavor::MySql => None,
        Flavor::MariaDb => {
            let mut dirs: Vec<PathBuf> = Vec::new();
            if let Some(parent) = server.parent() {
                dirs.push(parent.to_path_buf());
                if let Some(base) = parent.parent() {
                    dirs.push(base.join("bin"));
                    dirs.push(base.join("scripts"));
                }
            }
            let found = std::env::var_os("TASKQ_MARIADB_INSTALL_DB")
                .map(PathBuf::from)
                .or_else(|| {
                    let dirs: Vec<&str> = dirs.iter().filter_map(|d| d.to_str()).collect();
                    find_program(&["mariadb-install-db", "mysql_install_db"], &dirs)
                });
            Some(found.ok_or_else(|| {
                StartError::Unavailable(format!(
                    "{} exists but no mariadb-install-db or mysql_install_db \
                     (set TASKQ_MARIADB_INSTALL_DB)",
                    server.display()
                ))
            })?)
        }
    };
    Ok(Binaries {
        server,
        install_db,
        flavor,
    })
}

/// The first of `names` found on `PATH`, then in `extra_dirs`.
fn find_program(names: &[&str], extra_dirs: &[&str]) -> Option<PathBuf> {
    let path_dirs: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    for name in names {
        let candidates = path_dirs
            .iter()
            .cloned()
            .chain(extra_dirs.iter().map(PathBuf::from));
        for dir in candidates {
            let candidate = dir.join(name);
            if candidate.is_file() {
                return Some(candidate);
            }
        }
    }
    None
}

/// For a tarball layout (`<base>/bin/mariadbd` with `<base>/share`), the base directory;
/// `None` for system installs under `/usr` or `/usr/local`.
fn basedir_for(server: &Path) -> Option<PathBuf> {
    let bin = server.parent()?;
    let base = bin.parent()?;
    let system = base == Path::new("/usr") || base == Path::new("/usr/local");
    (bin.ends_with("bin") && !system && base.join("share").is_dir()).then(|| base.to_path_buf())
}

/// Whether this process runs as root (mariadbd refuses to run as root without `--user=root`).
pub(crate) fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2).map(|euid| euid == "0"))
        })
        .unwrap_or(false)
}

/// A port that was free a moment ago on 127.0.0.1.
/// Prints `SKIPPED private server: <test>: <why>` to stderr (directly, so libtest's output
/// capture does not hide it).
pub(crate) fn report_skip(why: &str) {
    let thread = std::thread::current();
    let test = thread.name().unwrap_or("?");
    use std::io::Write as _;
    let _ = writeln!(std::io::stderr(), "SKIPPED private server: {test}: {why}");
}

/// Whether this machine can reach its own loopback over TCP (private servers listen on
/// `127.0.0.1`): a network namespace with `lo` down cannot (`Network is unreachable`), which
/// makes a private server as unavailable as a missing binary.
pub(crate) fn loopback_works() -> Result<(), StartError> {
    let unusable = |e: std::io::Error| {
        StartError::Unavailable(format!("no TCP over the loopback interface ({e})"))
    };
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).map_err(unusable)?;
    let addr = listener.local_addr().map_err(unusable)?;
    std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)).map_err(unusable)?;
    Ok(())
}

pub(crate) fn free_port() -> std::io::Result<u16> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
    Ok(listener.local_addr()?.port())
}

/// Sends `SIG<sig>` to `pid` with the `kill` command.
pub(crate) fn signal(pid: u32, sig: &str) {
    let _ = std::process::Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

/// Removes datadirs (and kills servers) left behind by test processes that no longer exist,
/// e.g. after the test binary itself was killed.
pub(crate) fn sweep_stale_dirs() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix(DIR_PREFIX)) else {
            continue;
        };
        let Some(owner) = rest.split('-').next().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if Path::new(&format!("/proc/{owner}")).exists() {
            continue;
        }
        let dir = entry.path();
        if let Some(pid) = std::fs::read_to_string(dir.join("server.pid"))
            .ok()
            .and_then(|s| s.trim().parse::<u32>().ok())
        {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            if String::from_utf8_lossy(&cmdline).contains(&*dir.to_string_lossy()) {
                signal(pid, "KILL");
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// The last `lines` lines of a file.
fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// What was appended to a file after byte `from` (the last 40 lines of it).
fn log_since(path: &Path, from: u64) -> String {
    let bytes = std::fs::read(path).unwrap_or_default();
    let start = usize::try_from(from).unwrap_or(0).min(bytes.len());
    let text = String::from_utf8_lossy(&bytes[start..]);
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(40)..].join("\n")
}

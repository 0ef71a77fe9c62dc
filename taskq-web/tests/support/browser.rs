//! Headless Chromium driven over WebDriver (Debian's `chromium` and `chromium-driver`), for the
//! dashboard's browser tests.
//!
//! [`Browser::start`] finds `chromedriver` and Chromium, starts chromedriver on a free loopback
//! port and opens a session of a headless Chromium with a fresh profile; dropping the
//! [`Browser`] ends both and removes the profile. When either program is missing, or the
//! machine has no usable loopback interface (`unshare -n`), it returns `None` after saying so
//! on stderr (`SKIPPED browser: …`, `SKIPPED loopback: …`), so the tests pass as skipped,
//! unless `TASKQ_REQUIRE_BROWSER=1` (set by CI) makes that a failure.
//!
//! Everything Chromium writes goes into one temporary folder, [`Profile`] (the
//! `--user-data-dir`; `XDG_CONFIG_HOME`, `XDG_CACHE_HOME` and `TMPDIR` for its crash reports,
//! caches and scoped temporary folders): dropping it, also while a failed assertion unwinds, ends the processes using it
//! and removes it.
//!
//! Overrides: `TASKQ_CHROMEDRIVER` and `TASKQ_CHROMIUM` (paths of the programs).

use std::io::Write as _;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use fantoccini::{Client, ClientBuilder, Locator};
use hyper_util::client::legacy::connect::HttpConnector;
use serde_json::{Value, json};

/// A headless Chromium session and the chromedriver serving it.
pub struct Browser {
    /// The WebDriver client.
    pub client: Client,
    driver: tokio::process::Child,
    // Last: dropped after the driver is killed.
    profile: Profile,
}

/// The temporary folder of one browser session (in `$TMPDIR`): Chromium's profile, its
/// config and cache folders, chromedriver's log. Dropping it ends the processes started with
/// it (by pid, found by the `--user-data-dir` in their command line) and removes it, whether
/// the test passed or panicked.
pub struct Profile(PathBuf);

impl Profile {
    fn create() -> Self {
        let dir = std::env::temp_dir().join(format!(
            "taskq-chromium-{}-{}",
            std::process::id(),
            free_port()
        ));
        std::fs::create_dir_all(dir.join("tmp")).expect("a fresh Chromium profile directory");
        Self(dir)
    }

    /// Its path.
    pub fn path(&self) -> &Path {
        &self.0
    }

    /// Chromium's `--user-data-dir`.
    fn user_data_dir(&self) -> PathBuf {
        self.0.join("profile")
    }

    /// Pids of the live processes started with this profile: chromedriver and the Chromium
    /// browser (found by the `TASKQ_BROWSER_PROFILE` variable in their environment or the
    /// `--user-data-dir` in their command line), its crash handlers, and every descendant of
    /// those (zygotes, renderers, the GPU, network and storage processes, which rewrite
    /// their environment and command line).
    pub fn processes(&self) -> Vec<u32> {
        let marker = format!("--user-data-dir={}", self.user_data_dir().display());
        let env = format!("TASKQ_BROWSER_PROFILE={}", self.0.display());
        processes_with(&marker, &env)
    }
}

impl Drop for Profile {
    fn drop(&mut self) {
        // A session not ended by `quit` (a failed assertion) leaves its Chromium running,
        // writing into the folder: end it first (TERM, then KILL after 2 s), then remove the
        // folder.
        for signal in ["-TERM", "-KILL"] {
            let pids = self.processes();
            if pids.is_empty() {
                break;
            }
            for pid in pids {
                let _ = std::process::Command::new("kill")
                    .args([signal, &pid.to_string()])
                    .status();
            }
            let deadline = std::time::Instant::now() + Duration::from_secs(2);
            while !self.processes().is_empty() && std::time::Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        for _ in 0..3 {
            if std::fs::remove_dir_all(&self.0).is_ok() || !self.0.exists() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = writeln!(
            std::io::stderr(),
            "could not remove the browser profile {}",
            self.0.display()
        );
    }
}

/// Programs the browser tests need.
struct Tools {
    chromedriver: PathBuf,
    chromium: PathBuf,
}

/// `name` in `PATH` (or the path in `env` when set).
fn which(env: &str, names: &[&str]) -> Option<PathBuf> {
    if let Some(p) = std::env::var_os(env) {
        let p = PathBuf::from(p);
        return p.is_file().then_some(p);
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    names.iter().find_map(|n| {
        std::env::split_paths(&path)
            .map(|d| d.join(n))
            .find(|p| p.is_file())
    })
}

fn find_tools() -> Result<Tools, String> {
    let chromedriver = which("TASKQ_CHROMEDRIVER", &["chromedriver"]);
    let chromium = which(
        "TASKQ_CHROMIUM",
        &["chromium", "chromium-browser", "google-chrome"],
    );
    match (chromedriver, chromium) {
        (Some(chromedriver), Some(chromium)) => Ok(Tools {
            chromedriver,
            chromium,
        }),
        (d, c) => Err([
            d.is_none().then_some("chromedriver"),
            c.is_none().then_some("chromium"),
        ]
        .into_iter()
        .flatten()
        .collect::<Vec<_>>()
        .join(" and ")),
    }
}

/// Whether a missing browser fails the test (`TASKQ_REQUIRE_BROWSER=1`, as CI sets it).
pub fn browser_required() -> bool {
    std::env::var("TASKQ_REQUIRE_BROWSER").is_ok_and(|v| v == "1")
}

/// Where screenshots go: `docs/dashboard/` when `TASKQ_UPDATE_SCREENSHOTS=1` (to refresh the
/// ones the guide shows), else `dashboard-screenshots/` in cargo's temporary directory for
/// tests (`target/tmp`), so that an ordinary test run leaves the work tree clean.
pub fn screenshot_dir() -> PathBuf {
    if std::env::var("TASKQ_UPDATE_SCREENSHOTS").is_ok_and(|v| v == "1") {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/dashboard")
    } else {
        Path::new(env!("CARGO_TARGET_TMPDIR")).join("dashboard-screenshots")
    }
}

/// A loopback port nobody listens on right now.
fn free_port() -> u16 {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

impl Browser {
    /// Starts chromedriver and a headless Chromium session, or returns `None` (after saying
    /// plainly on stderr that `test` was skipped, and why) when either is not installed or
    /// the machine has no usable loopback interface, and [`browser_required`] is false.
    /// Panics when they are there but do not start.
    pub async fn start(test: &str) -> Option<Browser> {
        let skip = |kind: &str, why: String| {
            if browser_required() {
                panic!("{test}: {why}, and TASKQ_REQUIRE_BROWSER=1 requires the browser tests");
            }
            // Straight to stderr: libtest captures `eprintln!` of passing tests.
            let _ = writeln!(
                std::io::stderr(),
                "SKIPPED {kind}: {test}: {why}; set TASKQ_REQUIRE_BROWSER=1 to make this a failure"
            );
        };
        let tools = match find_tools() {
            Ok(t) => t,
            Err(missing) => {
                skip(
                    "browser",
                    format!(
                        "{missing} not installed (Debian: apt-get install chromium chromium-driver)"
                    ),
                );
                return None;
            }
        };
        // chromedriver listens on 127.0.0.1 and the dashboard is served there.
        if let Err(why) = taskq_tests::loopback_check() {
            skip("loopback", why);
            return None;
        }
        let profile = Profile::create();
        let port = free_port();
        let mut driver = tokio::process::Command::new(&tools.chromedriver)
            .arg(format!("--port={port}"))
            .arg(format!(
                "--log-path={}",
                profile.0.join("chromedriver.log").display()
            ))
            // Chromium's crash-report database and caches go under the profile folder too,
            // not under the home directory.
            .env("XDG_CONFIG_HOME", profile.0.join("config"))
            .env("XDG_CACHE_HOME", profile.0.join("cache"))
            // Its scoped temporary folders (`org.chromium.Chromium.*`) as well.
            .env("TMPDIR", profile.0.join("tmp"))
            // How `Profile` finds every process of this session.
            .env("TASKQ_BROWSER_PROFILE", &profile.0)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", tools.chromedriver.display()));
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
        let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
        while tokio::net::TcpStream::connect(addr).await.is_err() {
            if let Ok(Some(status)) = driver.try_wait() {
                panic!(
                    "chromedriver exited at start ({status}):\n{}",
                    log_tail(&profile)
                );
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "chromedriver did not listen on {addr} within 15 s:\n{}",
                log_tail(&profile)
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let mut caps = serde_json::Map::new();
        caps.insert("browserName".into(), json!("chrome"));
        // Leave any alert() open, so that the tests can see it (the default dismisses it).
        caps.insert("unhandledPromptBehavior".into(), json!("ignore"));
        caps.insert(
            "goog:chromeOptions".into(),
            json!({
                "binary": tools.chromium,
                "args": [
                    "--headless",
                    "--no-sandbox",
                    "--disable-gpu",
                    "--disable-dev-shm-usage",
                    "--disable-background-networking",
                    "--disable-component-update",
                    "--no-first-run",
                    "--window-size=1280,860",
                    "--force-device-scale-factor=1",
                    format!("--user-data-dir={}", profile.user_data_dir().display()),
                ],
            }),
        );
        let client = ClientBuilder::new(HttpConnector::new())
            .capabilities(caps)
            .connect(&format!("http://{addr}"))
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "no Chromium session through chromedriver: {e}\n{}",
                    log_tail(&profile)
                )
            });
        Some(Browser {
            client,
            driver,
            profile,
        })
    }

    /// Opens `url` and returns the page's visible text.
    pub async fn open(&self, url: &str) -> String {
        self.client
            .goto(url)
            .await
            .unwrap_or_else(|e| panic!("open {url}: {e}"));
        self.text().await
    }

    /// The visible text of the page (`document.body.innerText`).
    pub async fn text(&self) -> String {
        self.eval("return document.body ? document.body.innerText : ''")
            .await
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }

    /// Runs `script` (a function body; `return` a value) in the page.
    pub async fn eval(&self, script: &str) -> Value {
        self.client
            .execute(script, vec![])
            .await
            .unwrap_or_else(|e| panic!("execute {script:?}: {e}"))
    }

    /// The visible text of the first element matching `css`.
    pub async fn text_of(&self, css: &str) -> String {
        self.client
            .find(Locator::Css(css))
            .await
            .unwrap_or_else(|e| panic!("no element {css:?}: {e}"))
            .text()
            .await
            .unwrap()
    }

    /// Clicks the first element matching `css` (a link or a form's button), and waits for
    /// the page it leads to to load (chromedriver's click does not wait for the navigation of
    /// a form POST).
    pub async fn click(&self, css: &str) {
        let el = self
            .client
            .find(Locator::Css(css))
            .await
            .unwrap_or_else(|e| panic!("no element {css:?} to click: {e}"));
        self.eval("document.documentElement.dataset.taskqTestOld = '1'; return null")
            .await;
        el.click()
            .await
            .unwrap_or_else(|e| panic!("click {css:?}: {e}"));
        self.wait_new_page(css).await;
    }

    /// Waits (up to 10 s) until the page marked before a click has been replaced by a loaded
    /// one.
    async fn wait_new_page(&self, what: &str) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let loaded = self
                .client
                .execute(
                    "return document.readyState === 'complete' && !document.documentElement.dataset.taskqTestOld",
                    vec![],
                )
                .await
                .is_ok_and(|v| v == true);
            if loaded {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "no new page 10 s after clicking {what:?}"
            );
            tokio::time::sleep(Duration::from_millis(30)).await;
        }
    }

    /// Types `text` into the first element matching `css`.
    pub async fn type_into(&self, css: &str, text: &str) {
        self.client
            .find(Locator::Css(css))
            .await
            .unwrap_or_else(|e| panic!("no element {css:?} to type into: {e}"))
            .send_keys(text)
            .await
            .unwrap();
    }

    /// The path of the current page (`/ops/taskq/tasks/5`).
    pub async fn path(&self) -> String {
        self.client.current_url().await.unwrap().path().to_owned()
    }

    /// Waits (up to 10 s) until the browser is at path `expected` with the page loaded, as
    /// after a click that submits a form; panics with the page's text otherwise.
    pub async fn wait_path(&self, expected: &str) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let ready = self
                .client
                .execute("return document.readyState", vec![])
                .await
                .is_ok_and(|v| v == "complete");
            if ready && self.path().await == expected {
                return;
            }
            if tokio::time::Instant::now() > deadline {
                panic!(
                    "still at {} (not {expected}) after 10 s:\n{}",
                    self.path().await,
                    self.text().await
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The text of an open alert/confirm/prompt dialog, if one is open.
    pub async fn open_dialog(&self) -> Option<String> {
        self.client.get_alert_text().await.ok()
    }

    /// Saves a PNG of the whole page (the window grown to the page's height, at most
    /// 2,400 px) as `name` in [`screenshot_dir`] and returns its path.
    pub async fn screenshot(&self, name: &str) -> PathBuf {
        let page_height = || async {
            let v = self
                .eval("return [document.documentElement.scrollHeight, window.innerHeight]")
                .await;
            let n = |i: usize| v[i].as_u64().unwrap_or(860) as u32;
            (n(0), n(1))
        };
        // The window's height includes what is not viewport: grow it until the viewport
        // holds the page.
        let mut window = 860;
        for _ in 0..3 {
            let (page, viewport) = page_height().await;
            let want = page.clamp(860, 2_400);
            if viewport >= want {
                break;
            }
            window += want - viewport;
            self.client.set_window_size(1280, window).await.unwrap();
        }
        let png = self.client.screenshot().await.unwrap();
        self.client.set_window_size(1280, 860).await.unwrap();
        assert!(
            png.starts_with(b"\x89PNG\r\n\x1a\n") && png.len() > 4_000,
            "{name}: not a PNG of a rendered page ({} bytes)",
            png.len()
        );
        let dir = screenshot_dir();
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(name);
        std::fs::write(&path, png).unwrap();
        path
    }

    /// Ends the session (closes Chromium) and chromedriver.
    pub async fn quit(mut self) {
        let client = self.client.clone();
        let _ = client.close().await;
        let _ = self.driver.kill().await;
    }
}

impl Browser {
    /// The session's temporary folder (removed when the browser is dropped).
    pub fn profile(&self) -> &Profile {
        &self.profile
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.driver.start_kill();
        // Then `profile` drops: it ends Chromium and removes the folder.
    }
}

/// The last 30 lines of chromedriver's log.
fn log_tail(profile: &Profile) -> String {
    let log = std::fs::read_to_string(profile.0.join("chromedriver.log")).unwrap_or_default();
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}

/// Pids of the live processes (on Linux) whose command line has the argument `arg` or whose
/// environment has the entry `var` (`NAME=value`), and of all their descendants. Zombies
/// (exited, not yet reaped) are left out: they write nothing.
fn processes_with(arg: &str, var: &str) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return vec![];
    };
    let has = |pid: u32, file: &str, entry: &str| {
        std::fs::read(format!("/proc/{pid}/{file}"))
            .is_ok_and(|c| c.split(|b| *b == 0).any(|a| a == entry.as_bytes()))
    };
    // (pid, parent) of the live processes, from `/proc/PID/stat` ("pid (comm) S ppid ...").
    let live: Vec<(u32, u32)> = dir
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            let mut rest = stat.rsplit_once(')')?.1.split_whitespace();
            let state = rest.next()?;
            let ppid = rest.next()?.parse().ok()?;
            (state != "Z").then_some((pid, ppid))
        })
        .collect();
    let mut found: std::collections::HashSet<u32> = live
        .iter()
        .map(|&(pid, _)| pid)
        .filter(|&pid| has(pid, "cmdline", arg) || has(pid, "environ", var))
        .collect();
    loop {
        let before = found.len();
        for &(pid, ppid) in &live {
            if found.contains(&ppid) {
                found.insert(pid);
            }
        }
        if found.len() == before {
            break;
        }
    }
    found.into_iter().collect()
}

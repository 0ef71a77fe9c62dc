//! Headless Chromium driven over WebDriver (Debian's `chromium` and `chromium-driver`), for the
//! dashboard's browser tests.
//!
//! [`Browser::start`] finds `chromedriver` and Chromium, starts chromedriver on a free loopback
//! port and opens a session of a headless Chromium with a fresh profile; dropping the
//! [`Browser`] ends both and removes the profile. When either program is missing it returns
//! `None` after saying so on stderr, so the tests pass as "skipped" on a machine without a
//! browser, unless `TASKQ_REQUIRE_BROWSER=1` (set by CI) makes that a failure.
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
    profile: PathBuf,
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
    /// plainly on stderr that `test` was skipped) when either is not installed and
    /// [`browser_required`] is false. Panics when they are installed but do not start.
    pub async fn start(test: &str) -> Option<Browser> {
        let tools = match find_tools() {
            Ok(t) => t,
            Err(missing) => {
                let why = format!(
                    "{missing} not installed (Debian: apt-get install chromium chromium-driver)"
                );
                if browser_required() {
                    panic!("{test}: {why}, and TASKQ_REQUIRE_BROWSER=1 requires the browser tests");
                }
                // Straight to stderr: libtest captures `eprintln!` of passing tests.
                let _ = writeln!(
                    std::io::stderr(),
                    "{test}: SKIPPED: {why}; set TASKQ_REQUIRE_BROWSER=1 to make this a failure"
                );
                return None;
            }
        };
        let profile = std::env::temp_dir().join(format!(
            "taskq-chromium-{}-{}",
            std::process::id(),
            free_port()
        ));
        std::fs::create_dir_all(&profile).expect("a fresh Chromium profile directory");
        let port = free_port();
        let driver = tokio::process::Command::new(&tools.chromedriver)
            .arg(format!("--port={port}"))
            .arg(format!(
                "--log-path={}",
                profile.join("chromedriver.log").display()
            ))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", tools.chromedriver.display()));
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
        let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
        while tokio::net::TcpStream::connect(addr).await.is_err() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "chromedriver did not listen on {addr} within 15 s"
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
                    format!("--user-data-dir={}", profile.join("profile").display()),
                ],
            }),
        );
        let client = ClientBuilder::new(HttpConnector::new())
            .capabilities(caps)
            .connect(&format!("http://{addr}"))
            .await
            .unwrap_or_else(|e| {
                let log =
                    std::fs::read_to_string(profile.join("chromedriver.log")).unwrap_or_default();
                let tail: String = log
                    .lines()
                    .rev()
                    .take(30)
                    .collect::<Vec<_>>()
                    .into_iter()
                    .rev()
                    .collect::<Vec<_>>()
                    .join("\n");
                panic!("no Chromium session through chromedriver: {e}\n{tail}")
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

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.driver.start_kill();
        // A session not ended by `quit` (a failed assertion) leaves its Chromium running:
        // end the processes started with this test's own profile directory, by pid.
        let marker = format!("--user-data-dir={}", self.profile.join("profile").display());
        for pid in processes_with_arg(&marker) {
            let _ = std::process::Command::new("kill")
                .arg(pid.to_string())
                .status();
        }
        let _ = std::fs::remove_dir_all(&self.profile);
    }
}

/// Pids of the processes (on Linux) whose command line has the argument `arg`.
fn processes_with_arg(arg: &str) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return vec![];
    };
    dir.filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| c.split(|b| *b == 0).any(|a| a == arg.as_bytes()))
        })
        .collect()
}

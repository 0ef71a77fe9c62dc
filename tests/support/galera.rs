//! A three-node MariaDB Galera cluster of private servers on loopback ports, owned by one test.
//!
//! [`GaleraCluster::start`] initialises one datadir with `mariadb-install-db`, copies it to the
//! three nodes, and starts them together with `--wsrep-on` (galera-4's
//! `libgalera_smm.so`), `gcomm://` addresses on loopback ports, ROW binlog format and
//! `innodb_autoinc_lock_mode=2`. Each node has its own SQL, gcomm (`base_port`) and IST port.
//!
//! **No state transfer at formation.** Instead of bootstrapping node 1 (`--wsrep-new-cluster`)
//! and letting the others join by SST, every node starts from the same seeded datadir with the
//! same saved state (`grastate.dat`: one cluster UUID, seqno 0) and the same saved primary view
//! (`gvwstate.dat`, listing the three nodes): Galera's primary-component recovery
//! (`pc.recovery`, on by default) then forms the primary component as soon as all three meet,
//! with nothing to transfer (about 4 s on a laptop). A node that was killed rejoins by
//! incremental state transfer (IST) from a survivor's gcache: [`GaleraCluster::rejoin`] first
//! runs `mariadbd --wsrep-recover` to read the node's last committed position from InnoDB, as
//! the `galera_recovery` script of the packaged service does, and starts it with
//! `--wsrep-start-position`. A full SST is never needed in these tests. The SST method is still
//! rsync, because the donor's IST runs through it too (it sends a completion marker into the
//! joiner's datadir through an rsync daemon, which as root drops to `nobody`): when the tests
//! run as root, each datadir is therefore handed to `nobody` (`chown -R`) before first start.
//!
//! Failure detection is tuned for tests (`evs.suspect_timeout=PT2S`,
//! `evs.inactive_timeout=PT3S`): a killed or isolated node is evicted within about 3 s.
//! [`GaleraCluster::isolate`] cuts one node off the group communication
//! (`gmcast.isolate=1`, a Galera test option): it becomes a non-primary component of one and
//! refuses application statements (`WSREP has not yet prepared node for application use`,
//! error 1047) while the other two keep quorum.
//!
//! [`GaleraCluster::start_or_skip`] prints `SKIPPED private server: …` and returns `None` when
//! there is no server binary, no loopback or no Galera provider, unless `TASKQ_REQUIRE_PRIVATE_SERVER` is set (CI).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use sqlx::{Connection, MySqlConnection};

use crate::server::{
    PrivateServer, StartError, find_binaries, free_port, is_root, loopback_works, sweep_stale_dirs,
};

/// Where Debian's `galera-4` installs the provider; `TASKQ_GALERA_PROVIDER` overrides it.
pub const DEFAULT_PROVIDER: &str = "/usr/lib/galera/libgalera_smm.so";

/// The cluster's state UUID, written to every seeded node.
const CLUSTER_UUID: &str = "7a5c0e10-ecc8-11f1-8000-00000000a1e4";

/// How long formation and rejoins may take.
const SYNC_TIMEOUT: Duration = Duration::from_secs(60);

/// A node's view of the cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeStatus {
    /// `wsrep_cluster_status`: `Primary`, `non-Primary` or `Disconnected`.
    pub cluster_status: String,
    /// `wsrep_local_state_comment`: `Synced`, `Donor/Desynced`, `Joining`, …
    pub local_state: String,
    /// `wsrep_cluster_size`.
    pub size: u32,
    /// `wsrep_ready`: whether it accepts application statements.
    pub ready: bool,
}

/// Three private MariaDB servers forming one Galera cluster. Dropping it kills them all and
/// deletes their datadirs.
pub struct GaleraCluster {
    nodes: Vec<PrivateServer>,
    /// gcomm (group communication) port of each node.
    gcomm: Vec<u16>,
}

impl GaleraCluster {
    /// The Galera provider library, if installed.
    pub fn provider() -> Option<PathBuf> {
        let p = std::env::var_os("TASKQ_GALERA_PROVIDER")
            .map_or_else(|| PathBuf::from(DEFAULT_PROVIDER), PathBuf::from);
        p.is_file().then_some(p)
    }

    /// Starts a cluster, or prints why not and returns `None` when no server binary or Galera
    /// provider is installed (unless `TASKQ_REQUIRE_PRIVATE_SERVER` is set). Panics when they
    /// exist but the cluster does not form.
    pub async fn start_or_skip() -> Option<Self> {
        match Self::start().await {
            Ok(c) => Some(c),
            Err(StartError::Unavailable(msg))
                if std::env::var_os("TASKQ_REQUIRE_PRIVATE_SERVER").is_none() =>
            {
                super::server::report_skip(&msg);
                None
            }
            Err(e) => panic!("{e}"),
        }
    }

    /// Starts three seeded nodes together and waits until all are `Synced` in a primary
    /// component of three.
    pub async fn start() -> Result<Self, StartError> {
        let bins = find_binaries()?;
        loopback_works()?;
        let provider = Self::provider().ok_or_else(|| {
            StartError::Unavailable(format!(
                "no Galera provider at {DEFAULT_PROVIDER} (install galera-4, or set TASKQ_GALERA_PROVIDER)"
            ))
        })?;
        sweep_stale_dirs();
        let port = || free_port().map_err(|e| StartError::Failed(format!("free port: {e}")));
        let sql: Vec<u16> = (0..3).map(|_| port()).collect::<Result<_, _>>()?;
        let gcomm: Vec<u16> = (0..3).map(|_| port()).collect::<Result<_, _>>()?;
        let ist: Vec<u16> = (0..3).map(|_| port()).collect::<Result<_, _>>()?;
        let sst: Vec<u16> = (0..3).map(|_| port()).collect::<Result<_, _>>()?;
        let address = format!(
            "gcomm://{}",
            gcomm
                .iter()
                .map(|p| format!("127.0.0.1:{p}"))
                .collect::<Vec<_>>()
                .join(",")
        );
        let mut nodes = Vec::new();
        for i in 0..3 {
            let args = vec![
                "--wsrep-on=ON".to_owned(),
                format!("--wsrep-provider={}", provider.display()),
                format!("--wsrep-cluster-address={address}"),
                format!("--wsrep-node-address=127.0.0.1:{}", gcomm[i]),
                format!("--wsrep-node-name=node{}", i + 1),
                "--wsrep-sst-method=rsync".to_owned(),
                format!("--wsrep-sst-receive-address=127.0.0.1:{}", sst[i]),
                format!(
                    "--wsrep-provider-options=base_port={};ist.recv_addr=127.0.0.1:{};\
                     gcache.size=32M;cert.log_conflicts=yes;evs.suspect_timeout=PT2S;evs.inactive_timeout=PT3S;\
                     evs.install_timeout=PT2S;evs.keepalive_period=PT0.5S",
                    gcomm[i], ist[i]
                ),
                "--binlog-format=ROW".to_owned(),
                "--wsrep-log-conflicts=ON".to_owned(),
                "--innodb-autoinc-lock-mode=2".to_owned(),
                "--default-storage-engine=InnoDB".to_owned(),
                "--innodb-flush-log-at-trx-commit=2".to_owned(),
                "--max-connections=300".to_owned(),
            ];
            nodes.push(PrivateServer::unstarted(bins.clone(), sql[i], args)?);
        }
        nodes[0].install_db().await.map_err(StartError::Failed)?;
        for node in &nodes[1..] {
            copy_dir(&nodes[0].datadir(), &node.datadir()).map_err(StartError::Failed)?;
        }
        // Node UUIDs of the saved primary view; the view id names the first.
        let uuids: Vec<String> = (1..=3)
            .map(|i| format!("{i}{i}{i}{i}{i}{i}{i}{i}-ecc8-11f1-8000-00000000000{i}"))
            .collect();
        for (i, node) in nodes.iter().enumerate() {
            let data = node.datadir();
            std::fs::write(
                data.join("grastate.dat"),
                format!(
                    "# GALERA saved state\nversion: 2.1\nuuid:    {CLUSTER_UUID}\nseqno:   0\nsafe_to_bootstrap: 0\n"
                ),
            )
            .map_err(|e| StartError::Failed(format!("write grastate.dat: {e}")))?;
            let members: String = uuids.iter().map(|u| format!("member: {u} 0\n")).collect();
            std::fs::write(
                data.join("gvwstate.dat"),
                format!(
                    "my_uuid: {}\n#vwbeg\nview_id: 3 {} 1\nbootstrap: 0\n{members}#vwend\n",
                    uuids[i], uuids[0]
                ),
            )
            .map_err(|e| StartError::Failed(format!("write gvwstate.dat: {e}")))?;
        }
        if is_root() {
            // The joiner side of rsync SST runs an rsync daemon, which drops root for `nobody`;
            // even an IST writes a marker file through it into the datadir.
            for node in &nodes {
                chown_nobody(&node.datadir()).map_err(StartError::Failed)?;
            }
        }
        let mut before = Vec::new();
        for node in &mut nodes {
            before.push(node.spawn().map_err(StartError::Failed)?);
        }
        if std::env::var_os("TASKQ_GALERA_KEEP").is_some() {
            // For post-mortems: the datadirs and logs stay in the temp directory.
            for node in &mut nodes {
                node.keep_datadir();
            }
        }
        let mut cluster = GaleraCluster { nodes, gcomm };
        for (i, len) in before.into_iter().enumerate() {
            cluster.nodes[i]
                .wait_ready(len)
                .await
                .map_err(StartError::Failed)?;
        }
        for i in 0..3 {
            cluster
                .wait_synced(i, 3)
                .await
                .map_err(StartError::Failed)?;
        }
        Ok(cluster)
    }

    /// Node `i` (0, 1 or 2).
    pub fn node(&self, i: usize) -> &PrivateServer {
        &self.nodes[i]
    }

    /// Node `i`, mutably.
    pub fn node_mut(&mut self, i: usize) -> &mut PrivateServer {
        &mut self.nodes[i]
    }

    /// The gcomm port of node `i`.
    pub fn gcomm_port(&self, i: usize) -> u16 {
        self.gcomm[i]
    }

    /// Node `i`'s view of the cluster (`None` when it does not answer).
    pub async fn status(&self, i: usize) -> Option<NodeStatus> {
        let mut conn = tokio::time::timeout(Duration::from_secs(2), self.nodes[i].connect())
            .await
            .ok()?
            .ok()?;
        let rows: Vec<(String, String)> = sqlx::query_as(
            "SHOW STATUS WHERE Variable_name IN ('wsrep_cluster_status', \
             'wsrep_local_state_comment', 'wsrep_cluster_size', 'wsrep_ready')",
        )
        .fetch_all(&mut conn)
        .await
        .ok()?;
        let _ = conn.close().await;
        let get = |k: &str| {
            rows.iter()
                .find(|(n, _)| n.eq_ignore_ascii_case(k))
                .map(|(_, v)| v.clone())
                .unwrap_or_default()
        };
        Some(NodeStatus {
            cluster_status: get("wsrep_cluster_status"),
            local_state: get("wsrep_local_state_comment"),
            size: get("wsrep_cluster_size").parse().unwrap_or(0),
            ready: get("wsrep_ready") == "ON",
        })
    }

    /// Waits until node `i` is `Synced` and ready in a primary component of `size` nodes.
    pub async fn wait_synced(&self, i: usize, size: u32) -> Result<(), String> {
        let deadline = Instant::now() + SYNC_TIMEOUT;
        let mut last = None;
        while Instant::now() < deadline {
            last = self.status(i).await;
            if let Some(s) = &last
                && s.cluster_status == "Primary"
                && s.local_state == "Synced"
                && s.ready
                && s.size == size
            {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Err(format!(
            "node {} not synced in a cluster of {size} within {SYNC_TIMEOUT:?} (last: {last:?}); log:\n{}",
            i + 1,
            self.nodes[i].log_tail(30)
        ))
    }

    /// Waits until node `i` has left the primary component (`wsrep_ready=OFF`).
    pub async fn wait_not_ready(&self, i: usize, timeout: Duration) -> Result<(), String> {
        let deadline = Instant::now() + timeout;
        let mut last = None;
        while Instant::now() < deadline {
            last = self.status(i).await;
            if last.as_ref().is_some_and(|s| !s.ready) {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Err(format!(
            "node {} still ready after {timeout:?} ({last:?})",
            i + 1
        ))
    }

    /// Kills node `i` with SIGKILL.
    pub async fn kill(&mut self, i: usize) {
        self.nodes[i].kill().await;
    }

    /// Restarts a killed (or stopped) node `i` and waits until it is back in sync with the
    /// others: recovers its last committed position from InnoDB (`--wsrep-recover`), starts it
    /// at that position, and lets it catch up by IST. `size` is the cluster size to wait for.
    pub async fn rejoin(&mut self, i: usize, size: u32) -> Result<(), String> {
        self.nodes[i].kill().await;
        let log = self.nodes[i]
            .run_once(&["--wsrep-recover"], "recover.log")
            .await?;
        let position = log
            .lines()
            .rev()
            .find_map(|l| l.split("WSREP: Recovered position: ").nth(1))
            .map(|p| p.trim().to_owned())
            .ok_or_else(|| format!("no recovered position in the --wsrep-recover log:\n{log}"))?;
        let mut args: Vec<String> = self.nodes[i]
            .extra_args()
            .iter()
            .filter(|a| !a.starts_with("--wsrep-start-position="))
            .cloned()
            .collect();
        args.push(format!("--wsrep-start-position={position}"));
        self.nodes[i].set_extra_args(args);
        if let Err(e) = self.nodes[i].restart().await {
            let donors: String = (0..self.nodes.len())
                .filter(|&j| j != i)
                .map(|j| {
                    let log = std::fs::read_to_string(self.nodes[j].log_path()).unwrap_or_default();
                    let lines: Vec<&str> = log
                        .lines()
                        .filter(|l| l.contains("SST") || l.contains("IST") || l.contains("rsync"))
                        .collect();
                    format!(
                        "node {} (possible donor):\n{}\n",
                        j + 1,
                        lines[lines.len().saturating_sub(15)..].join("\n")
                    )
                })
                .collect();
            return Err(format!("restart node {}: {e}\n{donors}", i + 1));
        }
        self.wait_synced(i, size).await
    }

    /// Cuts node `i` off the group communication (`on`), or lets it reconnect: an isolated
    /// node forms a non-primary component of one and refuses application statements.
    pub async fn isolate(&self, i: usize, on: bool) -> sqlx::Result<()> {
        let mut conn: MySqlConnection = self.nodes[i].connect().await?;
        let sql = format!(
            "SET GLOBAL wsrep_provider_options = 'gmcast.isolate={}'",
            u8::from(on)
        );
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
            .execute(&mut conn)
            .await?;
        conn.close().await
    }

    /// Creates database `name` (replicated to every node) and returns its URL on each node.
    pub async fn create_database(&self, name: &str) -> sqlx::Result<Vec<String>> {
        self.nodes[0].create_database(name).await?;
        // DDL returns on node 1 before the other nodes have applied it.
        for node in &self.nodes[1..] {
            let mut conn = node.connect().await?;
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                let found: Option<String> = sqlx::query_scalar(
                    "SELECT SCHEMA_NAME FROM information_schema.SCHEMATA WHERE SCHEMA_NAME = ?",
                )
                .bind(name)
                .fetch_optional(&mut conn)
                .await?;
                if found.is_some() || Instant::now() > deadline {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            conn.close().await?;
        }
        Ok(self.nodes.iter().map(|n| n.database_url(name)).collect())
    }
}

/// `chown -R nobody DIR`.
fn chown_nobody(dir: &Path) -> Result<(), String> {
    let status = std::process::Command::new("chown")
        .args(["-R", "nobody"])
        .arg(dir)
        .status()
        .map_err(|e| format!("chown: {e}"))?;
    status
        .success()
        .then_some(())
        .ok_or_else(|| format!("chown -R nobody {} exited with {status}", dir.display()))
}

/// `cp -a SRC DST` (DST must not exist).
fn copy_dir(src: &Path, dst: &Path) -> Result<(), String> {
    let status = std::process::Command::new("cp")
        .arg("-a")
        .arg(src)
        .arg(dst)
        .status()
        .map_err(|e| format!("cp -a: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!(
            "cp -a {} {} exited with {status}",
            src.display(),
            dst.display()
        ))
    }
}

//! The servers under test: etcd itself, etcd's gRPC proxy, watchcache, and two watchcache
//! replicas on the same etcd; and the one etcd they all stand in front of.

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{Duration, Instant};

use etcd_client::{Client, Txn, TxnOp};

use crate::procs::{cpu_ticks, cpu_ticks_sum, http_get, status_kib, status_kib_sum, Proc};
use crate::watch::Shared;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Kind {
    Etcd,
    Proxy,
    Watchcache,
    /// Two watchcache processes on the same etcd, the connections spread over both.
    Watchcache2,
}

impl Kind {
    pub(crate) fn parse(s: &str) -> Result<Kind, String> {
        match s.trim() {
            "etcd" => Ok(Kind::Etcd),
            "proxy" | "grpc-proxy" => Ok(Kind::Proxy),
            "watchcache" => Ok(Kind::Watchcache),
            "watchcache2" => Ok(Kind::Watchcache2),
            o => Err(format!("unknown target {o:?} (etcd, proxy, watchcache, watchcache2)")),
        }
    }

    pub(crate) fn label(&self) -> &'static str {
        match self {
            Kind::Etcd => "etcd directly",
            Kind::Proxy => "etcd grpc-proxy",
            Kind::Watchcache => "watchcache",
            Kind::Watchcache2 => "watchcache, 2 replicas",
        }
    }

    pub(crate) fn key(&self) -> &'static str {
        match self {
            Kind::Etcd => "etcd",
            Kind::Proxy => "proxy",
            Kind::Watchcache => "watchcache",
            Kind::Watchcache2 => "watchcache2",
        }
    }

    pub(crate) fn is_watchcache(&self) -> bool {
        matches!(self, Kind::Watchcache | Kind::Watchcache2)
    }
}

/// The etcd and what every scenario uses.
pub(crate) struct Env {
    pub(crate) sh: Arc<Shared>,
    pub(crate) etcd: Proc,
    pub(crate) etcd_addr: String,
    pub(crate) etcd_client: Client,
    pub(crate) writers: Vec<Client>,
    pub(crate) seq: Arc<AtomicU64>,
    pub(crate) etcd_bin: PathBuf,
    pub(crate) watchcache_bin: PathBuf,
    pub(crate) dir: PathBuf,
    pub(crate) tck: u64,
}

impl Env {
    pub(crate) fn etcd_cpu(&self) -> Option<u64> {
        cpu_ticks(self.etcd.pid)
    }
}

/// A running target: the endpoints the watchers use, its processes (none for etcd itself)
/// and where their metrics are.
pub(crate) struct Target {
    pub(crate) kind: Kind,
    pub(crate) endpoints: Vec<String>,
    pub(crate) procs: Vec<Proc>,
    pub(crate) https: Vec<String>,
}

impl Target {
    /// The target's own processes (empty for etcd directly).
    pub(crate) fn pids(&self) -> Vec<u32> {
        self.procs.iter().map(|p| p.pid).collect()
    }

    /// CPU ticks of the target's own processes (None for etcd directly).
    pub(crate) fn cpu(&self) -> Option<u64> {
        if self.procs.is_empty() {
            None
        } else {
            cpu_ticks_sum(&self.pids())
        }
    }

    /// A /proc/PID/status field summed over the target's processes (etcd's for etcd itself).
    pub(crate) fn status_kib(&self, env: &Env, field: &str) -> Option<u64> {
        if self.procs.is_empty() {
            status_kib(env.etcd.pid, field)
        } else {
            status_kib_sum(&self.pids(), field)
        }
    }

    pub(crate) fn exited(&mut self) -> Option<String> {
        self.procs.iter_mut().find_map(|p| p.exited())
    }

    /// Kills every process of the target, starts them again on the same ports and waits
    /// until they serve; the time from the kill to ready.
    pub(crate) async fn restart(&mut self, limit: Duration) -> Result<Duration, String> {
        let t0 = Instant::now();
        for p in &mut self.procs {
            p.kill().await;
        }
        for p in &mut self.procs {
            p.start_again()?;
        }
        wait_target_ready(self, limit).await?;
        Ok(t0.elapsed())
    }
}

/// How watchcache is started.
#[derive(Clone)]
pub(crate) struct WcOpts {
    pub(crate) prefix: String,
}

pub(crate) async fn start_target(env: &Env, kind: Kind, wc: &WcOpts) -> Result<Target, String> {
    let free = || {
        host_etcd::etcd_launcher::free_port()
            .map(|p| format!("127.0.0.1:{p}"))
            .map_err(|e| e.to_string())
    };
    match kind {
        Kind::Etcd => Ok(Target {
            kind,
            endpoints: vec![env.etcd_addr.clone()],
            procs: vec![],
            https: vec![],
        }),
        Kind::Proxy => {
            let endpoint = free()?;
            let data = env.dir.join("proxy");
            let args = vec![
                "grpc-proxy".into(),
                "start".into(),
                format!("--endpoints={}", env.etcd_addr),
                format!("--listen-addr={endpoint}"),
                format!("--data-dir={}", data.display()),
            ];
            let p =
                Proc::spawn("grpc-proxy", &env.etcd_bin, args, vec![], env.dir.join("proxy.log"))?;
            let mut t = Target {
                kind,
                endpoints: vec![endpoint.clone()],
                procs: vec![p],
                https: vec![endpoint],
            };
            wait_target_ready(&mut t, Duration::from_secs(30)).await?;
            Ok(t)
        }
        Kind::Watchcache | Kind::Watchcache2 => {
            let n = if kind == Kind::Watchcache2 { 2 } else { 1 };
            let mut t = Target { kind, endpoints: vec![], procs: vec![], https: vec![] };
            for i in 0..n {
                let (endpoint, http) = (free()?, free()?);
                let mut args: Vec<String> = vec![
                    "serve".into(),
                    "--etcd-endpoints".into(),
                    env.etcd_addr.clone(),
                    "--listen-grpc".into(),
                    endpoint.clone(),
                    "--listen-http".into(),
                    http.clone(),
                    format!("--prefix={}", wc.prefix),
                ];
                // Extra flags for the server (e.g. BENCH_WATCHCACHE_ARGS="--grpc-credit 64").
                if let Ok(extra) = std::env::var("BENCH_WATCHCACHE_ARGS") {
                    args.extend(extra.split_whitespace().map(str::to_owned));
                }
                let log_env =
                    std::env::var("BENCH_WATCHCACHE_LOG").unwrap_or_else(|_| "info".into());
                let name = if n == 1 { "watchcache".to_owned() } else { format!("watchcache-{i}") };
                let p = Proc::spawn(
                    &name,
                    &env.watchcache_bin,
                    args,
                    vec![("RUST_LOG".into(), log_env), ("NO_COLOR".into(), "1".into())],
                    env.dir.join(format!("{name}.log")),
                )?;
                t.endpoints.push(endpoint);
                t.https.push(http);
                t.procs.push(p);
            }
            wait_target_ready(&mut t, Duration::from_secs(60)).await?;
            Ok(t)
        }
    }
}

/// Waits until the target serves: watchcache's `/readyz` answers 200, the proxy's `/metrics`
/// answers (neither touches etcd).
pub(crate) async fn wait_target_ready(t: &mut Target, limit: Duration) -> Result<Duration, String> {
    let t0 = Instant::now();
    let path = if t.kind.is_watchcache() { "/readyz" } else { "/metrics" };
    for http in t.https.clone() {
        loop {
            if let Some(e) = t.exited() {
                return Err(e);
            }
            if let Ok((200, _)) = http_get(&http, path).await {
                break;
            }
            if t0.elapsed() > limit {
                return Err(format!("{} not ready after {limit:?} ({http}{path})", t.kind.label()));
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    Ok(t0.elapsed())
}

pub(crate) fn find_etcd(p: &Option<PathBuf>) -> Result<PathBuf, String> {
    let p = match p {
        Some(p) => Some(p.clone()),
        None => host_etcd::etcd_launcher::find_binary("etcd"),
    };
    match p {
        Some(p) if p.is_file() => Ok(p),
        Some(p) => Err(format!("{} not found: run `make setup-etcd`", p.display())),
        None => {
            Err("etcd not found: run `make setup-etcd` (builds etcd 3.7 into .tools/bin)".into())
        }
    }
}

pub(crate) fn find_watchcache(p: &Option<PathBuf>) -> Result<PathBuf, String> {
    let p = p.clone().unwrap_or_else(|| {
        std::env::current_exe()
            .ok()
            .and_then(|e| e.parent().and_then(|d| d.parent()).map(|d| d.join("watchcache")))
            .filter(|p| p.is_file())
            .unwrap_or_else(|| PathBuf::from("target/release/watchcache"))
    });
    if p.is_file() {
        Ok(p)
    } else {
        Err(format!(
            "{} not found: build it with `cargo build --release -p host-etcd --bin watchcache` (make bench-host does)",
            p.display()
        ))
    }
}

pub(crate) async fn start_etcd(bin: &Path, dir: &Path) -> Result<(Proc, String), String> {
    let client_port = host_etcd::etcd_launcher::free_port().map_err(|e| e.to_string())?;
    let peer_port = host_etcd::etcd_launcher::free_port().map_err(|e| e.to_string())?;
    let client = format!("http://127.0.0.1:{client_port}");
    let peer = format!("http://127.0.0.1:{peer_port}");
    let args = vec![
        "--name".into(),
        "bench".into(),
        "--data-dir".into(),
        dir.join("etcd-data").display().to_string(),
        "--listen-client-urls".into(),
        client.clone(),
        "--advertise-client-urls".into(),
        client,
        "--listen-peer-urls".into(),
        peer.clone(),
        "--initial-advertise-peer-urls".into(),
        peer.clone(),
        "--initial-cluster".into(),
        format!("bench={peer}"),
        "--log-level=error".into(),
    ];
    let mut p = Proc::spawn("etcd", bin, args, vec![], dir.join("etcd.log"))?;
    let addr = format!("127.0.0.1:{client_port}");
    let t0 = Instant::now();
    loop {
        if let Some(e) = p.exited() {
            return Err(e);
        }
        if let Ok((200, body)) = http_get(&addr, "/health").await {
            if body.contains("true") {
                return Ok((p, addr));
            }
        }
        if t0.elapsed() > Duration::from_secs(30) {
            return Err(format!(
                "etcd did not become healthy within 30 s; see {}",
                dir.join("etcd.log").display()
            ));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `keys` keys under `prefix`, in transactions of 100.
pub(crate) async fn seed(client: &Client, prefix: &str, keys: usize) -> Result<(), String> {
    let mut kv = client.kv_client();
    let mut i = 0;
    while i < keys {
        let ops: Vec<TxnOp> = (i..(i + 100).min(keys))
            .map(|k| TxnOp::put(format!("{prefix}k{k}"), "seed", None))
            .collect();
        i += ops.len();
        tokio::time::timeout(Duration::from_secs(30), kv.txn(Txn::new().and_then(ops)))
            .await
            .map_err(|_| "seeding: txn timed out".to_owned())?
            .map_err(|e| format!("seeding: {e}"))?;
    }
    Ok(())
}

/// etcd's version line.
pub(crate) fn etcd_version(bin: &Path) -> String {
    std::process::Command::new(bin)
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.lines().next().map(str::to_owned))
        .unwrap_or_default()
}

/// Starts etcd in `dir`, connects to it (one client for control, four for writes) and seeds
/// `keys` keys under `prefix`.
pub(crate) async fn start_env(
    etcd_bin: PathBuf,
    watchcache_bin: PathBuf,
    dir: PathBuf,
    prefix: &str,
    keys: usize,
) -> Result<Env, String> {
    let (etcd, etcd_addr) = start_etcd(&etcd_bin, &dir).await?;
    eprintln!("etcd on {etcd_addr} (pid {}); logs in {}", etcd.pid, dir.display());
    let etcd_client = crate::watch::connect(&etcd_addr).await?;
    let mut writers = Vec::new();
    for _ in 0..4 {
        writers.push(crate::watch::connect(&etcd_addr).await?);
    }
    if keys > 0 {
        seed(&etcd_client, prefix, keys).await?;
    }
    Ok(Env {
        sh: Arc::new(Shared::new()),
        etcd,
        etcd_addr,
        etcd_client,
        writers,
        seq: Arc::new(AtomicU64::new(0)),
        etcd_bin,
        watchcache_bin,
        dir,
        tck: crate::procs::clk_tck(),
    })
}

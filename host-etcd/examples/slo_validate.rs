//! Validation of the simulator against the real system (issue 6, `docs/slo.md`).
//!
//! For each workload file (the JSON of `watchcache simulate`, by default
//! `scenarios/simulate/validate_*.json`) this starts a real etcd and the real `watchcache`
//! server in front of it, and plays the workload in real time:
//! - a writer puts Pod-like objects into etcd (`/registry/pods/ns-<i mod 16>/pod-<i>`, with the
//!   `group` label the simulator gives them) as a Poisson process at `writes.rate_per_s`;
//! - `watchers.count` client-go-like reflectors use the server's Kubernetes-style HTTP API: a
//!   list at `resourceVersion=0`, then a watch with `allowWatchBookmarks` and the simulator's
//!   label selector from the list's RV; each watch that starts draws a disconnect time from
//!   `disconnects.rate_per_watcher_per_h`; after a disconnect of its own the reflector waits
//!   `reconnect_delay_s` and re-watches from the last RV it saw (an event or a bookmark); when
//!   the server ends the watch it re-watches at once; on 410 it relists (a list at its last RV,
//!   then at "" if refused, as client-go 1.30 does) and watches from the list's RV;
//! - `restarts` kill the `watchcache` process and start it again after `outage_s`;
//! - etcd is compacted every `etcd.compaction_interval_s` to the revision of one interval
//!   earlier (kube-apiserver's compactor).
//!
//! Then it runs the same workload through `cacher_core::simulate` and prints both, side by side.
//! Randomness differs (the simulator's seeded draws against this run's own seeded draws and
//! real time), so counts that are sums of random events are compared as such.
//!
//! ```text
//! make validate-slo                        # every scenarios/simulate/validate_*.json
//! target/release/examples/slo_validate --watchcache target/release/watchcache FILE...
//! ```
//!
//! Fields of the workload it cannot play in real time (slow consumers, watch timeouts,
//! bursts, deletes, non-default etcd page sizes) are refused with an error naming the field.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cacher_core::simulate::{self, Delay, Workload};
use clap::Parser;
use host_etcd::etcd_launcher::free_port;
use host_etcd::{EmbeddedEtcd, EtcdOptions};
use serde_json::{json, Value};
use tokio::process::{Child, Command};

// The HTTP client the host tests use (GET, status, a streamed body). The test binary, which
// also includes this file, has it as `support::http` too.
#[allow(clippy::duplicate_mod)]
#[path = "../tests/support/http.rs"]
mod http;

#[derive(Parser)]
#[command(about = "Plays simulate() workloads against a real etcd + watchcache, and compares")]
struct Args {
    /// Workload files (JSON, `watchcache simulate`'s format). Default:
    /// scenarios/simulate/validate_*.json.
    files: Vec<PathBuf>,
    /// The watchcache binary to run.
    #[arg(long, env = "SLO_WATCHCACHE", default_value = "target/release/watchcache")]
    watchcache: PathBuf,
    /// Writes the results (JSON) here.
    #[arg(long, default_value = "artifacts/slo-validation.json")]
    out: PathBuf,
}

/// The prefix the simulator's watchers watch.
pub(crate) const PREFIX: &str = "/registry/pods/";

/// Counts of one real run, named as the simulator's summary.
#[derive(Default)]
pub(crate) struct Counts {
    pub(crate) events_written: AtomicU64,
    pub(crate) deliveries: AtomicU64,
    pub(crate) bookmarks_sent: AtomicU64,
    pub watch_410: AtomicU64,
    pub(crate) watch_errors: AtomicU64,
    pub(crate) relists: AtomicU64,
    pub relist_410: AtomicU64,
    pub(crate) disconnects: AtomicU64,
    pub(crate) reconnects: AtomicU64,
    pub(crate) watches_started: AtomicU64,
    pub(crate) server_closes: AtomicU64,
    pub(crate) connect_failures: AtomicU64,
    /// Events at or below the RV the reflector had already seen (must stay 0).
    pub(crate) stale_events: AtomicU64,
    pub(crate) restarts: AtomicU64,
    pub(crate) compactions: AtomicU64,
}

fn add(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

impl Counts {
    pub(crate) fn to_json(&self) -> Value {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        json!({
            "events_written": g(&self.events_written),
            "deliveries": g(&self.deliveries),
            "bookmarks_sent": g(&self.bookmarks_sent),
            "watch_410": g(&self.watch_410),
            "watch_errors": g(&self.watch_errors),
            "relists": g(&self.relists),
            "relist_410": g(&self.relist_410),
            "disconnects": g(&self.disconnects),
            "reconnects": g(&self.reconnects),
            "watches_started": g(&self.watches_started),
            "server_closes": g(&self.server_closes),
            "connect_failures": g(&self.connect_failures),
            "stale_events": g(&self.stale_events),
            "restarts": g(&self.restarts),
            "compactions": g(&self.compactions),
        })
    }
}

/// splitmix64: this run's own seeded draws.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
    fn exp(&mut self, mean: f64) -> f64 {
        -(1.0 - self.unit()).ln() * mean
    }
    fn delay(&mut self, d: Delay) -> f64 {
        match d {
            Delay::Const(s) => s,
            Delay::Exp { mean } => self.exp(mean),
            Delay::Uniform { min, max } => min + (max - min) * self.unit(),
        }
    }
}

/// The label selector plan for a share `f`: (groups G, watcher i's selector). Only shares the
/// simulator spells with one group per watcher (`f = 1/G`) or none (`f = 1`) are played.
pub(crate) fn selector_plan(f: f64) -> Result<(u32, Option<u32>), String> {
    if f >= 1.0 {
        return Ok((1, None));
    }
    let g = (1.0 / f).round();
    if !(2.0..=100_000.0).contains(&g) || (1.0 / g - f).abs() > 1e-9 {
        return Err(format!(
            "watchers.selector_fraction: only 1 or 1/G is played for real, got {f}"
        ));
    }
    Ok((g as u32, Some(g as u32)))
}

/// Refuses what this player cannot do in real time.
pub(crate) fn check_playable(w: &Workload) -> Result<(), String> {
    let refuse = |field: &str| Err(format!("{field}: not played against the real server"));
    if w.watchers.consume_rate_per_s.is_some() {
        return refuse("watchers.consume_rate_per_s");
    }
    if w.watchers.timeout_s.is_some() {
        return refuse("watchers.timeout_s");
    }
    if !w.writes.bursts.is_empty() {
        return refuse("writes.bursts");
    }
    if w.writes.delete_fraction > 0.0 {
        return refuse("writes.delete_fraction");
    }
    if w.duration_s > 1800.0 {
        return refuse("duration_s (over 30 minutes of real time)");
    }
    selector_plan(w.watchers.selector_fraction).map(|_| ())
}

fn key(i: u64) -> String {
    format!("{PREFIX}ns-{}/pod-{i:07}", i % 16)
}

fn pod(i: u64, groups: u32, n: u64) -> String {
    let mut meta = json!({"name": format!("pod-{i:07}"), "namespace": format!("ns-{}", i % 16)});
    if groups > 1 {
        meta["labels"] = json!({"group": (i % u64::from(groups)).to_string()});
    }
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": meta,
           "spec": {"nodeName": format!("node-{}", i % 8)}, "status": {"writes": n}})
    .to_string()
}

/// The real server, as a child process that can be killed and started again.
pub(crate) struct Server {
    bin: PathBuf,
    args: Vec<String>,
    pub(crate) http: String,
    child: Option<Child>,
}

impl Server {
    pub(crate) fn new(bin: &Path, etcd: &str, w: &Workload) -> Server {
        let grpc = free_port().expect("a free port");
        let http = free_port().expect("a free port");
        let c = &w.config;
        let mut args: Vec<String> = vec![
            "serve".into(),
            "--etcd-endpoints".into(),
            etcd.into(),
            "--listen-grpc".into(),
            format!("127.0.0.1:{grpc}"),
            "--listen-http".into(),
            format!("127.0.0.1:{http}"),
            "--prefix".into(),
            PREFIX.into(),
            "--profile".into(),
            c.profile.as_str().into(),
            "--capacity".into(),
            c.capacity.to_string(),
            "--upper-bound-capacity".into(),
            c.upper_bound_capacity.to_string(),
            "--bookmark-frequency".into(),
            format!("{}ms", c.bookmark_frequency_ms),
            "--web-dir".into(),
            "/nonexistent".into(),
            // The simulator plays Kubernetes' cacher: a restarted cache's window starts at its
            // list (watchcache's default loads etcd's recent history first), one dispatcher
            // that waits for a blocked watcher, a relist after the profile's delay.
            "--backfill-revisions".into(),
            "0".into(),
            "--stall-dispatch".into(),
            "--relist-delay".into(),
            format!("{}ms", c.relist_delay_ms),
        ];
        if !c.dynamic_capacity {
            args.push("--fixed-capacity".into());
        }
        Server { bin: bin.to_owned(), args, http: format!("http://127.0.0.1:{http}"), child: None }
    }

    pub(crate) async fn start(&mut self) -> Result<(), String> {
        let child = Command::new(&self.bin)
            .args(&self.args)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", self.bin.display()))?;
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        let client = http::Client::new();
        loop {
            if let Ok(r) = client.get(format!("{}/readyz", self.http)).await {
                if r.status().is_success() {
                    return Ok(());
                }
            }
            if Instant::now() > deadline {
                return Err("watchcache did not become ready in 30 s".into());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub(crate) async fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill().await;
        }
    }
}

/// Shared state of one run.
struct Run {
    w: Workload,
    http: String,
    client: http::Client,
    counts: Counts,
    done: AtomicBool,
    groups: u32,
    end: Instant,
}

impl Run {
    fn done(&self) -> bool {
        self.done.load(Ordering::Relaxed) || Instant::now() >= self.end
    }

    fn selector(&self, i: u32) -> Option<String> {
        // As the simulator: watcher i selects group i·m mod G with m = 1.
        (self.groups > 1).then(|| format!("group={}", i % self.groups))
    }

    /// A list at `rv` (no limit); Ok(list RV) or Err(HTTP code, or 0 for no answer).
    async fn list(&self, sel: &Option<String>, rv: &str) -> Result<u64, u16> {
        let mut url = format!("{}/kube{PREFIX}?resourceVersion={rv}", self.http);
        if let Some(s) = sel {
            url.push_str(&format!("&labelSelector={s}"));
        }
        let r = self.client.get(url).await.map_err(|_| 0u16)?;
        if !r.status().is_success() {
            return Err(r.status().as_u16());
        }
        let v: Value = r.json().await.map_err(|_| 0u16)?;
        v["metadata"]["resourceVersion"].as_str().and_then(|s| s.parse().ok()).ok_or(0)
    }

    /// client-go 1.30 after a 410: list at the last RV; if refused, at "" (a consistent read).
    async fn relist(&self, sel: &Option<String>, last: u64) -> u64 {
        add(&self.counts.relists);
        let mut rv = last.to_string();
        loop {
            match self.list(sel, &rv).await {
                Ok(v) => return v,
                Err(410) => {
                    add(&self.counts.relist_410);
                    rv = String::new();
                }
                Err(_) if self.done() => return last,
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    }
}

enum WatchEnd {
    /// The client disconnected on its own.
    Disconnected,
    /// The server ended the stream (or the connection broke).
    Closed,
    /// 410 Expired.
    Expired,
    /// Could not connect or another error: back off.
    Failed,
    /// The run is over.
    Done,
}

/// One client-go-like reflector.
async fn reflector(run: Arc<Run>, i: u32, seed: u64) {
    let mut rng = Rng(seed ^ (u64::from(i) << 20) ^ 0x5eed);
    let sel = run.selector(i);
    let mut rv = loop {
        match run.list(&sel, "0").await {
            Ok(v) => break v,
            Err(_) if run.done() => return,
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    };
    let rate = run.w.disconnects.rate_per_watcher_per_h;
    while !run.done() {
        match watch(&run, &sel, &mut rv, &mut rng, rate).await {
            WatchEnd::Done => return,
            WatchEnd::Disconnected => {
                add(&run.counts.disconnects);
                let d = rng.delay(run.w.disconnects.reconnect_delay_s);
                tokio::time::sleep(Duration::from_secs_f64(d)).await;
                add(&run.counts.reconnects);
            }
            WatchEnd::Closed => add(&run.counts.server_closes),
            WatchEnd::Expired => {
                add(&run.counts.watch_410);
                rv = run.relist(&sel, rv).await;
            }
            WatchEnd::Failed => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

async fn watch(
    run: &Run,
    sel: &Option<String>,
    rv: &mut u64,
    rng: &mut Rng,
    rate: f64,
) -> WatchEnd {
    let mut url = format!(
        "{}/kube{PREFIX}?watch=true&resourceVersion={rv}&allowWatchBookmarks={}",
        run.http, run.w.watchers.bookmarks
    );
    if let Some(s) = sel {
        url.push_str(&format!("&labelSelector={s}"));
    }
    let mut resp = match run.client.get(url).await {
        Ok(r) => r,
        Err(_) => {
            add(&run.counts.connect_failures);
            return WatchEnd::Failed;
        }
    };
    add(&run.counts.watches_started);
    match resp.status().as_u16() {
        200 => {}
        410 => return WatchEnd::Expired,
        _ => {
            add(&run.counts.watch_errors);
            return WatchEnd::Failed;
        }
    }
    let disconnect = if rate > 0.0 {
        tokio::time::Instant::now() + Duration::from_secs_f64(rng.exp(3600.0 / rate))
    } else {
        tokio::time::Instant::now() + Duration::from_secs(86_400)
    };
    let end = tokio::time::Instant::from_std(run.end);
    let mut buf: Vec<u8> = Vec::new();
    loop {
        let chunk = tokio::select! {
            c = resp.chunk() => c,
            _ = tokio::time::sleep_until(disconnect) => return WatchEnd::Disconnected,
            _ = tokio::time::sleep_until(end) => return WatchEnd::Done,
        };
        let Some(Ok(chunk)) = chunk else { return WatchEnd::Closed };
        buf.extend_from_slice(&chunk);
        while let Some(n) = buf.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = buf.drain(..=n).collect();
            let Ok(ev) = serde_json::from_slice::<Value>(&line) else { continue };
            let obj = &ev["object"];
            match ev["type"].as_str() {
                Some("ERROR") => {
                    if obj["code"].as_u64() == Some(410) {
                        return WatchEnd::Expired;
                    }
                    add(&run.counts.watch_errors);
                    return WatchEnd::Closed;
                }
                Some(t) => {
                    if let Some(v) = obj["metadata"]["resourceVersion"]
                        .as_str()
                        .and_then(|s| s.parse::<u64>().ok())
                    {
                        if v <= *rv && t != "BOOKMARK" {
                            add(&run.counts.stale_events);
                        }
                        *rv = v;
                    }
                    if t == "BOOKMARK" {
                        add(&run.counts.bookmarks_sent);
                    } else {
                        add(&run.counts.deliveries);
                    }
                }
                None => {}
            }
        }
    }
}

/// Plays `w` against a fresh etcd and `watchcache` (the binary `bin`); returns the counts.
pub(crate) async fn play(w: &Workload, bin: &Path) -> Result<Value, String> {
    check_playable(w)?;
    let (groups, _) = selector_plan(w.watchers.selector_fraction)?;
    let etcd = EmbeddedEtcd::start(EtcdOptions {
        progress_notify_interval: w.etcd.progress_notify_interval_s.map(Duration::from_secs_f64),
        ..EtcdOptions::default()
    })
    .await?;
    let mut kv = etcd_client::Client::connect([etcd.endpoint()], None)
        .await
        .map_err(|e| format!("etcd: {e}"))?;
    // The objects exist before time 0, as in the simulator.
    for i in 0..w.writes.keys {
        kv.put(key(i), pod(i, groups, 0), None).await.map_err(|e| format!("etcd put: {e}"))?;
    }
    let mut server = Server::new(bin, &etcd.endpoint(), w);
    server.start().await?;
    let start = Instant::now();
    let run = Arc::new(Run {
        w: w.clone(),
        http: server.http.clone(),
        client: http::Client::without_pool(),
        counts: Counts::default(),
        done: AtomicBool::new(false),
        groups,
        end: start + Duration::from_secs_f64(w.duration_s),
    });
    let mut tasks = Vec::new();
    for i in 0..w.watchers.count {
        tasks.push(tokio::spawn(reflector(run.clone(), i, w.seed)));
    }
    // The writer: a Poisson process.
    let writer = {
        let run = run.clone();
        let mut kv = kv.clone();
        tokio::spawn(async move {
            let mut rng = Rng(run.w.seed ^ 0x7772_6974_6572);
            let rate = run.w.writes.rate_per_s;
            if rate <= 0.0 {
                return;
            }
            let t0 = tokio::time::Instant::now();
            let mut at = 0.0;
            let mut n = 0u64;
            loop {
                at += rng.exp(1.0 / rate);
                tokio::time::sleep_until(t0 + Duration::from_secs_f64(at)).await;
                if run.done() {
                    return;
                }
                let i = rng.next() % run.w.writes.keys.max(1);
                n += 1;
                if kv.put(key(i), pod(i, run.groups, n), None).await.is_ok() {
                    add(&run.counts.events_written);
                }
            }
        })
    };
    // etcd's compactor: every interval, to the revision of one interval earlier.
    let compactor = w.etcd.compaction_interval_s.filter(|i| *i < w.duration_s).map(|iv| {
        let run = run.clone();
        let mut kv = kv.clone();
        tokio::spawn(async move {
            let mut prev: Option<i64> = None;
            loop {
                tokio::time::sleep(Duration::from_secs_f64(iv)).await;
                if run.done() {
                    return;
                }
                let Ok(r) = kv.get("compaction-probe", None).await else { continue };
                let rev = r.header().map_or(0, |h| h.revision());
                if let Some(p) = prev {
                    if kv.compact(p, None).await.is_ok() {
                        add(&run.counts.compactions);
                    }
                }
                prev = Some(rev);
            }
        })
    });
    // Restarts of the cache.
    let mut restarts: Vec<_> = w.restarts.clone();
    restarts.sort_by(|a, b| a.at_s.total_cmp(&b.at_s));
    for r in restarts {
        let at = start + Duration::from_secs_f64(r.at_s);
        if at >= run.end {
            break;
        }
        tokio::time::sleep_until(tokio::time::Instant::from_std(at)).await;
        server.kill().await;
        add(&run.counts.restarts);
        tokio::time::sleep(Duration::from_secs_f64(r.outage_s)).await;
        server.start().await?;
    }
    tokio::time::sleep_until(tokio::time::Instant::from_std(run.end)).await;
    run.done.store(true, Ordering::Relaxed);
    for t in tasks {
        let _ = tokio::time::timeout(Duration::from_secs(10), t).await;
    }
    let _ = writer.await;
    if let Some(c) = compactor {
        c.abort();
    }
    let metrics = run.client.get(format!("{}/metrics", server.http)).await;
    let metrics = match metrics {
        Ok(r) => r.text().await.unwrap_or_default(),
        Err(_) => String::new(),
    };
    server.kill().await;
    let mut out = run.counts.to_json();
    out["wall_s"] = json!(start.elapsed().as_secs_f64());
    out["server_metrics"] = json!(pick_metrics(&metrics));
    Ok(out)
}

/// The server's own view of the run: series whose name says watch, list or 410.
fn pick_metrics(text: &str) -> Value {
    let mut m = serde_json::Map::new();
    for line in text.lines() {
        if line.starts_with('#') {
            continue;
        }
        let Some((name, value)) = line.rsplit_once(' ') else { continue };
        let interesting = [
            "watch_cache_events_received",
            "terminated_watchers",
            "watchcache_passthrough",
            "watchcache_watchers",
        ];
        if interesting.iter().any(|k| name.contains(k)) {
            if let Ok(v) = value.parse::<f64>() {
                m.insert(name.to_owned(), json!(v));
            }
        }
    }
    Value::Object(m)
}

/// The simulator's counts for `w`, in the same names (reconnects as the simulator derives
/// them: re-watches that are neither a first watch nor a relist's).
pub(crate) fn predict(w: &Workload) -> Result<Value, String> {
    let report = simulate::run(w).map_err(|e| e.to_string())?;
    let s = &report.summary;
    let reconnects = s.disconnects;
    Ok(json!({
        "events_written": s.events_written,
        "deliveries": s.deliveries,
        "bookmarks_sent": s.bookmarks_sent,
        "watch_410": s.watch_410,
        "watch_errors": s.watch_errors,
        "relists": s.relists,
        "relist_410": s.etcd_list_410,
        "disconnects": s.disconnects,
        "reconnects": reconnects,
        "watches_started": s.watches_started,
        "restarts": s.restarts,
        "compactions": s.compactions,
        "peak_ring_capacity": s.peak_ring_capacity,
    }))
}

pub(crate) fn load(path: &Path) -> Result<(Workload, Value), String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let v: Value = serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    let w = simulate::workload_from_json(&v).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok((w, v))
}

const COMPARED: [&str; 7] = [
    "events_written",
    "disconnects",
    "watch_410",
    "relists",
    "relist_410",
    "bookmarks_sent",
    "deliveries",
];

/// The simulator over `seeds` other seeds: mean and standard deviation of each compared count,
/// the spread a real run (its own random draws) is to be judged against.
pub(crate) fn spread(w: &Workload, seeds: u64) -> Result<Value, String> {
    let mut runs = Vec::new();
    for k in 0..seeds {
        let mut w = w.clone();
        w.seed = w.seed.wrapping_add(1000 + k);
        w.config.seed = w.seed;
        w.series = false;
        runs.push(predict(&w)?);
    }
    let mut out = serde_json::Map::new();
    for k in COMPARED {
        let xs: Vec<f64> = runs.iter().map(|r| r[k].as_u64().unwrap_or(0) as f64).collect();
        let mean = xs.iter().sum::<f64>() / xs.len().max(1) as f64;
        let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (xs.len().max(2) - 1) as f64;
        out.insert(k.to_owned(), json!({"mean": mean, "sd": var.sqrt()}));
    }
    Ok(Value::Object(out))
}

fn table(name: &str, sim: &Value, seeds: &Value, real: &Value) -> String {
    let mut s = format!(
        "\n{name}\n| count | simulated (same seed) | simulated, 20 other seeds | real | real vs same seed | real vs seeds |\n|---|---|---|---|---|---|\n"
    );
    for k in COMPARED {
        let a = sim[k].as_u64().unwrap_or(0);
        let b = real[k].as_u64().unwrap_or(0);
        let (mean, sd) =
            (seeds[k]["mean"].as_f64().unwrap_or(0.0), seeds[k]["sd"].as_f64().unwrap_or(0.0));
        let diff = if a == 0 && b == 0 {
            "0".to_owned()
        } else if a == 0 {
            "n/a".to_owned()
        } else {
            format!("{:+.1} %", (b as f64 - a as f64) * 100.0 / a as f64)
        };
        let z = if sd > 0.0 {
            format!("{:+.1} sd", (b as f64 - mean) / sd)
        } else if (b as f64 - mean).abs() < 0.5 {
            "equal".to_owned()
        } else {
            "differs".to_owned()
        };
        s.push_str(&format!("| {k} | {a} | {mean:.1} ± {sd:.1} | {b} | {diff} | {z} |\n"));
    }
    s
}

#[allow(dead_code)]
#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> std::process::ExitCode {
    let args = Args::parse();
    let mut files = args.files.clone();
    if files.is_empty() {
        let mut found: Vec<PathBuf> = std::fs::read_dir("scenarios/simulate")
            .map(|d| d.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        found.retain(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("validate_") && n.ends_with(".json"))
        });
        found.sort();
        files = found;
    }
    if files.is_empty() {
        eprintln!("no workloads: give files, or run from the repository root (scenarios/simulate/validate_*.json)");
        return std::process::ExitCode::FAILURE;
    }
    if !args.watchcache.is_file() {
        eprintln!(
            "{} not found: build it (cargo build --release -p host-etcd --bin watchcache)",
            args.watchcache.display()
        );
        return std::process::ExitCode::FAILURE;
    }
    let mut results = Vec::new();
    for f in &files {
        let (w, _) = match load(f) {
            Ok(x) => x,
            Err(e) => {
                eprintln!("{e}");
                return std::process::ExitCode::FAILURE;
            }
        };
        let name = f.file_stem().and_then(|s| s.to_str()).unwrap_or("?").to_owned();
        eprintln!("{name}: {} s of real time ...", w.duration_s);
        let sim = match predict(&w) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("{name}: {e}");
                return std::process::ExitCode::FAILURE;
            }
        };
        let seeds = match spread(&w, 20) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("{name}: {e}");
                return std::process::ExitCode::FAILURE;
            }
        };
        let real = match play(&w, &args.watchcache).await {
            Ok(r) => r,
            Err(e) => {
                eprintln!("{name}: {e}");
                return std::process::ExitCode::FAILURE;
            }
        };
        print!("{}", table(&name, &sim, &seeds, &real));
        results.push(json!({"workload": name, "file": f, "simulated": sim, "simulated_other_seeds": seeds, "real": real}));
    }
    if let Some(dir) = args.out.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    let doc = json!({"runs": results});
    if let Err(e) =
        std::fs::write(&args.out, serde_json::to_string_pretty(&doc).unwrap_or_default())
    {
        eprintln!("{}: {e}", args.out.display());
        return std::process::ExitCode::FAILURE;
    }
    eprintln!("results in {}", args.out.display());
    std::process::ExitCode::SUCCESS
}

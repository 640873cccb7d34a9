//! `make bench-host`: the host load benchmark. Three targets side by side on the same etcd:
//! etcd itself, etcd's gRPC proxy (`etcd grpc-proxy start`) and `watchcache serve`.
//!
//! Scenarios (see BENCHMARKS.md, "Host (etcd gRPC API)"):
//! - A. fan-out: N watchers on `/bench/` (one `Watch` stream each, spread over C client
//!   connections), puts at a fixed rate written straight to etcd; put-to-receive latency, CPU
//!   of the target process per delivered event, peak RSS, etcd's watchers during the run.
//! - B. reconnect storm: all watchers dropped (connections too) and resumed from their last
//!   revision + 1; what reached etcd during the storm.
//! - C. restart: the target process killed and started again on the same ports; the watchers
//!   resume from their last revision + 1; what reached etcd and how long until every watcher
//!   receives again (not run for etcd itself).
//!
//! Every watcher checks that it saw every revision exactly once (all writes under the prefix
//! come from this program, one key per revision), across reconnects.
//!
//! Parameters: flags or `BENCH_*` environment variables (`--help`); `--quick` for a smoke run
//! with 10x smaller numbers. Output: markdown tables on stdout, the same figures as JSON in
//! `artifacts/bench-host.json`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Parser;
use etcd_client::{Client, ConnectOptions, Txn, TxnOp, WatchOptions};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, Command};
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;

const PREFIX: &str = "/bench/";

#[derive(Parser, Debug)]
#[command(about = "Watch load benchmark: etcd vs etcd grpc-proxy vs watchcache, on one etcd")]
struct Args {
    /// A smoke run: 10x smaller numbers (watchers, connections, rate, duration, keys).
    #[arg(long)]
    quick: bool,
    /// Watchers on the prefix (default 1000).
    #[arg(long, env = "BENCH_WATCHERS")]
    watchers: Option<usize>,
    /// Client connections the watchers are spread over (default 50).
    #[arg(long, env = "BENCH_CONNS")]
    conns: Option<usize>,
    /// Puts per second in scenario A (default 1000).
    #[arg(long, env = "BENCH_RATE")]
    rate: Option<u64>,
    /// Seconds of writing in scenario A (default 30).
    #[arg(long, env = "BENCH_SECONDS")]
    seconds: Option<u64>,
    /// Keys under the prefix, written before anything else (default 10000).
    #[arg(long, env = "BENCH_KEYS")]
    keys: Option<usize>,
    /// The puts go to /bench/k{i % this} (default 1000).
    #[arg(long, env = "BENCH_WRITE_KEYS")]
    write_keys: Option<usize>,
    /// Puts per second while scenarios B and C run (default 100).
    #[arg(long, env = "BENCH_SLOW_RATE")]
    slow_rate: Option<u64>,
    /// How long the watchers stay away in B (ms; writes go on meanwhile).
    #[arg(long, env = "BENCH_STORM_GAP_MS", default_value_t = 500)]
    storm_gap_ms: u64,
    /// Targets to run, comma-separated: etcd, proxy, watchcache.
    #[arg(
        long,
        env = "BENCH_TARGETS",
        value_delimiter = ',',
        default_value = "etcd,proxy,watchcache"
    )]
    targets: Vec<String>,
    /// The etcd binary (also runs the gRPC proxy); default .tools/bin/etcd.
    #[arg(long, env = "BENCH_ETCD")]
    etcd: Option<PathBuf>,
    /// The watchcache binary; default target/release/watchcache.
    #[arg(long, env = "BENCH_WATCHCACHE")]
    watchcache: Option<PathBuf>,
    /// Where the JSON goes.
    #[arg(long, env = "BENCH_OUT", default_value = "artifacts/bench-host.json")]
    out: PathBuf,
    /// Longest wait (s) for the watchers to receive everything after the writes stop.
    #[arg(long, env = "BENCH_DRAIN_TIMEOUT", default_value_t = 120)]
    drain_timeout: u64,
}

/// The resolved parameters.
#[derive(Clone, Debug)]
struct Cfg {
    watchers: usize,
    conns: usize,
    rate: u64,
    seconds: u64,
    keys: usize,
    write_keys: usize,
    slow_rate: u64,
    storm_gap: Duration,
    drain_timeout: Duration,
}

impl Cfg {
    fn of(a: &Args) -> Cfg {
        let q = |full: u64, v: Option<u64>| v.unwrap_or(if a.quick { full / 10 } else { full });
        let qs =
            |full: usize, v: Option<usize>| v.unwrap_or(if a.quick { full / 10 } else { full });
        Cfg {
            watchers: qs(1000, a.watchers).max(1),
            conns: qs(50, a.conns).max(1),
            rate: q(1000, a.rate).max(1),
            seconds: q(30, a.seconds).max(1),
            keys: qs(10_000, a.keys).max(1),
            write_keys: qs(1000, a.write_keys).max(1),
            slow_rate: q(100, a.slow_rate).max(1),
            storm_gap: Duration::from_millis(a.storm_gap_ms),
            drain_timeout: Duration::from_secs(a.drain_timeout.max(1)),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Child processes: registered so that every exit path (error, Ctrl-C, SIGTERM) kills them.

static PIDS: Mutex<Vec<u32>> = Mutex::new(Vec::new());

fn register(pid: u32) {
    if let Ok(mut p) = PIDS.lock() {
        p.push(pid);
    }
}

fn unregister(pid: u32) {
    if let Ok(mut p) = PIDS.lock() {
        p.retain(|x| *x != pid);
    }
}

fn kill_registered() {
    let pids: Vec<u32> = PIDS.lock().map(|p| p.clone()).unwrap_or_default();
    for pid in pids {
        let _ = std::process::Command::new("kill")
            .arg("-KILL")
            .arg(pid.to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// A child process (killed when dropped) with its stderr in a log file.
struct Proc {
    name: String,
    program: PathBuf,
    args: Vec<String>,
    env: Vec<(String, String)>,
    log: PathBuf,
    child: Child,
    pid: u32,
    starts: u32,
}

impl Proc {
    fn spawn(
        name: &str,
        program: &Path,
        args: Vec<String>,
        env: Vec<(String, String)>,
        log: PathBuf,
    ) -> Result<Proc, String> {
        let child = Self::start(program, &args, &env, &log)?;
        let pid = child.id().ok_or_else(|| format!("{name}: no pid"))?;
        register(pid);
        Ok(Proc {
            name: name.to_owned(),
            program: program.to_owned(),
            args,
            env,
            log,
            child,
            pid,
            starts: 1,
        })
    }

    fn start(
        program: &Path,
        args: &[String],
        env: &[(String, String)],
        log: &Path,
    ) -> Result<Child, String> {
        let logf = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .map_err(|e| format!("{}: {e}", log.display()))?;
        let mut cmd = Command::new(program);
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::from(logf.try_clone().map_err(|e| e.to_string())?))
            .stderr(Stdio::from(logf))
            .kill_on_drop(true);
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd.spawn().map_err(|e| format!("starting {}: {e}", program.display()))
    }

    /// SIGKILL and wait.
    async fn kill(&mut self) {
        let _ = self.child.kill().await;
        unregister(self.pid);
    }

    /// Kills the process and starts it again with the same command line.
    async fn restart(&mut self) -> Result<(), String> {
        self.kill().await;
        self.child = Self::start(&self.program, &self.args, &self.env, &self.log)?;
        self.pid = self.child.id().ok_or_else(|| format!("{}: no pid", self.name))?;
        register(self.pid);
        self.starts += 1;
        Ok(())
    }

    fn exited(&mut self) -> Option<String> {
        match self.child.try_wait() {
            Ok(Some(st)) => {
                Some(format!("{} exited with {st}; see {}", self.name, self.log.display()))
            }
            _ => None,
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
        unregister(self.pid);
    }
}

// ---------------------------------------------------------------------------------------------
// /proc readings.

fn clk_tck() -> u64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .filter(|t| *t > 0)
        .unwrap_or(100)
}

/// utime + stime of a process, in ticks.
fn cpu_ticks(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &s[s.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // After the name: state is field 3, utime 14, stime 15 (1-based in proc(5)).
    let utime: u64 = f.get(11)?.parse().ok()?;
    let stime: u64 = f.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// Busy ticks of all CPUs (everything in the `cpu` line of /proc/stat but idle and iowait).
fn system_busy_ticks() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/stat").ok()?;
    let line = s.lines().find(|l| l.starts_with("cpu "))?;
    let v: Vec<u64> = line.split_whitespace().skip(1).filter_map(|x| x.parse().ok()).collect();
    // user nice system idle iowait irq softirq steal (guest time is inside user).
    Some(v.iter().take(8).enumerate().filter(|(i, _)| *i != 3 && *i != 4).map(|(_, x)| x).sum())
}

/// utime + stime of every process now, by pid.
fn all_cpu_ticks() -> BTreeMap<u32, u64> {
    let mut m = BTreeMap::new();
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for e in dir.flatten() {
            if let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) {
                if let Some(t) = cpu_ticks(pid) {
                    m.insert(pid, t);
                }
            }
        }
    }
    m
}

/// CPU ticks used between two snapshots by processes other than `ours`.
fn others_ticks(a: &BTreeMap<u32, u64>, b: &BTreeMap<u32, u64>, ours: &[u32]) -> u64 {
    b.iter()
        .filter(|(pid, _)| !ours.contains(pid))
        .map(|(pid, t)| t.saturating_sub(a.get(pid).copied().unwrap_or(0)))
        .sum()
}

fn self_cpu_ticks() -> Option<u64> {
    cpu_ticks(std::process::id())
}

/// A field of /proc/PID/status in KiB (VmHWM, VmRSS).
fn status_kib(pid: u32, field: &str) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
}

/// Resets the peak RSS (VmHWM) to the current RSS.
fn reset_hwm(pid: u32) {
    let _ = std::fs::write(format!("/proc/{pid}/clear_refs"), "5");
}

/// The commit the binaries were built from and the files that differed from it (this is a
/// working tree; the figures belong to exactly this state).
fn source_state() -> Value {
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .map(|s| s.trim().to_owned())
    };
    let commit = git(&["log", "-1", "--format=%h %s"]);
    let dirty: Vec<String> = git(&["status", "--porcelain", "--untracked-files=no"])
        .map(|s| s.lines().map(|l| l.trim().to_owned()).collect())
        .unwrap_or_default();
    json!({"commit": commit, "modified": dirty})
}

fn machine() -> Value {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split(':').nth(1))
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|| "unknown".into());
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0);
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_owned())
        .unwrap_or_default();
    let mem_kib = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("MemTotal"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse::<u64>().ok())
        })
        .unwrap_or(0);
    json!({"cpu": model, "cores": cores, "kernel": kernel, "memory_gib": (mem_kib as f64 / 1048576.0 * 10.0).round() / 10.0})
}

// ---------------------------------------------------------------------------------------------
// HTTP (metrics, readiness) without a client library: HTTP/1.0, the server closes.

async fn http_get(addr: &str, path: &str) -> Result<(u16, String), String> {
    let fut = async {
        let mut s = tokio::net::TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
        s.write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
            .await
            .map_err(|e| e.to_string())?;
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).await.map_err(|e| e.to_string())?;
        let text = String::from_utf8_lossy(&buf).into_owned();
        let status = text
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse::<u16>().ok())
            .ok_or_else(|| format!("no HTTP status from {addr}{path}"))?;
        let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default();
        Ok((status, body))
    };
    tokio::time::timeout(Duration::from_secs(10), fut)
        .await
        .map_err(|_| format!("GET {addr}{path} timed out"))?
}

/// One scrape of a Prometheus text endpoint.
/// A sample: series name, labels, value.
type Sample = (String, Vec<(String, String)>, f64);

#[derive(Default, Clone)]
struct Prom(Vec<Sample>);

impl Prom {
    fn parse(text: &str) -> Prom {
        let mut out = Vec::new();
        for line in text.lines() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (name, labels, rest) = match line.find('{') {
                Some(i) => {
                    let Some(j) = line.rfind('}') else { continue };
                    (&line[..i], parse_labels(&line[i + 1..j]), &line[j + 1..])
                }
                None => match line.split_once(' ') {
                    Some((n, r)) => (n, Vec::new(), r),
                    None => continue,
                },
            };
            if let Some(v) = rest.split_whitespace().next().and_then(|v| v.parse::<f64>().ok()) {
                out.push((name.to_owned(), labels, v));
            }
        }
        Prom(out)
    }

    /// The sum of a series over every label set that has the given labels.
    fn sum(&self, name: &str, want: &[(&str, &str)]) -> f64 {
        self.0
            .iter()
            .filter(|(n, l, _)| {
                n == name && want.iter().all(|(k, v)| l.iter().any(|(a, b)| a == k && b == v))
            })
            .map(|(_, _, v)| v)
            .sum()
    }

    /// Values of one series by one label.
    fn by(&self, name: &str, label: &str) -> BTreeMap<String, f64> {
        let mut m = BTreeMap::new();
        for (n, l, v) in &self.0 {
            if n == name {
                let k =
                    l.iter().find(|(a, _)| a == label).map(|(_, b)| b.clone()).unwrap_or_default();
                *m.entry(k).or_insert(0.0) += v;
            }
        }
        m
    }
}

fn parse_labels(s: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut rest = s;
    while let Some(eq) = rest.find('=') {
        let key = rest[..eq].trim().trim_start_matches(',').trim().to_owned();
        let after = &rest[eq + 1..];
        let Some(after) = after.strip_prefix('"') else { break };
        let mut val = String::new();
        let mut chars = after.char_indices();
        let mut end = after.len();
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => {
                    if let Some((_, n)) = chars.next() {
                        val.push(n);
                    }
                }
                '"' => {
                    end = i + 1;
                    break;
                }
                c => val.push(c),
            }
        }
        out.push((key, val));
        rest = &after[end.min(after.len())..];
    }
    out
}

async fn scrape(addr: &str) -> Result<Prom, String> {
    let (status, body) = http_get(addr, "/metrics").await?;
    if status != 200 {
        return Err(format!("GET {addr}/metrics: HTTP {status}"));
    }
    Ok(Prom::parse(&body))
}

/// What etcd itself counted: the figures the scenarios compare.
#[derive(Clone, Copy, Debug, Default)]
struct EtcdCounts {
    watch_streams_started: f64,
    watch_msgs_received: f64,
    watch_streams_ended: f64,
    range_handled: f64,
    watchers: f64,
    watch_streams: f64,
    slow_watchers: f64,
}

impl EtcdCounts {
    fn of(p: &Prom) -> EtcdCounts {
        let watch = [("grpc_method", "Watch"), ("grpc_service", "etcdserverpb.Watch")];
        let range = [("grpc_method", "Range"), ("grpc_service", "etcdserverpb.KV")];
        EtcdCounts {
            watch_streams_started: p.sum("grpc_server_started_total", &watch),
            watch_msgs_received: p.sum("grpc_server_msg_received_total", &watch),
            watch_streams_ended: p.sum("grpc_server_handled_total", &watch),
            range_handled: p.sum("grpc_server_handled_total", &range),
            watchers: p.sum("etcd_debugging_mvcc_watcher_total", &[]),
            watch_streams: p.sum("etcd_debugging_mvcc_watch_stream_total", &[]),
            slow_watchers: p.sum("etcd_debugging_mvcc_slow_watcher_total", &[]),
        }
    }

    fn delta(&self, before: &EtcdCounts) -> Value {
        json!({
            "watch_streams_started": self.watch_streams_started - before.watch_streams_started,
            "watch_messages_received": self.watch_msgs_received - before.watch_msgs_received,
            "watch_streams_ended": self.watch_streams_ended - before.watch_streams_ended,
            "range_requests": self.range_handled - before.range_handled,
        })
    }
}

fn map_delta(after: &BTreeMap<String, f64>, before: &BTreeMap<String, f64>) -> Value {
    let mut m = serde_json::Map::new();
    for (k, v) in after {
        let d = v - before.get(k).copied().unwrap_or(0.0);
        if d != 0.0 {
            m.insert(k.clone(), json!(d));
        }
    }
    Value::Object(m)
}

// ---------------------------------------------------------------------------------------------
// A log-linear latency histogram (microseconds, 64 sub-buckets per power of two: < 1.6 %).

const SUB_BITS: u32 = 6;
const SUB: u64 = 1 << SUB_BITS;
const BUCKETS: usize = (2 * SUB + (64 - SUB_BITS as u64 - 1) * SUB) as usize;

#[derive(Clone)]
struct Hist {
    counts: Vec<u32>,
    total: u64,
    max_us: u64,
}

impl Hist {
    fn new() -> Hist {
        Hist { counts: vec![0; BUCKETS], total: 0, max_us: 0 }
    }

    fn index(v: u64) -> usize {
        if v < 2 * SUB {
            return v as usize;
        }
        let msb = 63 - v.leading_zeros() as u64;
        let shift = msb - SUB_BITS as u64;
        let mantissa = v >> shift;
        (2 * SUB + (msb - SUB_BITS as u64 - 1) * SUB + (mantissa - SUB)) as usize
    }

    /// The middle of a bucket.
    fn value(idx: usize) -> f64 {
        let idx = idx as u64;
        if idx < 2 * SUB {
            return idx as f64;
        }
        let k = idx - 2 * SUB;
        let msb = k / SUB + SUB_BITS as u64 + 1;
        let shift = msb - SUB_BITS as u64;
        let mantissa = SUB + k % SUB;
        let lo = mantissa << shift;
        lo as f64 + ((1u64 << shift) as f64 - 1.0) / 2.0
    }

    fn record(&mut self, us: u64) {
        let i = Self::index(us).min(BUCKETS - 1);
        self.counts[i] = self.counts[i].saturating_add(1);
        self.total += 1;
        self.max_us = self.max_us.max(us);
    }

    fn merge(&mut self, o: &Hist) {
        for (a, b) in self.counts.iter_mut().zip(&o.counts) {
            *a = a.saturating_add(*b);
        }
        self.total += o.total;
        self.max_us = self.max_us.max(o.max_us);
    }

    fn quantile_ms(&self, q: f64) -> Option<f64> {
        if self.total == 0 {
            return None;
        }
        let rank = ((q * self.total as f64).ceil() as u64).clamp(1, self.total);
        let mut seen = 0u64;
        for (i, c) in self.counts.iter().enumerate() {
            seen += u64::from(*c);
            if seen >= rank {
                return Some((Self::value(i) / 1000.0).min(self.max_us as f64 / 1000.0));
            }
        }
        Some(self.max_us as f64 / 1000.0)
    }
}

// ---------------------------------------------------------------------------------------------
// Watchers.

/// Shared by the program: the time base of the values and where errors are tallied.
struct Shared {
    base: Instant,
    record_latency: AtomicBool,
    errors: Mutex<BTreeMap<String, u64>>,
}

impl Shared {
    fn now_ns(&self) -> u64 {
        self.base.elapsed().as_nanos() as u64
    }

    fn note_error(&self, what: &str, e: &str) {
        let mut msg = format!("{what}: {e}");
        msg.truncate(200);
        if let Ok(mut m) = self.errors.lock() {
            *m.entry(msg).or_insert(0) += 1;
        }
    }

    fn take_errors(&self) -> BTreeMap<String, u64> {
        self.errors.lock().map(|mut m| std::mem::take(&mut *m)).unwrap_or_default()
    }
}

/// One watcher's state, kept across its streams.
struct WState {
    /// Every revision up to this one has been seen (or counted missing).
    last_rev: AtomicU64,
    events: AtomicU64,
    missing: AtomicU64,
    duplicates: AtomicU64,
    /// `created` responses received.
    creates: AtomicU64,
    /// Streams that broke (error, end, cancel) and creations that failed.
    breaks: AtomicU64,
    failed_creates: AtomicU64,
    compacted: AtomicU64,
    hist: Mutex<Hist>,
}

impl WState {
    fn new(rev: u64) -> WState {
        WState {
            last_rev: AtomicU64::new(rev),
            events: AtomicU64::new(0),
            missing: AtomicU64::new(0),
            duplicates: AtomicU64::new(0),
            creates: AtomicU64::new(0),
            breaks: AtomicU64::new(0),
            failed_creates: AtomicU64::new(0),
            compacted: AtomicU64::new(0),
            hist: Mutex::new(Hist::new()),
        }
    }
}

#[derive(Clone, Copy, Debug, Default)]
struct WTotals {
    events: u64,
    missing: u64,
    duplicates: u64,
    creates: u64,
    breaks: u64,
    failed_creates: u64,
    compacted: u64,
}

impl WTotals {
    fn of(ws: &[Arc<WState>]) -> WTotals {
        let mut t = WTotals::default();
        for w in ws {
            t.events += w.events.load(Ordering::Relaxed);
            t.missing += w.missing.load(Ordering::Relaxed);
            t.duplicates += w.duplicates.load(Ordering::Relaxed);
            t.creates += w.creates.load(Ordering::Relaxed);
            t.breaks += w.breaks.load(Ordering::Relaxed);
            t.failed_creates += w.failed_creates.load(Ordering::Relaxed);
            t.compacted += w.compacted.load(Ordering::Relaxed);
        }
        t
    }

    fn minus(&self, b: &WTotals) -> WTotals {
        WTotals {
            events: self.events - b.events,
            missing: self.missing - b.missing,
            duplicates: self.duplicates - b.duplicates,
            creates: self.creates - b.creates,
            breaks: self.breaks - b.breaks,
            failed_creates: self.failed_creates - b.failed_creates,
            compacted: self.compacted - b.compacted,
        }
    }
}

async fn connect(endpoint: &str) -> Result<Client, String> {
    let opts = ConnectOptions::new().with_connect_timeout(Duration::from_secs(2));
    Client::connect([endpoint], Some(opts))
        .await
        .map_err(|e| format!("connecting to {endpoint}: {e}"))
}

/// Runs one watcher until aborted: watch from the next revision (the current one at first),
/// check every event, and on any break watch again from last revision + 1.
async fn run_watcher(client: Client, st: Arc<WState>, sh: Arc<Shared>, from_now: bool) {
    let mut first = from_now;
    let mut backoff = Duration::from_millis(20);
    loop {
        let start = if first { 0 } else { st.last_rev.load(Ordering::Relaxed) + 1 };
        let mut opts = WatchOptions::new().with_prefix();
        if start > 0 {
            opts = opts.with_start_revision(start as i64);
        }
        let mut wc = client.watch_client().max_decoding_message_size(256 << 20);
        let stream = match tokio::time::timeout(
            Duration::from_secs(5),
            wc.watch(PREFIX, Some(opts)),
        )
        .await
        {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => {
                st.failed_creates.fetch_add(1, Ordering::Relaxed);
                sh.note_error("watch create", &e.to_string());
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_millis(500));
                continue;
            }
            Err(_) => {
                st.failed_creates.fetch_add(1, Ordering::Relaxed);
                sh.note_error("watch create", "timed out after 5 s");
                continue;
            }
        };
        first = false;
        let (_sender, mut responses) = stream.split();
        let why = loop {
            match responses.message().await {
                Ok(Some(resp)) => {
                    if resp.created() {
                        st.creates.fetch_add(1, Ordering::Relaxed);
                        backoff = Duration::from_millis(20);
                    }
                    if resp.canceled() {
                        if resp.compact_revision() > 0 {
                            st.compacted.fetch_add(1, Ordering::Relaxed);
                            let c = resp.compact_revision() as u64;
                            let last = st.last_rev.load(Ordering::Relaxed);
                            if c > last + 1 {
                                st.missing.fetch_add(c - last - 1, Ordering::Relaxed);
                                st.last_rev.store(c - 1, Ordering::Relaxed);
                            }
                        }
                        break format!("canceled: {}", resp.cancel_reason());
                    }
                    let events = resp.events();
                    if events.is_empty() {
                        continue;
                    }
                    let now = sh.now_ns();
                    let record = sh.record_latency.load(Ordering::Relaxed);
                    let mut last = st.last_rev.load(Ordering::Relaxed);
                    let mut n = 0u64;
                    let mut missing = 0u64;
                    let mut dups = 0u64;
                    // Locked once per response (only this task and the end of a phase use it).
                    let mut hist = if record { st.hist.lock().ok() } else { None };
                    for ev in events {
                        let Some(kv) = ev.kv() else { continue };
                        let rev = kv.mod_revision().max(0) as u64;
                        if rev <= last {
                            dups += 1;
                            continue;
                        }
                        if rev > last + 1 {
                            missing += rev - last - 1;
                        }
                        last = rev;
                        n += 1;
                        if let Some(h) = hist.as_mut() {
                            let sent = std::str::from_utf8(kv.value())
                                .ok()
                                .and_then(|s| s.parse::<u64>().ok());
                            if let Some(sent) = sent {
                                h.record(now.saturating_sub(sent) / 1000);
                            }
                        }
                    }
                    drop(hist);
                    st.last_rev.store(last, Ordering::Relaxed);
                    st.events.fetch_add(n, Ordering::Relaxed);
                    if missing > 0 {
                        st.missing.fetch_add(missing, Ordering::Relaxed);
                    }
                    if dups > 0 {
                        st.duplicates.fetch_add(dups, Ordering::Relaxed);
                    }
                }
                Ok(None) => break "stream ended by the server".to_owned(),
                Err(e) => break e.to_string(),
            }
        };
        st.breaks.fetch_add(1, Ordering::Relaxed);
        sh.note_error("watch stream", &why);
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_millis(500));
    }
}

/// The watchers of one target: their state (kept across reconnections) and their tasks.
struct Fleet {
    states: Vec<Arc<WState>>,
    tasks: Vec<JoinHandle<()>>,
}

impl Fleet {
    fn new(n: usize, rev: u64) -> Fleet {
        Fleet { states: (0..n).map(|_| Arc::new(WState::new(rev))).collect(), tasks: Vec::new() }
    }

    /// Opens `conns` connections and starts every watcher on them.
    async fn start(
        &mut self,
        endpoint: &str,
        conns: usize,
        sh: &Arc<Shared>,
        from_now: bool,
    ) -> Result<(), String> {
        let mut clients = Vec::new();
        for _ in 0..conns.min(self.states.len()).max(1) {
            clients.push(connect(endpoint).await?);
        }
        for (i, st) in self.states.iter().enumerate() {
            let c = clients[i % clients.len()].clone();
            self.tasks.push(tokio::spawn(run_watcher(c, st.clone(), sh.clone(), from_now)));
        }
        Ok(())
    }

    /// Drops every stream and connection.
    async fn stop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
        for t in self.tasks.drain(..) {
            let _ = t.await;
        }
    }

    fn totals(&self) -> WTotals {
        WTotals::of(&self.states)
    }

    fn min_rev(&self) -> u64 {
        self.states.iter().map(|s| s.last_rev.load(Ordering::Relaxed)).min().unwrap_or(0)
    }

    fn count_at_least(&self, rev: u64) -> usize {
        self.states.iter().filter(|s| s.last_rev.load(Ordering::Relaxed) >= rev).count()
    }

    fn count_created(&self, at_least: &[u64]) -> usize {
        self.states
            .iter()
            .zip(at_least)
            .filter(|(s, n)| s.creates.load(Ordering::Relaxed) >= **n)
            .count()
    }

    fn creates(&self) -> Vec<u64> {
        self.states.iter().map(|s| s.creates.load(Ordering::Relaxed)).collect()
    }

    fn take_hist(&self) -> Hist {
        let mut h = Hist::new();
        for s in &self.states {
            if let Ok(mut x) = s.hist.lock() {
                h.merge(&x);
                *x = Hist::new();
            }
        }
        h
    }

    /// Waits until every watcher saw revision `rev`; the time it took, or an error.
    async fn wait_rev(&self, rev: u64, limit: Duration, what: &str) -> Result<Duration, String> {
        let t0 = Instant::now();
        loop {
            if self.min_rev() >= rev {
                return Ok(t0.elapsed());
            }
            if t0.elapsed() > limit {
                return Err(format!(
                    "{what}: after {limit:?} only {} of {} watchers have revision {rev} (the slowest is at {})",
                    self.count_at_least(rev),
                    self.states.len(),
                    self.min_rev()
                ));
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Marks what the watchers that fell short of `rev` did not receive as missing.
    fn settle_missing(&self, rev: u64) -> u64 {
        let mut n = 0;
        for s in &self.states {
            let last = s.last_rev.load(Ordering::Relaxed);
            if last < rev {
                n += rev - last;
            }
        }
        n
    }
}

// ---------------------------------------------------------------------------------------------
// The writer: puts straight to etcd at a fixed rate, the send time as the value.

#[derive(Debug, Default, Clone)]
struct WriteReport {
    puts: u64,
    errors: u64,
    first_rev: u64,
    last_rev: u64,
    seconds: f64,
}

struct Writer {
    stop: Arc<AtomicBool>,
    task: JoinHandle<WriteReport>,
}

impl Writer {
    fn start(
        clients: Vec<Client>,
        sh: Arc<Shared>,
        rate: u64,
        duration: Option<Duration>,
        key_mod: usize,
        seq: Arc<AtomicU64>,
    ) -> Writer {
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let task = tokio::spawn(async move {
            let inflight = Arc::new(Semaphore::new(256));
            let first = Arc::new(AtomicU64::new(u64::MAX));
            let last = Arc::new(AtomicU64::new(0));
            let errors = Arc::new(AtomicU64::new(0));
            let t0 = Instant::now();
            let mut sent = 0u64;
            let mut tick = tokio::time::interval(Duration::from_millis(1));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            loop {
                tick.tick().await;
                let el = t0.elapsed();
                if stop2.load(Ordering::Relaxed) || duration.is_some_and(|d| el >= d) {
                    break;
                }
                let due = (el.as_secs_f64() * rate as f64) as u64;
                while sent < due {
                    let Ok(permit) = inflight.clone().acquire_owned().await else { break };
                    let i = seq.fetch_add(1, Ordering::Relaxed);
                    let mut kv = clients[(i % clients.len() as u64) as usize].kv_client();
                    let key = format!("{PREFIX}k{}", i % key_mod as u64);
                    let (sh, first, last, errors) =
                        (sh.clone(), first.clone(), last.clone(), errors.clone());
                    tokio::spawn(async move {
                        let value = sh.now_ns().to_string();
                        match kv.put(key, value, None).await {
                            Ok(r) => {
                                let rev =
                                    r.header().map(|h| h.revision()).unwrap_or(0).max(0) as u64;
                                first.fetch_min(rev, Ordering::Relaxed);
                                last.fetch_max(rev, Ordering::Relaxed);
                            }
                            Err(e) => {
                                errors.fetch_add(1, Ordering::Relaxed);
                                sh.note_error("put", &e.to_string());
                            }
                        }
                        drop(permit);
                    });
                    sent += 1;
                }
            }
            let seconds = t0.elapsed().as_secs_f64();
            let _ = inflight.acquire_many(256).await;
            let f = first.load(Ordering::Relaxed);
            WriteReport {
                puts: sent - errors.load(Ordering::Relaxed),
                errors: errors.load(Ordering::Relaxed),
                first_rev: if f == u64::MAX { 0 } else { f },
                last_rev: last.load(Ordering::Relaxed),
                seconds,
            }
        });
        Writer { stop, task }
    }

    async fn finish(self) -> Result<WriteReport, String> {
        self.stop.store(true, Ordering::Relaxed);
        match tokio::time::timeout(Duration::from_secs(120), self.task).await {
            Ok(Ok(r)) => Ok(r),
            Ok(Err(e)) => Err(format!("writer task failed: {e}")),
            Err(_) => Err("writer did not finish within 120 s".into()),
        }
    }
}

async fn etcd_revision(c: &Client) -> Result<u64, String> {
    let mut c = c.clone();
    let r = tokio::time::timeout(Duration::from_secs(10), c.status())
        .await
        .map_err(|_| "etcd status timed out".to_owned())?
        .map_err(|e| format!("etcd status: {e}"))?;
    Ok(r.header().map(|h| h.revision()).unwrap_or(0).max(0) as u64)
}

// ---------------------------------------------------------------------------------------------
// Targets.

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    Etcd,
    Proxy,
    Watchcache,
}

impl Kind {
    fn parse(s: &str) -> Result<Kind, String> {
        match s.trim() {
            "etcd" => Ok(Kind::Etcd),
            "proxy" | "grpc-proxy" => Ok(Kind::Proxy),
            "watchcache" => Ok(Kind::Watchcache),
            o => Err(format!("unknown target {o:?} (etcd, proxy, watchcache)")),
        }
    }

    fn label(&self) -> &'static str {
        match self {
            Kind::Etcd => "etcd directly",
            Kind::Proxy => "etcd grpc-proxy",
            Kind::Watchcache => "watchcache",
        }
    }

    fn key(&self) -> &'static str {
        match self {
            Kind::Etcd => "etcd",
            Kind::Proxy => "proxy",
            Kind::Watchcache => "watchcache",
        }
    }
}

struct Env {
    cfg: Cfg,
    sh: Arc<Shared>,
    etcd: Proc,
    etcd_addr: String,
    etcd_client: Client,
    writers: Vec<Client>,
    seq: Arc<AtomicU64>,
    etcd_bin: PathBuf,
    watchcache_bin: PathBuf,
    dir: PathBuf,
    tck: u64,
}

/// A running target: the endpoint the watchers use, its process (none for etcd itself) and
/// where its metrics are.
struct Target {
    kind: Kind,
    endpoint: String,
    proc: Option<Proc>,
    http: Option<String>,
}

impl Target {
    fn pid(&self, env: &Env) -> u32 {
        self.proc.as_ref().map(|p| p.pid).unwrap_or(env.etcd.pid)
    }
}

async fn start_target(env: &Env, kind: Kind) -> Result<Target, String> {
    let port = host_etcd::etcd_launcher::free_port().map_err(|e| e.to_string())?;
    let endpoint = format!("127.0.0.1:{port}");
    match kind {
        Kind::Etcd => Ok(Target { kind, endpoint: env.etcd_addr.clone(), proc: None, http: None }),
        Kind::Proxy => {
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
            let mut t =
                Target { kind, endpoint: endpoint.clone(), proc: Some(p), http: Some(endpoint) };
            wait_target_ready(&mut t, Duration::from_secs(30)).await?;
            Ok(t)
        }
        Kind::Watchcache => {
            let http = format!(
                "127.0.0.1:{}",
                host_etcd::etcd_launcher::free_port().map_err(|e| e.to_string())?
            );
            let mut args: Vec<String> = vec![
                "serve".into(),
                "--etcd-endpoints".into(),
                env.etcd_addr.clone(),
                "--listen-grpc".into(),
                endpoint.clone(),
                "--listen-http".into(),
                http.clone(),
                "--prefix".into(),
                PREFIX.into(),
            ];
            // Extra flags for the server (e.g. BENCH_WATCHCACHE_ARGS="--batch-linger 2ms").
            if let Ok(extra) = std::env::var("BENCH_WATCHCACHE_ARGS") {
                args.extend(extra.split_whitespace().map(str::to_owned));
            }
            let log_env = std::env::var("BENCH_WATCHCACHE_LOG").unwrap_or_else(|_| "info".into());
            let p = Proc::spawn(
                "watchcache",
                &env.watchcache_bin,
                args,
                vec![("RUST_LOG".into(), log_env), ("NO_COLOR".into(), "1".into())],
                env.dir.join("watchcache.log"),
            )?;
            let mut t = Target { kind, endpoint, proc: Some(p), http: Some(http) };
            wait_target_ready(&mut t, Duration::from_secs(60)).await?;
            Ok(t)
        }
    }
}

/// Waits until the target serves: watchcache's `/readyz` answers 200, the proxy's `/metrics`
/// answers (neither touches etcd).
async fn wait_target_ready(t: &mut Target, limit: Duration) -> Result<Duration, String> {
    let t0 = Instant::now();
    let path = if t.kind == Kind::Watchcache { "/readyz" } else { "/metrics" };
    let Some(http) = t.http.clone() else { return Ok(Duration::ZERO) };
    loop {
        if let Some(p) = t.proc.as_mut() {
            if let Some(e) = p.exited() {
                return Err(e);
            }
        }
        if let Ok((200, _)) = http_get(&http, path).await {
            return Ok(t0.elapsed());
        }
        if t0.elapsed() > limit {
            return Err(format!("{} not ready after {limit:?} ({http}{path})", t.kind.label()));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn etcd_counts(env: &Env) -> Result<EtcdCounts, String> {
    Ok(EtcdCounts::of(&scrape(&env.etcd_addr).await?))
}

async fn wc_upstream(t: &Target) -> BTreeMap<String, f64> {
    match (&t.kind, &t.http) {
        (Kind::Watchcache, Some(h)) => scrape(h)
            .await
            .map(|p| p.by("watchcache_upstream_requests_total", "kind"))
            .unwrap_or_default(),
        _ => BTreeMap::new(),
    }
}

async fn wc_watch_sources(t: &Target) -> BTreeMap<String, f64> {
    match (&t.kind, &t.http) {
        (Kind::Watchcache, Some(h)) => scrape(h)
            .await
            .map(|p| p.by("watchcache_watch_requests_total", "source"))
            .unwrap_or_default(),
        _ => BTreeMap::new(),
    }
}

fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e5).round() / 100.0
}

fn tail_problems(log: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    text.lines()
        .map(strip_ansi)
        .filter(|l| {
            let json_level = [
                "\"level\":\"warn\"",
                "\"level\":\"error\"",
                "\"level\":\"panic\"",
                "\"level\":\"fatal\"",
            ];
            json_level.iter().any(|p| l.contains(p))
                || l.contains(" WARN ")
                || l.contains(" ERROR ")
                || l.contains("panicked")
        })
        .map(|mut s| {
            s.truncate(300);
            s
        })
        .collect()
}

fn strip_ansi(l: &str) -> String {
    let mut out = String::with_capacity(l.len());
    let mut chars = l.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for n in chars.by_ref() {
                if n.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Scenario A: fan-out.

async fn scenario_a(env: &Env, t: &mut Target, fleet: &mut Fleet) -> Result<Value, String> {
    let cfg = &env.cfg;
    let pid = t.pid(env);
    reset_hwm(pid);
    reset_hwm(env.etcd.pid);
    let r0 = etcd_revision(&env.etcd_client).await?;
    for s in &fleet.states {
        s.last_rev.store(r0, Ordering::Relaxed);
    }
    let t_create = Instant::now();
    fleet.start(&t.endpoint, cfg.conns, &env.sh, true).await?;
    let want = vec![1u64; fleet.states.len()];
    loop {
        let n = fleet.count_created(&want);
        if n == fleet.states.len() {
            break;
        }
        if t_create.elapsed() > Duration::from_secs(120) {
            return Err(format!(
                "A: only {n} of {} watches created after 120 s",
                fleet.states.len()
            ));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let create_time = t_create.elapsed();
    // Everything created; nobody wrote meanwhile.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = fleet.totals();
    let _ = fleet.take_hist();
    let e0 = etcd_counts(env).await?;
    let (cpu0, ecpu0, scpu0) = (cpu_ticks(pid), cpu_ticks(env.etcd.pid), self_cpu_ticks());
    let sys0 = system_busy_ticks();
    let procs0 = all_cpu_ticks();
    let wall0 = Instant::now();
    env.sh.record_latency.store(true, Ordering::Relaxed);
    let writer = Writer::start(
        env.writers.clone(),
        env.sh.clone(),
        cfg.rate,
        Some(Duration::from_secs(cfg.seconds)),
        cfg.write_keys,
        env.seq.clone(),
    );
    // Sample etcd's watcher gauges while the writes go on.
    let mut max_watchers = e0.watchers;
    let mut max_streams = e0.watch_streams;
    let mut max_slow = e0.slow_watchers;
    let mut wc_samples: Vec<Value> = Vec::new();
    let t_end = Instant::now() + Duration::from_secs(cfg.seconds);
    while Instant::now() < t_end {
        tokio::time::sleep(Duration::from_secs(1).min(t_end - Instant::now())).await;
        if let Ok(c) = etcd_counts(env).await {
            max_watchers = max_watchers.max(c.watchers);
            max_streams = max_streams.max(c.watch_streams);
            max_slow = max_slow.max(c.slow_watchers);
        }
        if let (Kind::Watchcache, Some(h)) = (t.kind, &t.http) {
            if let Ok(p) = scrape(h).await {
                wc_samples.push(json!({
                    "upstream_watches": p.sum("watchcache_upstream_watches", &[]),
                    "grpc_watchers": p.sum("watchcache_grpc_watchers", &[]),
                    "lagging_watchers": p.sum("watchcache_lagging_watchers", &[]),
                }));
            }
        }
        if let Some(p) = t.proc.as_mut() {
            if let Some(e) = p.exited() {
                return Err(format!("A: {e}"));
            }
        }
    }
    let w = writer.finish().await?;
    let drain = fleet.wait_rev(w.last_rev, cfg.drain_timeout, "A: drain").await;
    env.sh.record_latency.store(false, Ordering::Relaxed);
    let wall = wall0.elapsed();
    let (cpu1, ecpu1, scpu1) = (cpu_ticks(pid), cpu_ticks(env.etcd.pid), self_cpu_ticks());
    let sys1 = system_busy_ticks();
    let procs1 = all_cpu_ticks();
    let ours = [pid, env.etcd.pid, std::process::id()];
    let other_procs = others_ticks(&procs0, &procs1, &ours) as f64 / env.tck as f64;
    let hwm = status_kib(pid, "VmHWM");
    let e1 = etcd_counts(env).await?;
    let after = fleet.totals();
    let d = after.minus(&before);
    let short = fleet.settle_missing(w.last_rev);
    let hist = fleet.take_hist();
    let tck = env.tck as f64;
    let cpu = match (cpu0, cpu1) {
        (Some(a), Some(b)) => Some((b - a) as f64 / tck),
        _ => None,
    };
    let ecpu = match (ecpu0, ecpu1) {
        (Some(a), Some(b)) => Some((b - a) as f64 / tck),
        _ => None,
    };
    // Busy CPU of the whole machine minus our processes: other processes (by /proc/PID/stat)
    // and the rest, time no process was charged for (mostly softirq: loopback networking).
    let unattributed = match (sys0, sys1, ecpu, scpu0, scpu1) {
        (Some(a), Some(b), Some(e), Some(s0), Some(s1)) => {
            let target = if t.proc.is_some() { cpu.unwrap_or(0.0) } else { 0.0 };
            let ours = e + target + (s1 - s0) as f64 / tck;
            Some(((b - a) as f64 / tck - ours - other_procs).max(0.0))
        }
        _ => None,
    };
    let scpu = match (scpu0, scpu1) {
        (Some(a), Some(b)) => Some((b - a) as f64 / tck),
        _ => None,
    };
    let puts_in_window = w.last_rev.saturating_sub(r0);
    let expected = puts_in_window * fleet.states.len() as u64;
    let per_m = |c: Option<f64>| c.filter(|_| d.events > 0).map(|c| c / d.events as f64 * 1e6);
    let r = |x: Option<f64>| x.map(|v| (v * 1000.0).round() / 1000.0);
    Ok(json!({
        "watchers": fleet.states.len(),
        "connections": cfg.conns.min(fleet.states.len()),
        "watch_create_ms": ms(create_time),
        "puts": w.puts,
        "put_errors": w.errors,
        "put_seconds": (w.seconds * 100.0).round() / 100.0,
        "achieved_put_rate": (w.puts as f64 / w.seconds.max(1e-9)).round(),
        "revisions": [r0 + 1, w.last_rev],
        "first_put_revision": w.first_rev,
        "events_expected": expected,
        "events_delivered": d.events,
        "missing": d.missing + short,
        "gaps": d.missing,
        "undelivered_at_end": short,
        "watchers_behind_at_end": fleet.states.len() - fleet.count_at_least(w.last_rev),
        "duplicates": d.duplicates,
        "stream_breaks": d.breaks,
        "failed_creates": d.failed_creates,
        "compacted_cancels": d.compacted,
        "drained": drain.is_ok(),
        "drain": match &drain { Ok(t) => json!({"ms_after_last_put": ms(*t)}), Err(e) => json!({"error": e}) },
        "wall_seconds": (wall.as_secs_f64() * 100.0).round() / 100.0,
        "latency_ms": {
            "samples": hist.total,
            "p50": r(hist.quantile_ms(0.50)),
            "p90": r(hist.quantile_ms(0.90)),
            "p99": r(hist.quantile_ms(0.99)),
            "p999": r(hist.quantile_ms(0.999)),
            "max": hist.max_us as f64 / 1000.0,
        },
        "target_cpu_seconds": r(cpu),
        "target_cpu_seconds_per_million_events": r(per_m(cpu)),
        "etcd_cpu_seconds": r(ecpu),
        "bench_client_cpu_seconds": r(scpu),
        "other_processes_cpu_seconds": r(Some(other_procs)),
        "unattributed_cpu_seconds": r(unattributed),
        "machine_cpu_seconds_available": r(Some(wall.as_secs_f64() * std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1) as f64)),
        "target_peak_rss_mib": hwm.map(|k| (k as f64 / 1024.0 * 10.0).round() / 10.0),
        "etcd_watchers_max": max_watchers,
        "etcd_watch_streams_max": max_streams,
        "etcd_slow_watchers_max": max_slow,
        "etcd_watchers_before": e0.watchers,
        "etcd_watch_streams_before": e0.watch_streams,
        "etcd_during_a": e1.delta(&e0),
        "watchcache_samples": wc_samples,
    }))
}

// ---------------------------------------------------------------------------------------------
// Scenario B: reconnect storm.

async fn scenario_b(env: &Env, t: &mut Target, fleet: &mut Fleet) -> Result<Value, String> {
    under_slow_writes(env, t, fleet, Phase::Storm).await
}

/// What scenarios B and C do while puts go on at the slow rate.
enum Phase {
    Storm,
    Restart,
}

/// Scenarios B and C: the phase under slow writes, then the drain, and the whole scenario's
/// gaps and duplicates.
async fn under_slow_writes(
    env: &Env,
    t: &mut Target,
    fleet: &mut Fleet,
    phase: Phase,
) -> Result<Value, String> {
    let cfg = &env.cfg;
    let whole0 = fleet.totals();
    let writer = Writer::start(
        env.writers.clone(),
        env.sh.clone(),
        cfg.slow_rate,
        None,
        cfg.write_keys,
        env.seq.clone(),
    );
    let (res, label) = match phase {
        Phase::Storm => (storm(env, t, fleet).await, "B: drain"),
        Phase::Restart => (restart(env, t, fleet).await, "C: drain"),
    };
    let w = writer.finish().await?;
    let drain = fleet.wait_rev(w.last_rev, cfg.drain_timeout, label).await;
    let short = fleet.settle_missing(w.last_rev);
    let mut v = res?;
    v["writes"] = json!({"puts": w.puts, "errors": w.errors, "rate": cfg.slow_rate});
    v["drained"] = json!(drain.is_ok());
    if let Err(e) = drain {
        v["drain_error"] = json!(e);
    }
    // Over the whole scenario, the catch-up before the storm or restart included (a watcher
    // that was behind at the end of the previous scenario shows its gaps here).
    let whole = fleet.totals().minus(&whole0);
    v["gaps"] = json!(whole.missing);
    v["undelivered_at_end"] = json!(short);
    v["missing"] = json!(whole.missing + short);
    v["duplicates"] = json!(whole.duplicates);
    v["stream_breaks_whole_scenario"] = json!(whole.breaks);
    Ok(v)
}

async fn storm(env: &Env, t: &mut Target, fleet: &mut Fleet) -> Result<Value, String> {
    let cfg = &env.cfg;
    // Let the watchers get events at the modest rate first.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let r_live = etcd_revision(&env.etcd_client).await?;
    fleet.wait_rev(r_live, Duration::from_secs(60), "B: catching up before the storm").await?;
    let before = fleet.totals();
    let e0 = etcd_counts(env).await?;
    let wc0 = wc_upstream(t).await;
    let ws0 = wc_watch_sources(t).await;
    let cpu0 = cpu_ticks(t.pid(env));
    fleet.stop().await;
    let r_drop = fleet.min_rev();
    tokio::time::sleep(cfg.storm_gap).await;
    let r_resume = etcd_revision(&env.etcd_client).await?;
    let creates0 = fleet.creates();
    let want: Vec<u64> = creates0.iter().map(|c| c + 1).collect();
    let t0 = Instant::now();
    fleet.start(&t.endpoint, cfg.conns, &env.sh, false).await?;
    let mut created_ms = None;
    loop {
        if created_ms.is_none() && fleet.count_created(&want) == fleet.states.len() {
            created_ms = Some(ms(t0.elapsed()));
        }
        if created_ms.is_some() && fleet.min_rev() >= r_resume {
            break;
        }
        if t0.elapsed() > Duration::from_secs(120) {
            return Err(format!(
                "B: after 120 s, {} of {} watchers re-created, {} caught up to {r_resume}",
                fleet.count_created(&want),
                fleet.states.len(),
                fleet.count_at_least(r_resume)
            ));
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let caught_up = t0.elapsed();
    // Let whatever the target does lazily (e.g. the proxy's coalescing) happen.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let e1 = etcd_counts(env).await?;
    let wc1 = wc_upstream(t).await;
    let ws1 = wc_watch_sources(t).await;
    let cpu1 = cpu_ticks(t.pid(env));
    let d = fleet.totals().minus(&before);
    let mut v = json!({
        "watchers": fleet.states.len(),
        "resumed_from_revision_min": r_drop + 1,
        "etcd_revision_at_resume": r_resume,
        "all_created_ms": created_ms,
        "all_caught_up_ms": ms(caught_up),
        "etcd": e1.delta(&e0),
        "etcd_watchers_after": e1.watchers,
        "etcd_watch_streams_after": e1.watch_streams,
        "missing": d.missing,
        "duplicates": d.duplicates,
        "stream_breaks": d.breaks,
        "failed_creates": d.failed_creates,
        "target_cpu_seconds": match (cpu0, cpu1) { (Some(a), Some(b)) => json!((b - a) as f64 / env.tck as f64), _ => Value::Null },
    });
    if t.kind == Kind::Watchcache {
        v["watchcache_upstream_requests"] = map_delta(&wc1, &wc0);
        v["watchcache_watch_requests_by_source"] = map_delta(&ws1, &ws0);
    }
    Ok(v)
}

// ---------------------------------------------------------------------------------------------
// Scenario C: restart.

async fn scenario_c(env: &Env, t: &mut Target, fleet: &mut Fleet) -> Result<Value, String> {
    under_slow_writes(env, t, fleet, Phase::Restart).await
}

async fn restart(env: &Env, t: &mut Target, fleet: &mut Fleet) -> Result<Value, String> {
    tokio::time::sleep(Duration::from_secs(2)).await;
    let r_live = etcd_revision(&env.etcd_client).await?;
    fleet.wait_rev(r_live, Duration::from_secs(60), "C: catching up before the restart").await?;
    let keys = count_keys(env).await?;
    let before = fleet.totals();
    let e0 = etcd_counts(env).await?;
    let r_kill = etcd_revision(&env.etcd_client).await?;
    let t0 = Instant::now();
    let Some(p) = t.proc.as_mut() else { return Err("C: no process to restart".into()) };
    p.restart().await?;
    let ready = wait_target_ready(t, Duration::from_secs(60)).await?;
    let ready_ms = ms(t0.elapsed());
    let _ = ready;
    // Every watcher receiving again: each has an event written after the kill.
    let mut all_ms = None;
    let mut half_ms = None;
    let n = fleet.states.len();
    loop {
        let c = fleet.count_at_least(r_kill + 1);
        if half_ms.is_none() && c * 2 >= n {
            half_ms = Some(ms(t0.elapsed()));
        }
        if c == n {
            all_ms = Some(ms(t0.elapsed()));
            break;
        }
        if t0.elapsed() > Duration::from_secs(120) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let receiving = fleet.count_at_least(r_kill + 1);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let e1 = etcd_counts(env).await?;
    let wc1 = wc_upstream(t).await;
    let ws1 = wc_watch_sources(t).await;
    let d = fleet.totals().minus(&before);
    let mut v = json!({
        "watchers": n,
        "keys_under_prefix": keys,
        "etcd_revision_at_kill": r_kill,
        "restart_to_ready_ms": ready_ms,
        "half_receiving_ms": half_ms,
        "all_receiving_ms": all_ms,
        "receiving_after_120s": receiving,
        "etcd": e1.delta(&e0),
        "etcd_watchers_after": e1.watchers,
        "etcd_watch_streams_after": e1.watch_streams,
        "missing": d.missing,
        "duplicates": d.duplicates,
        "stream_breaks": d.breaks,
        "failed_creates": d.failed_creates,
        "created_responses": d.creates,
    });
    if t.kind == Kind::Watchcache {
        // The restarted process counts from zero: all of it is caused by the restart.
        v["watchcache_upstream_requests"] = map_delta(&wc1, &BTreeMap::new());
        v["watchcache_watch_requests_by_source"] = map_delta(&ws1, &BTreeMap::new());
    }
    Ok(v)
}

async fn count_keys(env: &Env) -> Result<u64, String> {
    // A count-only range on etcd (taken before the restart's baseline).
    let mut kv = env.etcd_client.kv_client();
    let r = kv
        .get(PREFIX, Some(etcd_client::GetOptions::new().with_prefix().with_count_only()))
        .await
        .map_err(|e| format!("counting keys: {e}"))?;
    Ok(r.count().max(0) as u64)
}

// ---------------------------------------------------------------------------------------------

async fn run_target(env: &Env, kind: Kind) -> Value {
    let mut out = json!({"target": kind.label()});
    let mut t = match start_target(env, kind).await {
        Ok(t) => t,
        Err(e) => {
            eprintln!("[{}] could not start: {e}", kind.label());
            out["error"] = json!(e);
            return out;
        }
    };
    if let Some(p) = &t.proc {
        out["pid"] = json!(p.pid);
        out["log"] = json!(p.log.display().to_string());
    }
    let r0 = etcd_revision(&env.etcd_client).await.unwrap_or(0);
    let mut fleet = Fleet::new(env.cfg.watchers, r0);
    let _ = env.sh.take_errors();

    eprintln!(
        "[{}] A: fan-out ({} watchers, {} puts/s for {} s)",
        kind.label(),
        env.cfg.watchers,
        env.cfg.rate,
        env.cfg.seconds
    );
    let a = scenario_a(env, &mut t, &mut fleet).await;
    out["A"] = a.unwrap_or_else(|e| json!({"error": e}));
    out["A"]["errors_seen"] = json!(env.sh.take_errors());
    eprintln!("[{}] A: {}", kind.label(), summary_a(&out["A"]));

    if out["A"].get("error").is_none() {
        eprintln!("[{}] B: reconnect storm", kind.label());
        let b = scenario_b(env, &mut t, &mut fleet).await;
        out["B"] = b.unwrap_or_else(|e| json!({"error": e}));
        out["B"]["errors_seen"] = json!(env.sh.take_errors());
        eprintln!("[{}] B: {}", kind.label(), out["B"]["etcd"]);
    } else {
        out["B"] = json!({"error": "skipped: A failed"});
    }

    if kind == Kind::Etcd {
        out["C"] = json!({"n/a": "restarting etcd itself is not comparable"});
    } else if out["A"].get("error").is_none() {
        eprintln!("[{}] C: restart", kind.label());
        let c = scenario_c(env, &mut t, &mut fleet).await;
        out["C"] = c.unwrap_or_else(|e| json!({"error": e}));
        out["C"]["errors_seen"] = json!(env.sh.take_errors());
        eprintln!(
            "[{}] C: {} receiving again after {} ms",
            kind.label(),
            out["C"]["etcd"],
            out["C"]["all_receiving_ms"]
        );
    } else {
        out["C"] = json!({"error": "skipped: A failed"});
    }

    fleet.stop().await;
    if let Some(p) = t.proc.as_mut() {
        out["log_problems"] = json!(tail_problems(&p.log));
        out["process_starts"] = json!(p.starts);
        p.kill().await;
    }
    // Let etcd forget the watchers before the next target.
    tokio::time::sleep(Duration::from_secs(2)).await;
    out
}

fn summary_a(a: &Value) -> String {
    if let Some(e) = a.get("error") {
        return format!("error: {e}");
    }
    format!(
        "{} of {} events, p50 {} ms, p99 {} ms, max {} ms, missing {}, target CPU {} s",
        a["events_delivered"],
        a["events_expected"],
        a["latency_ms"]["p50"],
        a["latency_ms"]["p99"],
        a["latency_ms"]["max"],
        a["missing"],
        a["target_cpu_seconds"]
    )
}

fn f(v: &Value) -> String {
    match v {
        Value::Null => "–".into(),
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                i.to_string()
            } else if let Some(x) = n.as_f64() {
                if x.fract() == 0.0 && x.abs() < 1e15 {
                    format!("{}", x as i64)
                } else if x.abs() >= 100.0 {
                    format!("{x:.0}")
                } else if x.abs() >= 10.0 {
                    format!("{x:.1}")
                } else {
                    format!("{x:.2}")
                }
            } else {
                n.to_string()
            }
        }
        Value::String(s) => s.clone(),
        Value::Bool(b) => b.to_string(),
        o => o.to_string(),
    }
}

/// Missing events: revisions skipped, plus those not delivered when the wait ended.
fn missing(v: &Value) -> String {
    let gaps = v["gaps"].as_u64().unwrap_or(0);
    match v["undelivered_at_end"].as_u64().unwrap_or(0) {
        0 => gaps.to_string(),
        u => format!("{gaps} skipped + {u} undelivered"),
    }
}

fn kinds(v: &Value) -> String {
    match v.as_object() {
        Some(m) if !m.is_empty() => {
            m.iter().map(|(k, v)| format!("{k} {}", f(v))).collect::<Vec<_>>().join(", ")
        }
        Some(_) => "0".into(),
        None => "–".into(),
    }
}

fn tables(results: &[Value]) -> String {
    let mut s = String::new();
    s.push_str("### A. fan-out\n\n");
    s.push_str("| target | puts (per s) | events delivered / expected | missing | stream breaks | p50 ms | p99 ms | max ms | target CPU s | CPU s per 1 M events | etcd CPU s | bench client CPU s | other processes / kernel CPU s | peak RSS MiB | etcd watchers / streams (max) |\n");
    s.push_str("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for r in results {
        let a = &r["A"];
        if let Some(e) = a.get("error") {
            s.push_str(&format!("| {} | error: {} |||||||||||||\n", f(&r["target"]), f(e)));
            continue;
        }
        s.push_str(&format!(
            "| {} | {} ({}) | {} / {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} / {} | {} | {} / {} |\n",
            f(&r["target"]),
            f(&a["puts"]),
            f(&a["achieved_put_rate"]),
            f(&a["events_delivered"]),
            f(&a["events_expected"]),
            missing(a),
            f(&a["stream_breaks"]),
            f(&a["latency_ms"]["p50"]),
            f(&a["latency_ms"]["p99"]),
            f(&a["latency_ms"]["max"]),
            f(&a["target_cpu_seconds"]),
            f(&a["target_cpu_seconds_per_million_events"]),
            f(&a["etcd_cpu_seconds"]),
            f(&a["bench_client_cpu_seconds"]),
            f(&a["other_processes_cpu_seconds"]),
            f(&a["unattributed_cpu_seconds"]),
            f(&a["target_peak_rss_mib"]),
            f(&a["etcd_watchers_max"]),
            f(&a["etcd_watch_streams_max"]),
        ));
    }
    s.push_str("\n### B. reconnect storm\n\n");
    s.push_str("| target | watchers resumed | all caught up ms | etcd Watch streams started / ended | etcd Watch messages received | etcd Range requests | watchcache upstream requests | missing / duplicates |\n");
    s.push_str("|---|---|---|---|---|---|---|---|\n");
    for r in results {
        let b = &r["B"];
        if let Some(e) = b.get("error") {
            s.push_str(&format!("| {} | error: {} ||||||\n", f(&r["target"]), f(e)));
            continue;
        }
        s.push_str(&format!(
            "| {} | {} | {} | {} / {} | {} | {} | {} | {} / {} |\n",
            f(&r["target"]),
            f(&b["watchers"]),
            f(&b["all_caught_up_ms"]),
            f(&b["etcd"]["watch_streams_started"]),
            f(&b["etcd"]["watch_streams_ended"]),
            f(&b["etcd"]["watch_messages_received"]),
            f(&b["etcd"]["range_requests"]),
            if b.get("watchcache_upstream_requests").is_some() {
                kinds(&b["watchcache_upstream_requests"])
            } else {
                "–".into()
            },
            missing(b),
            f(&b["duplicates"]),
        ));
    }
    s.push_str("\n### C. restart of the target\n\n");
    s.push_str("| target | keys | restart to ready ms | all watchers receiving ms | etcd Range requests | etcd Watch streams started / ended | etcd Watch messages received | watchcache upstream requests (new process) | missing / duplicates |\n");
    s.push_str("|---|---|---|---|---|---|---|---|---|\n");
    for r in results {
        let c = &r["C"];
        if c.get("n/a").is_some() {
            s.push_str(&format!(
                "| {} | n/a (restarting etcd itself is not comparable) ||||||||\n",
                f(&r["target"])
            ));
            continue;
        }
        if let Some(e) = c.get("error") {
            s.push_str(&format!("| {} | error: {} |||||||\n", f(&r["target"]), f(e)));
            continue;
        }
        let all = if c["all_receiving_ms"].is_null() {
            format!("not all within 120 s ({} receiving)", f(&c["receiving_after_120s"]))
        } else {
            f(&c["all_receiving_ms"])
        };
        s.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} / {} | {} | {} | {} / {} |\n",
            f(&r["target"]),
            f(&c["keys_under_prefix"]),
            f(&c["restart_to_ready_ms"]),
            all,
            f(&c["etcd"]["range_requests"]),
            f(&c["etcd"]["watch_streams_started"]),
            f(&c["etcd"]["watch_streams_ended"]),
            f(&c["etcd"]["watch_messages_received"]),
            if c.get("watchcache_upstream_requests").is_some() {
                kinds(&c["watchcache_upstream_requests"])
            } else {
                "–".into()
            },
            missing(c),
            f(&c["duplicates"]),
        ));
    }
    s
}

// ---------------------------------------------------------------------------------------------

fn find_etcd(a: &Args) -> Result<PathBuf, String> {
    let p = match &a.etcd {
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

fn find_watchcache(a: &Args) -> Result<PathBuf, String> {
    let p = a.watchcache.clone().unwrap_or_else(|| {
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

async fn start_etcd(bin: &Path, dir: &Path) -> Result<(Proc, String), String> {
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

async fn seed(client: &Client, keys: usize) -> Result<(), String> {
    let mut kv = client.kv_client();
    let mut i = 0;
    while i < keys {
        let ops: Vec<TxnOp> = (i..(i + 100).min(keys))
            .map(|k| TxnOp::put(format!("{PREFIX}k{k}"), "seed", None))
            .collect();
        i += ops.len();
        tokio::time::timeout(Duration::from_secs(30), kv.txn(Txn::new().and_then(ops)))
            .await
            .map_err(|_| "seeding: txn timed out".to_owned())?
            .map_err(|e| format!("seeding: {e}"))?;
    }
    Ok(())
}

async fn run(args: Args) -> Result<(), String> {
    let cfg = Cfg::of(&args);
    let kinds: Vec<Kind> = args.targets.iter().map(|s| Kind::parse(s)).collect::<Result<_, _>>()?;
    let etcd_bin = find_etcd(&args)?;
    let watchcache_bin = if kinds.contains(&Kind::Watchcache) {
        find_watchcache(&args)?
    } else {
        PathBuf::from("watchcache")
    };
    let etcd_version = std::process::Command::new(&etcd_bin)
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.lines().next().map(str::to_owned))
        .unwrap_or_default();
    let tmp =
        tempfile::Builder::new().prefix("bench-host-").tempdir().map_err(|e| e.to_string())?;
    let dir = tmp.path().to_path_buf();
    let command: Vec<String> = std::env::args().collect();
    let mach = machine();
    println!("# make bench-host");
    println!();
    println!(
        "Machine: {} ({} cores, {} GiB), Linux {}; {}",
        f(&mach["cpu"]),
        f(&mach["cores"]),
        f(&mach["memory_gib"]),
        f(&mach["kernel"]),
        etcd_version
    );
    println!("Command: `{}`", command.join(" "));
    let source = source_state();
    if let Some(c) = source["commit"].as_str() {
        let modified = source["modified"].as_array().map_or(0, Vec::len);
        let mut c = c.to_owned();
        c.truncate(72);
        println!(
            "Source: {c}{}",
            if modified > 0 { format!(" (+{modified} modified files)") } else { String::new() }
        );
    }
    println!(
        "Parameters: {} watchers over {} connections, {} puts/s for {} s (A), {} keys under {PREFIX}, {} puts/s during B and C{}",
        cfg.watchers,
        cfg.conns,
        cfg.rate,
        cfg.seconds,
        cfg.keys,
        cfg.slow_rate,
        if args.quick { " (--quick)" } else { "" }
    );
    println!();

    let t_start = Instant::now();
    let (etcd, etcd_addr) = start_etcd(&etcd_bin, &dir).await?;
    eprintln!("etcd {} on {etcd_addr} (pid {}); logs in {}", etcd_version, etcd.pid, dir.display());
    let etcd_client = connect(&etcd_addr).await?;
    let mut writers = Vec::new();
    for _ in 0..4 {
        writers.push(connect(&etcd_addr).await?);
    }
    seed(&etcd_client, cfg.keys).await?;
    let sh = Arc::new(Shared {
        base: Instant::now(),
        record_latency: AtomicBool::new(false),
        errors: Mutex::new(BTreeMap::new()),
    });
    let env = Env {
        cfg: cfg.clone(),
        sh,
        etcd,
        etcd_addr,
        etcd_client,
        writers,
        seq: Arc::new(AtomicU64::new(0)),
        etcd_bin,
        watchcache_bin,
        dir: dir.clone(),
        tck: clk_tck(),
    };
    let mut results = Vec::new();
    for k in &kinds {
        let r = run_target(&env, *k).await;
        results.push(r);
    }
    let etcd_problems = tail_problems(&dir.join("etcd.log"));
    let elapsed = t_start.elapsed();
    let md = tables(&results);
    println!("{md}");
    println!("Run time: {:.0} s", elapsed.as_secs_f64());
    let mut targets = serde_json::Map::new();
    for (k, r) in kinds.iter().zip(&results) {
        targets.insert(k.key().to_owned(), r.clone());
    }
    let doc = json!({
        "machine": mach,
        "command": command,
        "etcd_version": etcd_version,
        "source": source,
        "parameters": {
            "watchers": cfg.watchers, "connections": cfg.conns, "rate": cfg.rate,
            "seconds": cfg.seconds, "keys": cfg.keys, "write_keys": cfg.write_keys,
            "slow_rate": cfg.slow_rate, "storm_gap_ms": cfg.storm_gap.as_millis() as u64,
            "quick": args.quick, "clk_tck": env.tck,
        },
        "targets": targets,
        "etcd_log_problems": etcd_problems,
        "run_seconds": elapsed.as_secs_f64().round(),
        "markdown": md,
    });
    if let Some(parent) = args.out.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(|e| format!("{}: {e}", parent.display()))?;
    }
    let text = serde_json::to_string_pretty(&doc).map_err(|e| e.to_string())?;
    std::fs::write(&args.out, text).map_err(|e| format!("{}: {e}", args.out.display()))?;
    eprintln!("wrote {}", args.out.display());
    drop(env);
    if std::env::var_os("BENCH_KEEP_LOGS").is_some() {
        let kept = tmp.keep();
        eprintln!("logs kept in {}", kept.display());
    }
    Ok(())
}

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    let rt = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("bench_host: starting the runtime: {e}");
            return std::process::ExitCode::from(1);
        }
    };
    let code = rt.block_on(async {
        tokio::select! {
            r = run(args) => match r {
                Ok(()) => 0u8,
                Err(e) => {
                    eprintln!("bench_host: {e}");
                    1
                }
            },
            _ = shutdown_signal() => {
                eprintln!("bench_host: interrupted; stopping the child processes");
                130
            }
        }
    });
    kill_registered();
    rt.shutdown_timeout(Duration::from_secs(2));
    std::process::ExitCode::from(code)
}

async fn shutdown_signal() {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(t) => t,
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

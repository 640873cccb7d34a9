//! `make bench-host`: the host load benchmark. Targets side by side on the same etcd: etcd
//! itself, etcd's gRPC proxy (`etcd grpc-proxy start`), `watchcache serve`, and two
//! `watchcache serve` replicas with the watchers spread over both.
//!
//! Watchers are multiplexed as kube-apiserver and clientv3 multiplex them: several watches per
//! `Watch` stream (`--watches-per-stream`), several streams per connection, and by default
//! clientv3's order of creation on a stream (the next create is sent once the previous one is
//! created; `--create-mode pipelined` sends them all at once). The default run is issue 12's
//! reference run: 1 000 watchers in 100 streams over 5 connections, 500 puts/s of 64-byte
//! values for 20 s.
//!
//! Scenarios, per target (see BENCHMARKS.md, "Host"):
//! - A. fan-out: watch creation time (until every `created` is back), then puts at a fixed rate
//!   written straight to etcd: puts done, put-to-receive latency, server-side CPU (etcd +
//!   target) per delivery, peak RSS, etcd's watchers during the run.
//! - B. reconnect storm: every stream and connection dropped, every watcher resumed from its
//!   last revision + 1; what reached etcd, and the time until all caught up.
//! - C. restart: the target's processes killed and started again on the same ports, the
//!   watchers resuming from their last revision + 1; what reached etcd (its own `/metrics`) and
//!   the time until every watcher receives again. For etcd itself, the same watchers' plain
//!   reconnection (the time to compare with).
//! - D. 10 000 watchers (1 000 streams of 10, `--big-*`): a fresh target process, RSS before
//!   and after the creates, the creation time, a load at 50 puts/s, and C again with them.
//!
//! The last table sets each of issue 12's targets against its figure, with the ratios computed
//! in the same run.
//!
//! Two more modes: `--scale` (`make bench-scale`: 100 000 watches, RSS per idle watcher,
//! 1 M deliveries/s; `bench_host_parts/scale.rs`) and `--etcd-tool PATH` (`make
//! bench-etcd-tool`: etcd's own benchmark tool against each target; `bench_host_parts/etcd_tool.rs`).
//!
//! Every watcher checks that it saw every revision exactly once (all writes under the prefix
//! come from this program, one key per revision), across reconnects.
//!
//! Parameters: flags or `BENCH_*` environment variables (`--help`); `--quick` for a smoke run
//! with about 10x smaller numbers. Output: markdown tables on stdout, the same figures as JSON
//! in `artifacts/bench-host.json` (`bench-scale.json`, `bench-etcd-tool.json`).

// The JSON reports are large `json!` literals.
#![recursion_limit = "512"]

#[path = "bench_host_parts/etcd_tool.rs"]
mod etcd_tool;
#[path = "bench_host_parts/hist.rs"]
mod hist;
#[path = "bench_host_parts/procs.rs"]
mod procs;
#[path = "bench_host_parts/prom.rs"]
mod prom;
#[path = "bench_host_parts/report.rs"]
mod report;
#[path = "bench_host_parts/scale.rs"]
mod scale;
#[path = "bench_host_parts/targets.rs"]
mod targets;
#[path = "bench_host_parts/watch.rs"]
mod watch;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use clap::Parser;
use serde_json::{json, Value};

use procs::{
    all_cpu_ticks, cpu_ticks_sum, kill_registered, others_ticks, reset_hwm, self_cpu_ticks,
    system_busy_ticks, tail_problems,
};
use prom::{by_label_sum, map_delta, scrape, EtcdCounts};
use targets::{start_target, Env, Kind, Target, WcOpts};
use watch::{etcd_revision, Fleet, Layout, WriteSpec, Writer};

pub(crate) const PREFIX: &str = "/bench/";
pub(crate) const PREFIX_END: &str = "/bench0";

#[derive(Parser, Debug)]
#[command(
    about = "Watch load benchmark: etcd vs etcd grpc-proxy vs watchcache (one and two replicas), on one etcd"
)]
pub(crate) struct Args {
    /// A smoke run: about 10x smaller numbers (watchers, rate, duration, keys).
    #[arg(long)]
    pub(crate) quick: bool,
    /// Exit 1 unless every count closes: no phase failed, 0 missing and 0 duplicate events
    /// everywhere (what `make test` asks of its smoke run).
    #[arg(long)]
    pub(crate) check: bool,
    /// Watchers on the prefix in A, B and C (default 1000; --scale: 100000).
    #[arg(long, env = "BENCH_WATCHERS")]
    pub(crate) watchers: Option<usize>,
    /// Watches multiplexed on one Watch stream (default 10).
    #[arg(long, env = "BENCH_WATCHES_PER_STREAM")]
    pub(crate) watches_per_stream: Option<usize>,
    /// Client connections the streams are spread over (default 5; --scale: 250).
    #[arg(long, env = "BENCH_CONNS")]
    pub(crate) conns: Option<usize>,
    /// serial: a stream sends its next create once the previous is created (clientv3,
    /// kube-apiserver); pipelined: all at once.
    #[arg(long, env = "BENCH_CREATE_MODE", default_value = "serial")]
    pub(crate) create_mode: String,
    /// Puts per second in A (default 500; --scale: 10).
    #[arg(long, env = "BENCH_RATE")]
    pub(crate) rate: Option<u64>,
    /// Seconds of writing in A (default 20; --scale: 30).
    #[arg(long, env = "BENCH_SECONDS")]
    pub(crate) seconds: Option<u64>,
    /// Bytes per value (the send time, then padding).
    #[arg(long, env = "BENCH_VALUE_SIZE", default_value_t = 64)]
    pub(crate) value_size: usize,
    /// Keys under the prefix, written before anything else (default 10000).
    #[arg(long, env = "BENCH_KEYS")]
    pub(crate) keys: Option<usize>,
    /// The puts go to /bench/k{i % this} (default 1000).
    #[arg(long, env = "BENCH_WRITE_KEYS")]
    pub(crate) write_keys: Option<usize>,
    /// Puts per second while B and C run with A's watchers (default 100).
    #[arg(long, env = "BENCH_SLOW_RATE")]
    pub(crate) slow_rate: Option<u64>,
    /// How long the watchers stay away in B (ms; writes go on meanwhile).
    #[arg(long, env = "BENCH_STORM_GAP_MS", default_value_t = 500)]
    pub(crate) storm_gap_ms: u64,
    /// Watchers in D (and C with them), on streams of --watches-per-stream (default 10000; 0
    /// skips D).
    #[arg(long, env = "BENCH_BIG_WATCHERS")]
    pub(crate) big_watchers: Option<usize>,
    /// Connections in D (default 50).
    #[arg(long, env = "BENCH_BIG_CONNS")]
    pub(crate) big_conns: Option<usize>,
    /// Puts per second in D and its restart (default 50).
    #[arg(long, env = "BENCH_BIG_RATE")]
    pub(crate) big_rate: Option<u64>,
    /// Seconds of writing in D (default 10).
    #[arg(long, env = "BENCH_BIG_SECONDS")]
    pub(crate) big_seconds: Option<u64>,
    /// Longest wait (s) for every watch to be created.
    #[arg(long, env = "BENCH_CREATE_TIMEOUT", default_value_t = 120)]
    pub(crate) create_timeout: u64,
    /// Targets to run, comma-separated: etcd, proxy, watchcache, watchcache2.
    #[arg(
        long,
        env = "BENCH_TARGETS",
        value_delimiter = ',',
        default_value = "etcd,proxy,watchcache,watchcache2"
    )]
    pub(crate) targets: Vec<String>,
    /// The etcd binary (also runs the gRPC proxy); default .tools/bin/etcd.
    #[arg(long, env = "BENCH_ETCD")]
    pub(crate) etcd: Option<PathBuf>,
    /// The watchcache binary; default target/release/watchcache.
    #[arg(long, env = "BENCH_WATCHCACHE")]
    pub(crate) watchcache: Option<PathBuf>,
    /// Where the JSON goes (default artifacts/bench-host.json, bench-scale.json,
    /// bench-etcd-tool.json).
    #[arg(long, env = "BENCH_OUT")]
    pub(crate) out: Option<PathBuf>,
    /// Longest wait (s) for the watchers to receive everything after the writes stop.
    #[arg(long, env = "BENCH_DRAIN_TIMEOUT", default_value_t = 120)]
    pub(crate) drain_timeout: u64,
    /// The 100 000-watcher run (`make bench-scale`) instead of A-D.
    #[arg(long)]
    pub(crate) scale: bool,
    /// --scale: how long etcd directly gets to create the same watches (s).
    #[arg(long, env = "BENCH_SCALE_ETCD_LIMIT", default_value_t = 120)]
    pub(crate) scale_etcd_limit: u64,
    /// --scale: seconds of writing against etcd directly (it cannot deliver 1 M/s; 0 skips).
    #[arg(long, env = "BENCH_SCALE_ETCD_SECONDS", default_value_t = 5)]
    pub(crate) scale_etcd_seconds: u64,
    /// Run etcd's benchmark tool (this binary) against each target instead of A-D.
    #[arg(long, env = "BENCH_ETCD_TOOL")]
    pub(crate) etcd_tool: Option<PathBuf>,
}

/// The resolved parameters.
#[derive(Clone, Debug)]
pub(crate) struct Cfg {
    pub(crate) watchers: usize,
    pub(crate) per_stream: usize,
    pub(crate) conns: usize,
    pub(crate) serial: bool,
    pub(crate) rate: u64,
    pub(crate) seconds: u64,
    pub(crate) value_size: usize,
    pub(crate) keys: usize,
    pub(crate) write_keys: usize,
    pub(crate) slow_rate: u64,
    pub(crate) storm_gap: Duration,
    pub(crate) big_watchers: usize,
    pub(crate) big_conns: usize,
    pub(crate) big_rate: u64,
    pub(crate) big_seconds: u64,
    pub(crate) create_limit: Duration,
    pub(crate) drain_timeout: Duration,
}

impl Cfg {
    fn of(a: &Args) -> Result<Cfg, String> {
        let serial = match a.create_mode.as_str() {
            "serial" => true,
            "pipelined" => false,
            o => return Err(format!("--create-mode {o:?}: serial or pipelined")),
        };
        // (full run, --quick, --scale, --scale --quick)
        let pick = |v: Option<u64>, d: [u64; 4]| {
            v.unwrap_or(d[usize::from(a.quick) + 2 * usize::from(a.scale)]).max(1)
        };
        let pu = |v: Option<usize>, d: [usize; 4]| {
            v.unwrap_or(d[usize::from(a.quick) + 2 * usize::from(a.scale)]).max(1)
        };
        Ok(Cfg {
            watchers: pu(a.watchers, [1000, 100, 100_000, 10_000]),
            per_stream: pu(a.watches_per_stream, [10, 10, 10, 10]),
            conns: pu(a.conns, [5, 2, 250, 25]),
            serial,
            rate: pick(a.rate, [500, 100, 10, 10]),
            seconds: pick(a.seconds, [20, 3, 30, 5]),
            value_size: a.value_size,
            keys: pu(a.keys, [10_000, 1000, 10_000, 1000]),
            write_keys: pu(a.write_keys, [1000, 100, 1000, 100]),
            slow_rate: pick(a.slow_rate, [100, 20, 100, 20]),
            storm_gap: Duration::from_millis(a.storm_gap_ms),
            big_watchers: a.big_watchers.unwrap_or(if a.quick { 1000 } else { 10_000 }),
            big_conns: pu(a.big_conns, [50, 5, 50, 5]),
            big_rate: pick(a.big_rate, [50, 10, 50, 10]),
            big_seconds: pick(a.big_seconds, [10, 2, 10, 2]),
            create_limit: Duration::from_secs(a.create_timeout.max(1)),
            drain_timeout: Duration::from_secs(a.drain_timeout.max(1)),
        })
    }

    fn layout(&self) -> Layout {
        Layout {
            watchers: self.watchers,
            per_stream: self.per_stream,
            conns: self.conns,
            serial: self.serial,
        }
    }

    fn big_layout(&self) -> Layout {
        Layout {
            watchers: self.big_watchers,
            per_stream: self.per_stream,
            conns: self.big_conns,
            serial: self.serial,
        }
    }

    pub(crate) fn spec(&self) -> WriteSpec {
        WriteSpec { prefix: PREFIX.into(), key_mod: self.write_keys, value_size: self.value_size }
    }
}

pub(crate) fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e5).round() / 100.0
}

fn r3(x: Option<f64>) -> Option<f64> {
    x.map(|v| (v * 1000.0).round() / 1000.0)
}

fn mib(kib: Option<u64>) -> Option<f64> {
    kib.map(|k| (k as f64 / 1024.0 * 10.0).round() / 10.0)
}

pub(crate) fn new_fleet(env: &Env, layout: Layout, rev: u64) -> Fleet {
    Fleet::new(layout, rev, &env.sh, PREFIX.as_bytes(), PREFIX_END.as_bytes())
}

pub(crate) async fn etcd_counts(env: &Env) -> Result<EtcdCounts, String> {
    Ok(EtcdCounts::of(&scrape(&env.etcd_addr).await?))
}

async fn wc_upstream(t: &Target) -> BTreeMap<String, f64> {
    by_label_sum(&t.https, "watchcache_upstream_requests_total", "kind").await
}

async fn wc_watch_sources(t: &Target) -> BTreeMap<String, f64> {
    by_label_sum(&t.https, "watchcache_watch_requests_total", "source").await
}

/// The last revision written under the prefix: a put that failed (etcd's "request timed out"
/// under load) may still have been applied, so etcd's own revision counts (every write is ours).
async fn last_written(env: &Env, acknowledged: u64) -> Result<u64, String> {
    Ok(acknowledged.max(etcd_revision(&env.etcd_client).await?))
}

/// Waits until every watcher has `rev`, then again while etcd's revision still moves (a
/// timed-out put applied late); the time it took and the revision waited for.
async fn drain_to(
    env: &Env,
    fleet: &Fleet,
    mut rev: u64,
    limit: Duration,
    what: &str,
) -> Result<(Duration, u64), String> {
    let t0 = Instant::now();
    loop {
        let left = limit.saturating_sub(t0.elapsed());
        fleet.wait_rev(rev, left, what).await?;
        tokio::time::sleep(Duration::from_millis(300)).await;
        let now = etcd_revision(&env.etcd_client).await?;
        if now <= rev {
            return Ok((t0.elapsed(), rev));
        }
        rev = now;
    }
}

// ---------------------------------------------------------------------------------------------
// Watch creation: N watches on M streams, the time until every `created` is back.

pub(crate) async fn creation(
    env: &Env,
    t: &mut Target,
    fleet: &mut Fleet,
    from_now: bool,
    limit: Duration,
) -> Result<Value, String> {
    let want: Vec<u64> = fleet.creates().iter().map(|c| c + 1).collect();
    let _ = fleet.take_create_hists();
    let n = fleet.states.len();
    let (tcpu0, ecpu0, scpu0) = (t.cpu(), env.etcd_cpu(), self_cpu_ticks());
    let t0 = Instant::now();
    let connect = fleet.start(&t.endpoints, from_now).await?;
    let poll = Duration::from_millis(if n > 20_000 { 10 } else { 2 });
    let mut done = None;
    loop {
        if fleet.count_created(&want) == n {
            done = Some(t0.elapsed());
            break;
        }
        if t0.elapsed() > limit {
            break;
        }
        if let Some(e) = t.exited() {
            return Err(e);
        }
        tokio::time::sleep(poll).await;
    }
    let created = fleet.count_created(&want);
    let (first, next) = fleet.take_create_hists();
    let (tcpu1, ecpu1, scpu1) = (t.cpu(), env.etcd_cpu(), self_cpu_ticks());
    let secs = |a: Option<u64>, b: Option<u64>| match (a, b) {
        (Some(a), Some(b)) => json!((b - a) as f64 / env.tck as f64),
        _ => Value::Null,
    };
    let l = fleet.layout;
    Ok(json!({
        "watches": n,
        "streams": l.streams(),
        "connections": l.connections(),
        "mode": if l.serial { "serial" } else { "pipelined" },
        "connect_ms": ms(connect),
        "all_created_ms": done.map(ms),
        "created": created,
        "limit_s": limit.as_secs(),
        "first_create_on_stream_ms": first.summary(),
        "further_create_ms": next.summary(),
        "target_cpu_seconds": secs(tcpu0, tcpu1),
        "etcd_cpu_seconds": secs(ecpu0, ecpu1),
        "bench_client_cpu_seconds": secs(scpu0, scpu1),
    }))
}

// ---------------------------------------------------------------------------------------------
// A load phase: puts at a rate for a time, every delivery counted and timed.

pub(crate) async fn load_phase(
    env: &Env,
    t: &mut Target,
    fleet: &Fleet,
    rate: u64,
    seconds: u64,
    drain_timeout: Duration,
    spec: WriteSpec,
) -> Result<Value, String> {
    let pids = t.pids();
    let r0 = etcd_revision(&env.etcd_client).await?;
    let before = fleet.totals();
    let _ = fleet.take_latency();
    let e0 = etcd_counts(env).await?;
    let (cpu0, ecpu0, scpu0) = (t.cpu(), env.etcd_cpu(), self_cpu_ticks());
    let sys0 = system_busy_ticks();
    let procs0 = all_cpu_ticks();
    let wall0 = Instant::now();
    env.sh.record_latency.store(true, Ordering::Relaxed);
    let writer = Writer::start(
        env.writers.clone(),
        env.sh.clone(),
        rate,
        Some(Duration::from_secs(seconds)),
        spec,
        env.seq.clone(),
    );
    // Sample etcd's watcher gauges (and watchcache's) while the writes go on.
    let mut max_watchers = e0.watchers;
    let mut max_streams = e0.watch_streams;
    let mut max_slow = e0.slow_watchers;
    let mut wc_max_upstream = 0.0f64;
    let mut wc_max_lagging = 0.0f64;
    let t_end = Instant::now() + Duration::from_secs(seconds);
    while Instant::now() < t_end {
        tokio::time::sleep(Duration::from_secs(1).min(t_end - Instant::now())).await;
        if let Ok(c) = etcd_counts(env).await {
            max_watchers = max_watchers.max(c.watchers);
            max_streams = max_streams.max(c.watch_streams);
            max_slow = max_slow.max(c.slow_watchers);
        }
        if t.kind.is_watchcache() {
            let (mut up, mut lag) = (0.0, 0.0);
            for h in &t.https {
                if let Ok(p) = scrape(h).await {
                    up += p.sum("watchcache_upstream_watches", &[]);
                    lag += p.sum("watchcache_lagging_watchers", &[]);
                }
            }
            wc_max_upstream = wc_max_upstream.max(up);
            wc_max_lagging = wc_max_lagging.max(lag);
        }
        if let Some(e) = t.exited() {
            env.sh.record_latency.store(false, Ordering::Relaxed);
            return Err(e);
        }
    }
    let w = writer.finish().await?;
    let last_rev = last_written(env, w.last_rev).await?;
    let drain = drain_to(env, fleet, last_rev, drain_timeout, "drain").await;
    let last_rev = drain.as_ref().map(|(_, r)| *r).unwrap_or(last_rev);
    let drain = drain.map(|(t, _)| t);
    env.sh.record_latency.store(false, Ordering::Relaxed);
    let wall = wall0.elapsed();
    let (cpu1, ecpu1, scpu1) = (t.cpu(), env.etcd_cpu(), self_cpu_ticks());
    let sys1 = system_busy_ticks();
    let procs1 = all_cpu_ticks();
    let mut ours = pids.clone();
    ours.extend([env.etcd.pid, std::process::id()]);
    let other_procs = others_ticks(&procs0, &procs1, &ours) as f64 / env.tck as f64;
    let e1 = etcd_counts(env).await?;
    let d = fleet.totals().minus(&before);
    // Events of revisions above the one waited for: puts that etcd answered "request timed
    // out" and applied later (seen with 100 000 watchers on etcd directly). Counted apart.
    let late: u64 = fleet
        .states
        .iter()
        .map(|s| s.last_rev.load(Ordering::Relaxed).saturating_sub(last_rev))
        .sum();
    let delivered = d.events.saturating_sub(late);
    let short = fleet.settle_missing(last_rev);
    let hist = fleet.take_latency();
    let tck = env.tck as f64;
    let secs = |a: Option<u64>, b: Option<u64>| match (a, b) {
        (Some(a), Some(b)) => Some((b - a) as f64 / tck),
        _ => None,
    };
    let cpu = secs(cpu0, cpu1);
    let ecpu = secs(ecpu0, ecpu1);
    let scpu = secs(scpu0, scpu1);
    let server = ecpu.map(|e| e + cpu.unwrap_or(0.0));
    // Busy CPU of the whole machine minus our processes: other processes (by /proc/PID/stat)
    // and the rest, time no process was charged for (mostly softirq: loopback networking).
    let unattributed = match (secs(sys0, sys1), server, scpu) {
        (Some(all), Some(srv), Some(s)) => Some((all - srv - s - other_procs).max(0.0)),
        _ => None,
    };
    let puts_in_window = last_rev.saturating_sub(r0);
    let expected = puts_in_window * fleet.states.len() as u64;
    // CPU per delivery over every event delivered in the phase (late ones included).
    let per_m = |c: Option<f64>| c.filter(|_| d.events > 0).map(|c| c / d.events as f64 * 1e6);
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1) as f64;
    Ok(json!({
        "watchers": fleet.states.len(),
        "puts": w.puts,
        "put_errors": w.errors,
        "put_seconds": (w.seconds * 100.0).round() / 100.0,
        "put_rate_asked": rate,
        "achieved_put_rate": (w.puts as f64 / w.seconds.max(1e-9)).round(),
        "revisions": [r0 + 1, last_rev],
        "last_acknowledged_put_revision": w.last_rev,
        "first_put_revision": w.first_rev,
        "events_expected": expected,
        "events_delivered": delivered,
        "late_events": late,
        "missing": d.missing + short,
        "gaps": d.missing,
        "undelivered_at_end": short,
        "watchers_behind_at_end": fleet.states.len() - fleet.count_at_least(last_rev),
        "duplicates": d.duplicates,
        "stream_breaks": d.stream_breaks,
        "failed_stream_opens": d.failed_opens,
        "compacted_cancels": d.compacted,
        "drained": drain.is_ok(),
        "drain": match &drain { Ok(t) => json!({"ms_after_last_put": ms(*t)}), Err(e) => json!({"error": e}) },
        "wall_seconds": (wall.as_secs_f64() * 100.0).round() / 100.0,
        "deliveries_per_second": (d.events as f64 / wall.as_secs_f64().max(1e-9)).round(),
        "latency_ms": hist.summary(),
        "target_cpu_seconds": r3(cpu),
        "etcd_cpu_seconds": r3(ecpu),
        "server_cpu_seconds": r3(server),
        "server_cpu_seconds_per_million_deliveries": r3(per_m(server)),
        "target_us_per_delivery": r3(per_m(cpu)),
        "bench_client_cpu_seconds": r3(scpu),
        "bench_client_us_per_delivery": r3(per_m(scpu)),
        "other_processes_cpu_seconds": r3(Some(other_procs)),
        "unattributed_cpu_seconds": r3(unattributed),
        "machine_cpu_seconds_available": r3(Some(wall.as_secs_f64() * cores)),
        "target_peak_rss_mib": mib(t.status_kib(env, "VmHWM")),
        "etcd_peak_rss_mib": mib(procs::status_kib(env.etcd.pid, "VmHWM")),
        "etcd_watchers_max": max_watchers,
        "etcd_watch_streams_max": max_streams,
        "etcd_slow_watchers_max": max_slow,
        "etcd_watchers_before": e0.watchers,
        "etcd_during": e1.delta(&e0),
        "watchcache_upstream_watches_max": t.kind.is_watchcache().then_some(wc_max_upstream),
        "watchcache_lagging_watchers_max": t.kind.is_watchcache().then_some(wc_max_lagging),
        "loadavg_after": procs::loadavg(),
    }))
}

// ---------------------------------------------------------------------------------------------
// Scenario A: fan-out.

async fn scenario_a(
    env: &Env,
    cfg: &Cfg,
    t: &mut Target,
    fleet: &mut Fleet,
) -> Result<Value, String> {
    for p in t.pids() {
        reset_hwm(p);
    }
    reset_hwm(env.etcd.pid);
    let r0 = etcd_revision(&env.etcd_client).await?;
    // The round trip of one create on an otherwise idle target: one stream, 50 creates, each
    // sent when the previous is created.
    let mut probe =
        new_fleet(env, Layout { watchers: 50, per_stream: 50, conns: 1, serial: true }, r0);
    let rtt = creation(env, t, &mut probe, true, Duration::from_secs(30)).await;
    probe.stop().await;
    drop(probe);
    tokio::time::sleep(Duration::from_millis(200)).await;
    fleet.set_last_rev(r0);
    let create = creation(env, t, fleet, true, cfg.create_limit).await?;
    if create["all_created_ms"].is_null() {
        return Err(format!(
            "A: only {} of {} watches created after {:?}",
            create["created"],
            fleet.states.len(),
            cfg.create_limit
        ));
    }
    // Everything created; nobody wrote meanwhile.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut v =
        load_phase(env, t, fleet, cfg.rate, cfg.seconds, cfg.drain_timeout, cfg.spec()).await?;
    v["create"] = create;
    v["create_round_trip"] = rtt.unwrap_or_else(|e| json!({"error": e}));
    Ok(v)
}

// ---------------------------------------------------------------------------------------------
// Scenarios B and C.

/// What scenarios B and C do while puts go on at the slow rate.
#[derive(Clone, Copy)]
enum Phase {
    Storm,
    Restart,
}

/// Scenarios B and C: the phase under slow writes, then the drain, and the whole scenario's
/// gaps and duplicates.
async fn under_slow_writes(
    env: &Env,
    cfg: &Cfg,
    t: &mut Target,
    fleet: &mut Fleet,
    phase: Phase,
    rate: u64,
) -> Result<Value, String> {
    let whole0 = fleet.totals();
    let writer =
        Writer::start(env.writers.clone(), env.sh.clone(), rate, None, cfg.spec(), env.seq.clone());
    let (res, label) = match phase {
        Phase::Storm => (storm(env, cfg, t, fleet).await, "B: drain"),
        Phase::Restart => (restart(env, t, fleet).await, "C: drain"),
    };
    let w = writer.finish().await?;
    let last_rev = last_written(env, w.last_rev).await?;
    let drain = drain_to(env, fleet, last_rev, cfg.drain_timeout, label).await;
    let last_rev = drain.as_ref().map(|(_, r)| *r).unwrap_or(last_rev);
    let short = fleet.settle_missing(last_rev);
    let mut v = res?;
    v["writes"] = json!({"puts": w.puts, "errors": w.errors, "rate": rate});
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
    v["stream_breaks_whole_scenario"] = json!(whole.stream_breaks);
    Ok(v)
}

async fn storm(env: &Env, cfg: &Cfg, t: &mut Target, fleet: &mut Fleet) -> Result<Value, String> {
    // Let the watchers get events at the modest rate first.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let r_live = etcd_revision(&env.etcd_client).await?;
    fleet.wait_rev(r_live, Duration::from_secs(60), "B: catching up before the storm").await?;
    let before = fleet.totals();
    let e0 = etcd_counts(env).await?;
    let wc0 = wc_upstream(t).await;
    let ws0 = wc_watch_sources(t).await;
    let cpu0 = cpu_ticks_sum(&t.pids());
    fleet.stop().await;
    let r_drop = fleet.min_rev();
    tokio::time::sleep(cfg.storm_gap).await;
    let r_resume = etcd_revision(&env.etcd_client).await?;
    let creates0 = fleet.creates();
    let want: Vec<u64> = creates0.iter().map(|c| c + 1).collect();
    let t0 = Instant::now();
    let connect = fleet.start(&t.endpoints, false).await?;
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
    let cpu1 = cpu_ticks_sum(&t.pids());
    let d = fleet.totals().minus(&before);
    let mut v = json!({
        "watchers": fleet.states.len(),
        "streams": fleet.layout.streams(),
        "resumed_from_revision_min": r_drop + 1,
        "etcd_revision_at_resume": r_resume,
        "connect_ms": ms(connect),
        "all_created_ms": created_ms,
        "all_caught_up_ms": ms(caught_up),
        "etcd": e1.delta(&e0),
        "etcd_watchers_after": e1.watchers,
        "etcd_watch_streams_after": e1.watch_streams,
        "stream_breaks": d.stream_breaks,
        "failed_stream_opens": d.failed_opens,
        "target_cpu_seconds": match (cpu0, cpu1) { (Some(a), Some(b)) if !t.procs.is_empty() => json!((b - a) as f64 / env.tck as f64), _ => Value::Null },
    });
    if t.kind.is_watchcache() {
        v["watchcache_upstream_requests"] = map_delta(&wc1, &wc0);
        v["watchcache_watch_requests_by_source"] = map_delta(&ws1, &ws0);
    }
    Ok(v)
}

/// C: the target's processes killed and started again; for etcd itself, the same watchers'
/// reconnection (streams and connections dropped and opened again at once).
async fn restart(env: &Env, t: &mut Target, fleet: &mut Fleet) -> Result<Value, String> {
    tokio::time::sleep(Duration::from_secs(2)).await;
    let r_live = etcd_revision(&env.etcd_client).await?;
    fleet.wait_rev(r_live, Duration::from_secs(60), "C: catching up before the restart").await?;
    let keys = count_keys(env).await?;
    let before = fleet.totals();
    let e0 = etcd_counts(env).await?;
    let r_kill = etcd_revision(&env.etcd_client).await?;
    let t0 = Instant::now();
    let ready_ms = if t.procs.is_empty() {
        fleet.stop().await;
        fleet.start(&t.endpoints, false).await?;
        None
    } else {
        Some(ms(t.restart(Duration::from_secs(60)).await?))
    };
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
        "streams": fleet.layout.streams(),
        "what": if t.procs.is_empty() { "reconnection (etcd itself is not restarted)" } else { "restart of the target's processes" },
        "keys_under_prefix": keys,
        "etcd_revision_at_kill": r_kill,
        "restart_to_ready_ms": ready_ms,
        "half_receiving_ms": half_ms,
        "all_receiving_ms": all_ms,
        "all_receiving_after_ready_ms": match (all_ms, ready_ms) { (Some(a), Some(r)) => json!(((a - r) * 100.0).round() / 100.0), _ => Value::Null },
        "receiving_after_120s": receiving,
        "etcd": e1.delta(&e0),
        "etcd_watchers_after": e1.watchers,
        "etcd_watch_streams_after": e1.watch_streams,
        "stream_breaks": d.stream_breaks,
        "failed_stream_opens": d.failed_opens,
        "created_responses": d.creates,
    });
    if t.kind.is_watchcache() {
        // The restarted processes count from zero: all of it is caused by the restart.
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
// Scenario D: 10 000 watchers on a fresh target process, then C with them.

async fn scenario_d(env: &Env, cfg: &Cfg, t: &mut Target) -> (Value, Value) {
    let mut fleet = new_fleet(env, cfg.big_layout(), 0);
    let d = scenario_d_inner(env, cfg, t, &mut fleet).await;
    let c = match &d {
        Ok(_) => {
            eprintln!("[{}] C: restart with {} watchers", t.kind.label(), cfg.big_watchers);
            under_slow_writes(env, cfg, t, &mut fleet, Phase::Restart, cfg.big_rate)
                .await
                .unwrap_or_else(|e| json!({"error": e}))
        }
        Err(_) => json!({"error": "skipped: D failed"}),
    };
    fleet.stop().await;
    (d.unwrap_or_else(|e| json!({"error": e})), c)
}

async fn scenario_d_inner(
    env: &Env,
    cfg: &Cfg,
    t: &mut Target,
    fleet: &mut Fleet,
) -> Result<Value, String> {
    let fresh = if t.procs.is_empty() {
        false
    } else {
        t.restart(Duration::from_secs(60)).await?;
        true
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    let rss0 = t.status_kib(env, "VmRSS");
    let etcd_rss0 = procs::status_kib(env.etcd.pid, "VmRSS");
    for p in t.pids() {
        reset_hwm(p);
    }
    let r0 = etcd_revision(&env.etcd_client).await?;
    fleet.set_last_rev(r0);
    let create = creation(env, t, fleet, true, cfg.create_limit).await?;
    if create["all_created_ms"].is_null() {
        return Err(format!(
            "D: only {} of {} watches created after {:?}",
            create["created"],
            fleet.states.len(),
            cfg.create_limit
        ));
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let rss1 = t.status_kib(env, "VmRSS");
    let etcd_rss1 = procs::status_kib(env.etcd.pid, "VmRSS");
    let per_watcher = |a: Option<u64>, b: Option<u64>| match (a, b) {
        (Some(a), Some(b)) => {
            json!(((b as f64 - a as f64) / fleet.states.len() as f64 * 1000.0).round() / 1000.0)
        }
        _ => Value::Null,
    };
    let mut v =
        load_phase(env, t, fleet, cfg.big_rate, cfg.big_seconds, cfg.drain_timeout, cfg.spec())
            .await?;
    v["create"] = create;
    v["fresh_process"] = json!(fresh);
    v["rss_before_mib"] = json!(mib(rss0));
    v["rss_after_create_mib"] = json!(mib(rss1));
    v["rss_growth_per_watcher_kib"] = per_watcher(rss0, rss1);
    v["etcd_rss_before_mib"] = json!(mib(etcd_rss0));
    v["etcd_rss_after_create_mib"] = json!(mib(etcd_rss1));
    v["etcd_rss_growth_per_watcher_kib"] = per_watcher(etcd_rss0, etcd_rss1);
    Ok(v)
}

// ---------------------------------------------------------------------------------------------

async fn run_target(env: &Env, cfg: &Cfg, kind: Kind) -> Value {
    let mut out = json!({"target": kind.label(), "key": kind.key()});
    let mut t = match start_target(env, kind, &WcOpts { prefix: PREFIX.into() }).await {
        Ok(t) => t,
        Err(e) => {
            eprintln!("[{}] could not start: {e}", kind.label());
            out["error"] = json!(e);
            return out;
        }
    };
    out["pids"] = json!(t.pids());
    out["logs"] = json!(t.procs.iter().map(|p| p.log.display().to_string()).collect::<Vec<_>>());
    let r0 = etcd_revision(&env.etcd_client).await.unwrap_or(0);
    let mut fleet = new_fleet(env, cfg.layout(), r0);
    let _ = env.sh.take_errors();
    let l = cfg.layout();
    eprintln!(
        "[{}] A: fan-out ({} watchers in {} streams over {} connections, {} puts/s for {} s)",
        kind.label(),
        l.watchers,
        l.streams(),
        l.connections(),
        cfg.rate,
        cfg.seconds
    );
    let a = scenario_a(env, cfg, &mut t, &mut fleet).await;
    out["A"] = a.unwrap_or_else(|e| json!({"error": e}));
    out["A"]["errors_seen"] = json!(env.sh.take_errors());
    eprintln!("[{}] A: {}", kind.label(), report::summary_a(&out["A"]));
    let a_ok = out["A"].get("error").is_none();

    if a_ok {
        eprintln!("[{}] B: reconnect storm", kind.label());
        let b = under_slow_writes(env, cfg, &mut t, &mut fleet, Phase::Storm, cfg.slow_rate).await;
        out["B"] = b.unwrap_or_else(|e| json!({"error": e}));
        out["B"]["errors_seen"] = json!(env.sh.take_errors());
        eprintln!("[{}] B: {}", kind.label(), out["B"]["etcd"]);
        eprintln!("[{}] C: restart", kind.label());
        let c =
            under_slow_writes(env, cfg, &mut t, &mut fleet, Phase::Restart, cfg.slow_rate).await;
        out["C"] = c.unwrap_or_else(|e| json!({"error": e}));
        out["C"]["errors_seen"] = json!(env.sh.take_errors());
        eprintln!(
            "[{}] C: {} receiving again after {} ms",
            kind.label(),
            out["C"]["etcd"],
            out["C"]["all_receiving_ms"]
        );
    } else {
        out["B"] = json!({"error": "skipped: A failed"});
        out["C"] = json!({"error": "skipped: A failed"});
    }
    fleet.stop().await;
    drop(fleet);

    if cfg.big_watchers > 0 {
        let l = cfg.big_layout();
        eprintln!(
            "[{}] D: {} watchers in {} streams over {} connections, {} puts/s for {} s",
            kind.label(),
            l.watchers,
            l.streams(),
            l.connections(),
            cfg.big_rate,
            cfg.big_seconds
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
        let (d, c) = scenario_d(env, cfg, &mut t).await;
        out["D"] = d;
        out["D"]["errors_seen"] = json!(env.sh.take_errors());
        out["C_big"] = c;
        eprintln!("[{}] D: {}", kind.label(), report::summary_a(&out["D"]));
    }

    let mut problems = Vec::new();
    let mut starts = Vec::new();
    for p in t.procs.iter_mut() {
        problems.extend(tail_problems(&p.log));
        starts.push(p.starts);
        p.kill().await;
    }
    out["log_problems"] = json!(problems);
    out["process_starts"] = json!(starts);
    // Let etcd forget the watchers before the next target.
    tokio::time::sleep(Duration::from_secs(2)).await;
    out
}

async fn run(args: Args) -> Result<(), String> {
    let cfg = Cfg::of(&args)?;
    let nofile = procs::raise_nofile();
    let kinds: Vec<Kind> = args.targets.iter().map(|s| Kind::parse(s)).collect::<Result<_, _>>()?;
    let etcd_bin = targets::find_etcd(&args.etcd)?;
    let needs_wc =
        args.scale || args.etcd_tool.is_some() || kinds.iter().any(|k| k.is_watchcache());
    let watchcache_bin = if needs_wc {
        targets::find_watchcache(&args.watchcache)?
    } else {
        PathBuf::from("watchcache")
    };
    let etcd_version = targets::etcd_version(&etcd_bin);
    let tmp =
        tempfile::Builder::new().prefix("bench-host-").tempdir().map_err(|e| e.to_string())?;
    let dir = tmp.path().to_path_buf();
    let command: Vec<String> = std::env::args().collect();
    let mach = procs::machine();
    let limits = procs::kernel_limits(nofile);
    let source = procs::source_state();
    let mode = if args.scale {
        "bench-scale"
    } else if args.etcd_tool.is_some() {
        "bench-etcd-tool"
    } else {
        "bench-host"
    };
    println!("# make {mode}");
    println!();
    println!("{}", report::header(&mach, &etcd_version, &command, &source, &limits));
    let out_path =
        args.out.clone().unwrap_or_else(|| PathBuf::from(format!("artifacts/{mode}.json")));
    let t_start = Instant::now();
    let keys = if args.etcd_tool.is_some() { 0 } else { cfg.keys };
    let env = targets::start_env(etcd_bin, watchcache_bin, dir.clone(), PREFIX, keys).await?;
    let mut doc = json!({
        "machine": mach,
        "limits": limits,
        "command": command,
        "etcd_version": etcd_version,
        "source": source,
    });
    let md;
    if args.scale {
        let (m, v) = scale::run(&env, &cfg, &args).await?;
        md = m;
        doc["scale"] = v;
    } else if let Some(tool) = &args.etcd_tool {
        let tool_kinds: Vec<Kind> =
            kinds.iter().copied().filter(|k| *k != Kind::Watchcache2).collect();
        let (m, v) = etcd_tool::run(&env, tool, &tool_kinds, args.quick).await?;
        md = m;
        doc["etcd_tool"] = v;
    } else {
        let l = cfg.layout();
        let bl = cfg.big_layout();
        println!(
            "Parameters: A–C: {} watchers in {} streams ({} per stream, {} creates) over {} connections, {} puts/s of {}-byte values for {} s (A), {} keys under {PREFIX}, {} puts/s during B and C; D: {} watchers in {} streams over {} connections, {} puts/s for {} s{}",
            l.watchers,
            l.streams(),
            l.per_stream,
            if l.serial { "serial" } else { "pipelined" },
            l.connections(),
            cfg.rate,
            cfg.value_size,
            cfg.seconds,
            cfg.keys,
            cfg.slow_rate,
            bl.watchers,
            bl.streams(),
            bl.connections(),
            cfg.big_rate,
            cfg.big_seconds,
            if args.quick { " (--quick)" } else { "" }
        );
        println!();
        let mut results = Vec::new();
        for k in &kinds {
            results.push(run_target(&env, &cfg, *k).await);
        }
        let (goals_md, goals) = report::issue_targets(&results);
        md = format!("{}\n{}", report::tables(&results), goals_md);
        let mut targets = serde_json::Map::new();
        for (k, r) in kinds.iter().zip(&results) {
            targets.insert(k.key().to_owned(), r.clone());
        }
        doc["parameters"] = json!({
            "watchers": cfg.watchers, "watches_per_stream": cfg.per_stream, "connections": cfg.conns,
            "create_mode": if cfg.serial { "serial" } else { "pipelined" },
            "rate": cfg.rate, "seconds": cfg.seconds, "value_size": cfg.value_size,
            "keys": cfg.keys, "write_keys": cfg.write_keys, "slow_rate": cfg.slow_rate,
            "storm_gap_ms": cfg.storm_gap.as_millis() as u64,
            "big_watchers": cfg.big_watchers, "big_connections": cfg.big_conns,
            "big_rate": cfg.big_rate, "big_seconds": cfg.big_seconds,
            "quick": args.quick, "clk_tck": env.tck,
        });
        doc["targets"] = Value::Object(targets);
        doc["issue_12_targets"] = goals;
    }
    let etcd_problems = tail_problems(&dir.join("etcd.log"));
    let elapsed = t_start.elapsed();
    println!("{md}");
    println!(
        "Run time: {:.0} s; load average at the end: {}",
        elapsed.as_secs_f64(),
        procs::loadavg()
    );
    doc["etcd_log_problems"] = json!(etcd_problems);
    doc["run_seconds"] = json!(elapsed.as_secs_f64().round());
    doc["loadavg_at_end"] = json!(procs::loadavg());
    doc["markdown"] = json!(md);
    if let Some(parent) = out_path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(|e| format!("{}: {e}", parent.display()))?;
    }
    let text = serde_json::to_string_pretty(&doc).map_err(|e| e.to_string())?;
    std::fs::write(&out_path, text).map_err(|e| format!("{}: {e}", out_path.display()))?;
    eprintln!("wrote {}", out_path.display());
    let check = args.check;
    drop(env);
    if std::env::var_os("BENCH_KEEP_LOGS").is_some() {
        let kept = tmp.keep();
        eprintln!("logs kept in {}", kept.display());
    }
    if check {
        let mut problems = Vec::new();
        count_problems(&doc, "", &mut problems);
        if !problems.is_empty() {
            return Err(format!("--check: {}", problems.join("; ")));
        }
        eprintln!("--check: every phase ran, 0 missing and 0 duplicates");
    }
    Ok(())
}

/// Every `error`, and every non-zero `missing` or `duplicates`, anywhere in the results.
fn count_problems(v: &serde_json::Value, path: &str, out: &mut Vec<String>) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, x) in m {
                let here = if path.is_empty() { k.clone() } else { format!("{path}.{k}") };
                match (k.as_str(), x) {
                    ("error", serde_json::Value::String(e)) => out.push(format!("{here}: {e}")),
                    ("missing" | "duplicates", x) if x.as_u64().is_some_and(|n| n > 0) => {
                        out.push(format!("{here} = {x}"))
                    }
                    _ => count_problems(x, &here, out),
                }
            }
        }
        serde_json::Value::Array(a) => {
            for (i, x) in a.iter().enumerate() {
                count_problems(x, &format!("{path}[{i}]"), out);
            }
        }
        _ => {}
    }
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

//! `make bench-etcd-tool` (`bench_host --etcd-tool PATH`): etcd's own benchmark tool
//! (`go.etcd.io/etcd/v3/tools/benchmark`, built by `make setup-etcd-benchmark` into
//! `.tools/bin/etcd-benchmark`) run against etcd directly, the gRPC proxy and watchcache, one
//! after the other on the same etcd; its `watch`, `watch-latency` and `watch-get` commands,
//! with the server-side CPU (etcd + target) of each run read from /proc.
//!
//! The tool's keys are binary and not under any prefix, so watchcache runs here with
//! `--prefix=` (one cache of the whole keyspace) and serves every one of its watches and gets;
//! the tool writes through the target (watchcache and the proxy pass the puts on to etcd).

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::{json, Map, Value};

use crate::procs::tail_problems;
use crate::prom::{by_label_sum, map_delta};
use crate::report::f;
use crate::targets::{start_target, Env, Kind, WcOpts};

/// One command of the tool: its name, its flags (full run, --quick), what it reports.
struct Cmd {
    name: &'static str,
    args: fn(bool) -> Vec<String>,
    /// The section whose figures the ratios compare, and which of its figures (the `watch`
    /// command's latencies are not put-to-receive: only its time and rate mean something).
    key_section: &'static str,
    key_figures: &'static [&'static str],
}

fn s(v: &[&str]) -> Vec<String> {
    v.iter().map(|x| (*x).to_owned()).collect()
}

const CMDS: [Cmd; 3] = [
    Cmd {
        name: "watch",
        // 1 000 watches (100 streams of 10) on one key, 2 000 puts at 500/s: 2 M events.
        args: |q| {
            if q {
                s(&[
                    "watch",
                    "--streams",
                    "10",
                    "--watch-per-stream",
                    "10",
                    "--put-total",
                    "200",
                    "--put-rate",
                    "100",
                ])
            } else {
                s(&[
                    "watch",
                    "--streams",
                    "100",
                    "--watch-per-stream",
                    "10",
                    "--put-total",
                    "2000",
                    "--put-rate",
                    "500",
                ])
            }
        },
        key_section: "Watch events received summary",
        key_figures: &["total", "requests_per_sec"],
    },
    Cmd {
        name: "watch-latency",
        // 1 000 watches (100 streams of 10) on one key, 2 000 puts of 64-byte values at 500/s.
        args: |q| {
            if q {
                s(&[
                    "watch-latency",
                    "--streams",
                    "10",
                    "--watchers-per-stream",
                    "10",
                    "--put-total",
                    "200",
                    "--put-rate",
                    "100",
                    "--val-size",
                    "64",
                ])
            } else {
                s(&[
                    "watch-latency",
                    "--streams",
                    "100",
                    "--watchers-per-stream",
                    "10",
                    "--put-total",
                    "2000",
                    "--put-rate",
                    "500",
                    "--val-size",
                    "64",
                ])
            }
        },
        key_section: "Watch events summary",
        key_figures: &["p50", "p99", "total"],
    },
    Cmd {
        name: "watch-get",
        // 10 000 watches (100 streams) each catching up 8 events from an old revision, with
        // serializable gets timed meanwhile.
        args: |q| {
            if q {
                s(&["watch-get", "--watchers", "1000", "--streams", "10", "--events", "8"])
            } else {
                s(&["watch-get", "--watchers", "10000", "--streams", "100", "--events", "8"])
            }
        },
        key_section: "Get during watch summary",
        key_figures: &["total", "p50", "p99"],
    },
];

/// The report sections of the tool's output ("... summary:" then Total, Slowest, Fastest,
/// Average, Stddev, Requests/sec and the latency distribution), in seconds.
fn parse_report(text: &str) -> Value {
    let mut out = Map::new();
    let mut cur: Option<(String, Map<String, Value>)> = None;
    for line in text.lines() {
        let t = line.trim();
        if t.ends_with("summary:") {
            if let Some((k, m)) = cur.take() {
                out.insert(k, Value::Object(m));
            }
            cur = Some((t.trim_end_matches(':').to_owned(), Map::new()));
            continue;
        }
        let Some((_, m)) = cur.as_mut() else { continue };
        if let Some((p, rest)) = t.split_once("% in ") {
            let v = rest.split_whitespace().next().and_then(|x| x.parse::<f64>().ok());
            if let (Ok(_), Some(v)) = (p.parse::<f64>(), v) {
                m.insert(format!("p{p}"), json!(v));
            }
            continue;
        }
        if let Some((k, v)) = t.split_once(':') {
            let k = k.trim();
            if ["Total", "Slowest", "Fastest", "Average", "Stddev", "Requests/sec"].contains(&k) {
                if let Some(x) = v.split_whitespace().next().and_then(|x| x.parse::<f64>().ok()) {
                    m.insert(k.to_lowercase().replace('/', "_per_"), json!(x));
                }
            }
        }
        if t.starts_with('[') && t.contains(']') {
            let n = m.get("errors").and_then(Value::as_u64).unwrap_or(0);
            let c = t[1..t.find(']').unwrap_or(1)].parse::<u64>().unwrap_or(1);
            m.insert("errors".into(), json!(n + c));
        }
    }
    if let Some((k, m)) = cur.take() {
        out.insert(k, Value::Object(m));
    }
    Value::Object(out)
}

async fn run_cmd(
    env: &Env,
    tool: &Path,
    endpoint: &str,
    args: Vec<String>,
    quick: bool,
    t: &crate::targets::Target,
) -> Value {
    let conns = if quick { "2" } else { "5" };
    let mut full = vec![
        format!("--endpoints={endpoint}"),
        "--conns".into(),
        conns.into(),
        "--clients".into(),
        conns.into(),
        "--precise".into(),
    ];
    full.extend(args);
    let e0 = crate::etcd_counts(env).await.ok();
    let src0 = by_label_sum(&t.https, "watchcache_watch_requests_total", "source").await;
    let (tcpu0, ecpu0) = (t.cpu(), env.etcd_cpu());
    let t0 = Instant::now();
    let mut cmd = tokio::process::Command::new(tool);
    cmd.args(&full)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let limit = Duration::from_secs(if quick { 60 } else { 300 });
    let child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => return json!({"error": format!("starting {}: {e}", tool.display())}),
    };
    let out = tokio::time::timeout(limit, child.wait_with_output()).await;
    let wall = t0.elapsed();
    let (tcpu1, ecpu1) = (t.cpu(), env.etcd_cpu());
    let secs = |a: Option<u64>, b: Option<u64>| match (a, b) {
        (Some(a), Some(b)) => Some((b - a) as f64 / env.tck as f64),
        _ => None,
    };
    let (tc, ec) = (secs(tcpu0, tcpu1), secs(ecpu0, ecpu1));
    let e1 = crate::etcd_counts(env).await.ok();
    let src1 = by_label_sum(&t.https, "watchcache_watch_requests_total", "source").await;
    let mut v = json!({
        "etcd": match (e0, e1) { (Some(a), Some(b)) => b.delta(&a), _ => Value::Null },
        "watchcache_watch_requests_by_source": t.kind.is_watchcache().then(|| map_delta(&src1, &src0)),
        "command": full,
        "wall_seconds": (wall.as_secs_f64() * 100.0).round() / 100.0,
        "target_cpu_seconds": tc,
        "etcd_cpu_seconds": ec,
        "server_cpu_seconds": ec.map(|e| e + tc.unwrap_or(0.0)),
    });
    match out {
        Err(_) => v["error"] = json!(format!("timed out after {limit:?} (killed)")),
        Ok(Err(e)) => v["error"] = json!(e.to_string()),
        Ok(Ok(o)) => {
            let stdout = String::from_utf8_lossy(&o.stdout).into_owned();
            v["report"] = parse_report(&stdout);
            v["stdout"] = json!(stdout);
            if !o.status.success() {
                let err = String::from_utf8_lossy(&o.stderr);
                let tail: Vec<&str> = err.lines().rev().take(5).collect();
                v["error"] = json!(format!(
                    "exit {}: {}",
                    o.status,
                    tail.into_iter().rev().collect::<Vec<_>>().join(" / ")
                ));
            }
        }
    }
    v
}

pub(crate) async fn run(
    env: &Env,
    tool: &Path,
    kinds: &[Kind],
    quick: bool,
) -> Result<(String, Value), String> {
    if !tool.is_file() {
        return Err(format!("{} not found: run `make setup-etcd-benchmark`", tool.display()));
    }
    println!(
        "etcd's benchmark tool ({}), {} connections and clients; watchcache with --prefix= (the whole keyspace){}",
        tool.display(),
        if quick { 2 } else { 5 },
        if quick { " (--quick)" } else { "" }
    );
    println!();
    let mut results: Vec<(Kind, Value)> = Vec::new();
    for k in kinds {
        let mut out = json!({"target": k.label(), "key": k.key()});
        match start_target(env, *k, &WcOpts { prefix: String::new() }).await {
            Err(e) => out["error"] = json!(e),
            Ok(mut t) => {
                let endpoint = t.endpoints[0].clone();
                for c in &CMDS {
                    eprintln!("[{}] benchmark {}", k.label(), c.name);
                    let r = run_cmd(env, tool, &endpoint, (c.args)(quick), quick, &t).await;
                    if let Some(e) = r.get("error") {
                        eprintln!("[{}] {}: {}", k.label(), c.name, f(e));
                    }
                    out[c.name] = r;
                    tokio::time::sleep(Duration::from_secs(2)).await;
                }
                let mut problems = Vec::new();
                for p in t.procs.iter_mut() {
                    problems.extend(tail_problems(&p.log));
                    p.kill().await;
                }
                out["log_problems"] = json!(problems);
            }
        }
        results.push((*k, out));
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    let mut s = String::new();
    let ms = |v: &Value| {
        v.as_f64()
            .map(|x| crate::report::f(&json!((x * 1e5).round() / 100.0)))
            .unwrap_or_else(|| "–".into())
    };
    for c in &CMDS {
        s.push_str(&format!("### benchmark {}\n\n`{}`\n\n", c.name, (c.args)(quick).join(" ")));
        s.push_str("| target | section | total s | per s | average ms | p50 ms | p90 ms | p99 ms | slowest ms | errors | server CPU s (etcd + target) | target CPU s |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n");
        for (k, out) in &results {
            let r = &out[c.name];
            if let Some(e) = out.get("error").or_else(|| r.get("error")) {
                s.push_str(&format!("| {} | error: {} ||||||||||\n", k.label(), f(e)));
                if r.get("report").is_none() {
                    continue;
                }
            }
            let Some(rep) = r["report"].as_object() else { continue };
            for (sec, m) in rep {
                s.push_str(&format!(
                    "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
                    k.label(),
                    sec,
                    f(&m["total"]),
                    f(&m["requests_per_sec"]),
                    ms(&m["average"]),
                    ms(&m["p50"]),
                    ms(&m["p90"]),
                    ms(&m["p99"]),
                    ms(&m["slowest"]),
                    f(&m.get("errors").cloned().unwrap_or(json!(0))),
                    f(&r["server_cpu_seconds"]),
                    f(&r["target_cpu_seconds"]),
                ));
            }
        }
        s.push_str("\n| target | etcd Watch streams started | etcd Range requests | watchcache watches by source |\n|---|---|---|---|\n");
        for (k, out) in &results {
            let r = &out[c.name];
            s.push_str(&format!(
                "| {} | {} | {} | {} |\n",
                k.label(),
                f(&r["etcd"]["watch_streams_started"]),
                f(&r["etcd"]["range_requests"]),
                match r["watchcache_watch_requests_by_source"].as_object() {
                    Some(m) => m
                        .iter()
                        .map(|(k, v)| format!("{k} {}", f(v)))
                        .collect::<Vec<_>>()
                        .join(", "),
                    None => "–".into(),
                },
            ));
        }
        // watchcache against etcd and the proxy on the command's main section.
        let get = |key: &str, fig: &str| {
            results
                .iter()
                .find(|(k, _)| k.key() == key)
                .and_then(|(_, o)| o[c.name]["report"][c.key_section][fig].as_f64())
        };
        let cpu = |key: &str| {
            results
                .iter()
                .find(|(k, _)| k.key() == key)
                .and_then(|(_, o)| o[c.name]["server_cpu_seconds"].as_f64())
        };
        let rat = |a: Option<f64>, b: Option<f64>| match (a, b) {
            (Some(a), Some(b)) if b > 0.0 => format!("{:.2}×", a / b),
            _ => "–".into(),
        };
        let mut parts: Vec<String> = c
            .key_figures
            .iter()
            .map(|fig| {
                format!(
                    "{fig} {} / {}",
                    rat(get("watchcache", fig), get("etcd", fig)),
                    rat(get("watchcache", fig), get("proxy", fig))
                )
            })
            .collect();
        parts.push(format!(
            "server CPU {} / {}",
            rat(cpu("watchcache"), cpu("etcd")),
            rat(cpu("watchcache"), cpu("proxy"))
        ));
        s.push_str(&format!(
            "\nwatchcache / etcd directly, watchcache / proxy ({}): {}\n\n",
            c.key_section,
            parts.join(", ")
        ));
    }
    let mut m = Map::new();
    for (k, v) in results {
        m.insert(k.key().to_owned(), v);
    }
    Ok((s, Value::Object(m)))
}

//! `make bench-scale` (`bench_host --scale`): 100 000 watches on one prefix (10 per stream,
//! 10 000 streams over 250 connections), 10 puts/s (1 M deliveries/s asked).
//!
//! watchcache first, on a fresh process: its RSS with 0 watchers and with every watch created
//! and idle (the growth per idle watcher is the server's, not the core's share alone), the
//! setup time, then the puts (every delivery counted, p99). Then etcd directly with the same
//! watches, for as long as `--scale-etcd-limit` allows: its setup time (or how many it made in
//! the time), its own RSS growth, and a short write phase to show what it delivers.

use std::time::Duration;

use serde_json::{json, Value};

use crate::report::{create_row, f, CREATE_HEAD};
use crate::targets::{start_target, Env, Kind, WcOpts};
use crate::watch::etcd_revision;
use crate::{creation, load_phase, new_fleet, Args, Cfg, PREFIX};

fn mib(kib: Option<u64>) -> Option<f64> {
    kib.map(|k| (k as f64 / 1024.0 * 10.0).round() / 10.0)
}

fn per_watcher_bytes(a: Option<u64>, b: Option<u64>, n: usize) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) if n > 0 => {
            Some(((b as f64 - a as f64) * 1024.0 / n as f64 * 10.0).round() / 10.0)
        }
        _ => None,
    }
}

async fn one(
    env: &Env,
    cfg: &Cfg,
    kind: Kind,
    create_limit: Duration,
    write_seconds: u64,
) -> Value {
    let mut out = json!({"target": kind.label(), "key": kind.key()});
    let mut t = match start_target(env, kind, &WcOpts { prefix: PREFIX.into() }).await {
        Ok(t) => t,
        Err(e) => {
            out["error"] = json!(e);
            return out;
        }
    };
    tokio::time::sleep(Duration::from_secs(2)).await;
    let n = cfg.watchers;
    let rss0 = t.status_kib(env, "VmRSS");
    let etcd_rss0 = crate::procs::status_kib(env.etcd.pid, "VmRSS");
    let r0 = etcd_revision(&env.etcd_client).await.unwrap_or(0);
    let mut fleet = new_fleet(env, cfg.layout(), r0);
    let l = cfg.layout();
    eprintln!(
        "[{}] creating {n} watches in {} streams over {} connections (limit {create_limit:?})",
        kind.label(),
        l.streams(),
        l.connections()
    );
    let res = async {
        let create = creation(env, &mut t, &mut fleet, true, create_limit).await?;
        eprintln!(
            "[{}] created {} in {} ms",
            kind.label(),
            f(&create["created"]),
            f(&create["all_created_ms"])
        );
        out["create"] = create.clone();
        // Idle: let allocations settle before reading RSS.
        tokio::time::sleep(Duration::from_secs(3)).await;
        let rss1 = t.status_kib(env, "VmRSS");
        let etcd_rss1 = crate::procs::status_kib(env.etcd.pid, "VmRSS");
        let created = create["created"].as_u64().unwrap_or(0) as usize;
        out["rss_idle_0_mib"] = json!(mib(rss0));
        out["rss_idle_all_mib"] = json!(mib(rss1));
        out["rss_growth_per_idle_watcher_bytes"] = json!(per_watcher_bytes(rss0, rss1, created));
        out["etcd_rss_idle_0_mib"] = json!(mib(etcd_rss0));
        out["etcd_rss_idle_all_mib"] = json!(mib(etcd_rss1));
        out["etcd_rss_growth_per_idle_watcher_bytes"] =
            json!(per_watcher_bytes(etcd_rss0, etcd_rss1, created));
        if create["all_created_ms"].is_null() {
            out["load"] = json!({"skipped": format!("only {created} of {n} watches created in {create_limit:?}")});
            return Ok::<(), String>(());
        }
        if write_seconds == 0 {
            out["load"] = json!({"skipped": "--scale-etcd-seconds 0"});
            return Ok(());
        }
        eprintln!("[{}] {} puts/s for {write_seconds} s", kind.label(), cfg.rate);
        let drain = if kind == Kind::Etcd { Duration::from_secs(60) } else { cfg.drain_timeout };
        let load =
            load_phase(env, &mut t, &fleet, cfg.rate, write_seconds, drain, cfg.spec()).await?;
        let mut v = load.clone();
        v["create"] = out["create"].clone();
        eprintln!("[{}] {}", kind.label(), crate::report::summary_a(&v));
        out["load"] = load;
        Ok(())
    }
    .await;
    if let Err(e) = res {
        out["error"] = json!(e);
    }
    out["errors_seen"] = json!(env.sh.take_errors());
    fleet.stop().await;
    for p in t.procs.iter_mut() {
        out["log_problems"] = json!(crate::procs::tail_problems(&p.log));
        p.kill().await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    out
}

pub(crate) async fn run(env: &Env, cfg: &Cfg, args: &Args) -> Result<(String, Value), String> {
    let l = cfg.layout();
    println!(
        "Parameters: {} watches on {PREFIX} in {} streams ({} per stream, {} creates) over {} connections; {} puts/s of {}-byte values for {} s ({} deliveries/s asked); etcd directly: {} s to create the same watches, then {} s of the same puts{}",
        l.watchers,
        l.streams(),
        l.per_stream,
        if l.serial { "serial" } else { "pipelined" },
        l.connections(),
        cfg.rate,
        cfg.value_size,
        cfg.seconds,
        cfg.rate * l.watchers as u64,
        args.scale_etcd_limit,
        args.scale_etcd_seconds,
        if args.quick { " (--quick)" } else { "" }
    );
    println!();
    let wc_limit = cfg.create_limit.max(Duration::from_secs(300));
    let wc = one(env, cfg, Kind::Watchcache, wc_limit, cfg.seconds).await;
    // etcd directly unless --targets leaves it out (e.g. --targets watchcache).
    let etcd = if args.targets.iter().any(|t| t.trim() == "etcd") {
        one(
            env,
            cfg,
            Kind::Etcd,
            Duration::from_secs(args.scale_etcd_limit.max(1)),
            args.scale_etcd_seconds,
        )
        .await
    } else {
        json!({"target": Kind::Etcd.label(), "key": "etcd", "skipped": "not in --targets"})
    };
    let results = [wc, etcd];
    let mut s = String::new();
    s.push_str("### Setup\n\n");
    s.push_str(CREATE_HEAD);
    for r in &results {
        if r["create"].is_object() {
            s.push_str(&create_row(&r["target"], "setup", &r["create"]));
        } else if let Some(e) = r.get("error") {
            s.push_str(&format!("| {} | error: {} ||||||||||\n", f(&r["target"]), f(e)));
        }
    }
    s.push_str("\n### Memory (RSS with 0 watchers, and with every watch created and idle)\n\n");
    s.push_str("| target | RSS, 0 watchers MiB | RSS, all idle MiB | growth per idle watcher, bytes | etcd RSS 0 / all MiB | etcd's growth per idle watcher, bytes |\n|---|---|---|---|---|---|\n");
    for r in &results {
        s.push_str(&format!(
            "| {} | {} | {} | {} | {} / {} | {} |\n",
            f(&r["target"]),
            f(&r["rss_idle_0_mib"]),
            f(&r["rss_idle_all_mib"]),
            f(&r["rss_growth_per_idle_watcher_bytes"]),
            f(&r["etcd_rss_idle_0_mib"]),
            f(&r["etcd_rss_idle_all_mib"]),
            f(&r["etcd_rss_growth_per_idle_watcher_bytes"]),
        ));
    }
    s.push_str("\n### Deliveries\n\n");
    s.push_str("| target | puts done (asked / done per s) | delivered / expected | missing | dup. | deliveries per s | drained | p50 / p99 / max ms | CPU s per 1 M deliveries, etcd + target | target alone µs per delivery | bench client µs per delivery | peak RSS MiB | etcd watchers (max) |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for r in &results {
        let a = &r["load"];
        if let Some(sk) = a.get("skipped") {
            s.push_str(&format!("| {} | skipped: {} ||||||||||||\n", f(&r["target"]), f(sk)));
            continue;
        }
        if !a.is_object() {
            continue;
        }
        s.push_str(&format!(
            "| {} | {}{} ({} / {}) | {} / {}{} | {} | {} | {} | {} | {} / {} / {} | {} | {} | {} | {} | {} |\n",
            f(&r["target"]),
            f(&a["puts"]),
            crate::report::failed(a),
            f(&a["put_rate_asked"]),
            f(&a["achieved_put_rate"]),
            f(&a["events_delivered"]),
            f(&a["events_expected"]),
            crate::report::late(a),
            f(&a["missing"]),
            f(&a["duplicates"]),
            f(&a["deliveries_per_second"]),
            if a["drained"].as_bool() == Some(true) { format!("yes, {} ms after the last put", f(&a["drain"]["ms_after_last_put"])) } else { "no".into() },
            f(&a["latency_ms"]["p50"]),
            f(&a["latency_ms"]["p99"]),
            f(&a["latency_ms"]["max"]),
            f(&a["server_cpu_seconds_per_million_deliveries"]),
            f(&a["target_us_per_delivery"]),
            f(&a["bench_client_us_per_delivery"]),
            f(&a["target_peak_rss_mib"]),
            f(&a["etcd_watchers_max"]),
        ));
    }
    // Against the targets.
    let w = &results[0];
    let e = &results[1];
    let per = w["rss_growth_per_idle_watcher_bytes"].as_f64();
    let wl = &w["load"];
    let all = wl["events_expected"].as_u64().filter(|x| *x > 0).is_some()
        && wl["events_delivered"] == wl["events_expected"]
        && wl["missing"].as_u64() == Some(0)
        && wl["duplicates"].as_u64() == Some(0);
    let wt = w["create"]["all_created_ms"].as_f64();
    let et = e["create"]["all_created_ms"].as_f64();
    let ratio = match (wt, et) {
        (Some(a), Some(b)) if b > 0.0 => Some(a / b),
        _ => None,
    };
    s.push_str(&format!(
        "\n### Issue 12's targets ({} watchers; the issue's are 100 000)\n\n| target | figure | goal | met |\n|---|---|---|---|\n",
        cfg.watchers
    ));
    s.push_str(&format!(
        "| every event delivered | {} of {} (missing {}, duplicates {}) | all | {} |\n",
        f(&wl["events_delivered"]),
        f(&wl["events_expected"]),
        f(&wl["missing"]),
        f(&wl["duplicates"]),
        if all { "✔" } else { "✘" }
    ));
    s.push_str(&format!(
        "| p99 put-to-receive | {} ms (p50 {} ms, max {} ms) | stated | – |\n",
        f(&wl["latency_ms"]["p99"]),
        f(&wl["latency_ms"]["p50"]),
        f(&wl["latency_ms"]["max"])
    ));
    s.push_str(&format!(
        "| RSS growth per idle watcher, watchcache server | {} bytes | ≤ 2 KiB | {} |\n",
        per.map(|b| format!("{b:.0}")).unwrap_or_else(|| "–".into()),
        match per {
            Some(b) if b <= 2048.0 => "✔",
            Some(_) => "✘",
            None => "–",
        }
    ));
    s.push_str(&format!(
        "| setup time against etcd's | {} s against {} | stated | {} |\n",
        wt.map(|x| format!("{:.2}", x / 1000.0)).unwrap_or_else(|| "not all created".into()),
        match et {
            Some(x) => format!(
                "{:.2} s ({})",
                x / 1000.0,
                ratio.map(|r| format!("{r:.2}×")).unwrap_or_default()
            ),
            None => format!(
                "etcd: only {} created in {} s",
                f(&e["create"]["created"]),
                args.scale_etcd_limit
            ),
        },
        "–"
    ));
    let v = json!({
        "parameters": {
            "watchers": cfg.watchers, "watches_per_stream": cfg.per_stream, "connections": cfg.conns,
            "create_mode": if cfg.serial { "serial" } else { "pipelined" },
            "rate": cfg.rate, "seconds": cfg.seconds, "value_size": cfg.value_size, "keys": cfg.keys,
            "etcd_create_limit_s": args.scale_etcd_limit, "etcd_write_seconds": args.scale_etcd_seconds,
            "quick": args.quick,
        },
        "watchcache": results[0],
        "etcd": results[1],
    });
    Ok((s, v))
}

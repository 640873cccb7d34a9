//! Markdown out of the JSON figures: the run's header, one table per scenario, and issue 12's
//! targets with the ratios of the same run.

use serde_json::{json, Value};

/// A figure as the tables print it.
pub(crate) fn f(v: &Value) -> String {
    match v {
        Value::Null => "–".into(),
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                i.to_string()
            } else if let Some(x) = n.as_f64() {
                fx(x)
            } else {
                n.to_string()
            }
        }
        Value::String(s) => s.clone(),
        Value::Bool(b) => b.to_string(),
        o => o.to_string(),
    }
}

fn fx(x: f64) -> String {
    if x.fract() == 0.0 && x.abs() < 1e15 {
        format!("{}", x as i64)
    } else if x.abs() >= 100.0 {
        format!("{x:.0}")
    } else if x.abs() >= 10.0 {
        format!("{x:.1}")
    } else if x.abs() >= 0.1 {
        format!("{x:.2}")
    } else {
        format!("{x:.3}")
    }
}

pub(crate) fn header(
    mach: &Value,
    etcd_version: &str,
    command: &[String],
    source: &Value,
    limits: &Value,
) -> String {
    let mut s = format!(
        "Machine: {} ({} cores, {} GiB), Linux {}; {}; load average at start: {}\n",
        f(&mach["cpu"]),
        f(&mach["cores"]),
        f(&mach["memory_gib"]),
        f(&mach["kernel"]),
        etcd_version,
        f(&mach["loadavg_at_start"]),
    );
    s.push_str(&format!("Command: `{}`\n", command.join(" ")));
    if let Some(c) = source["commit"].as_str() {
        let modified = source["modified"].as_array().map_or(0, Vec::len);
        let mut c = c.to_owned();
        c.truncate(72);
        s.push_str(&format!(
            "Source: {c}{}\n",
            if modified > 0 { format!(" (+{modified} modified files)") } else { String::new() }
        ));
    }
    s.push_str(&format!(
        "Limits: open files {} (soft, hard; raised to the hard limit), fs.file-max {}, local ports {}, somaxconn {}, tcp_max_syn_backlog {}\n",
        limits["nofile_soft_hard"],
        f(&limits["fs.file-max"]),
        f(&limits["net.ipv4.ip_local_port_range"]),
        f(&limits["net.core.somaxconn"]),
        f(&limits["net.ipv4.tcp_max_syn_backlog"]),
    ));
    s
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

/// Puts that failed (e.g. etcd's "request timed out"), if any.
pub(crate) fn failed(a: &Value) -> String {
    match a["put_errors"].as_u64() {
        Some(n) if n > 0 => format!(" + {n} failed"),
        _ => String::new(),
    }
}

/// Events of revisions applied after the drain's revision (timed-out puts), if any.
pub(crate) fn late(a: &Value) -> String {
    match a["late_events"].as_u64() {
        Some(n) if n > 0 => format!(" (+ {n} of timed-out puts applied late)"),
        _ => String::new(),
    }
}

fn lat(v: &Value) -> String {
    format!("{} / {} / {}", f(&v["p50"]), f(&v["p99"]), f(&v["max"]))
}

pub(crate) fn summary_a(a: &Value) -> String {
    if let Some(e) = a.get("error") {
        return format!("error: {e}");
    }
    format!(
        "created in {} ms; {} of {} events, p50 {} ms, p99 {} ms, missing {}, server CPU {} s per 1 M",
        f(&a["create"]["all_created_ms"]),
        a["events_delivered"],
        a["events_expected"],
        f(&a["latency_ms"]["p50"]),
        f(&a["latency_ms"]["p99"]),
        a["missing"],
        f(&a["server_cpu_seconds_per_million_deliveries"]),
    )
}

fn err_row(target: &Value, e: &Value, cols: usize) -> String {
    format!("| {} | error: {} {}\n", f(target), f(e), "|".repeat(cols))
}

fn load_rows(s: &mut String, results: &[Value], key: &str) {
    s.push_str("| target | puts done (per s asked / done) | delivered / expected | missing | dup. | stream breaks | p50 / p99 / max ms | CPU s per 1 M deliveries, etcd + target | target alone µs per delivery | etcd CPU s | target CPU s | bench client µs per delivery | other processes / unattributed CPU s | target RSS MiB (peak) | etcd RSS MiB (peak) | etcd watchers / streams (max) |\n");
    s.push_str("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for r in results {
        let a = &r[key];
        if a.is_null() {
            continue;
        }
        if let Some(e) = a.get("error") {
            s.push_str(&err_row(&r["target"], e, 15));
            continue;
        }
        s.push_str(&format!(
            "| {} | {}{} ({} / {}) | {} / {}{} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} / {} | {} | {} | {} / {} |\n",
            f(&r["target"]),
            f(&a["puts"]),
            failed(a),
            f(&a["put_rate_asked"]),
            f(&a["achieved_put_rate"]),
            f(&a["events_delivered"]),
            f(&a["events_expected"]),
            late(a),
            missing(a),
            f(&a["duplicates"]),
            f(&a["stream_breaks"]),
            lat(&a["latency_ms"]),
            f(&a["server_cpu_seconds_per_million_deliveries"]),
            f(&a["target_us_per_delivery"]),
            f(&a["etcd_cpu_seconds"]),
            f(&a["target_cpu_seconds"]),
            f(&a["bench_client_us_per_delivery"]),
            f(&a["other_processes_cpu_seconds"]),
            f(&a["unattributed_cpu_seconds"]),
            f(&a["target_peak_rss_mib"]),
            f(&a["etcd_peak_rss_mib"]),
            f(&a["etcd_watchers_max"]),
            f(&a["etcd_watch_streams_max"]),
        ));
    }
}

pub(crate) fn create_row(target: &Value, phase: &str, c: &Value) -> String {
    format!(
        "| {} | {} | {} / {} / {} ({}) | {} | {} | {} | {} / {} | {} / {} | {} | {} | {} |\n",
        f(target),
        phase,
        f(&c["watches"]),
        f(&c["streams"]),
        f(&c["connections"]),
        f(&c["mode"]),
        f(&c["connect_ms"]),
        if c["all_created_ms"].is_null() {
            format!("not all in {} s", f(&c["limit_s"]))
        } else {
            f(&c["all_created_ms"])
        },
        f(&c["created"]),
        f(&c["first_create_on_stream_ms"]["p50"]),
        f(&c["first_create_on_stream_ms"]["p99"]),
        f(&c["further_create_ms"]["p50"]),
        f(&c["further_create_ms"]["p99"]),
        f(&c["target_cpu_seconds"]),
        f(&c["etcd_cpu_seconds"]),
        f(&c["bench_client_cpu_seconds"]),
    )
}

pub(crate) const CREATE_HEAD: &str = "| target | phase | watches / streams / connections (creates) | connections ready ms | all created ms | created | first create on a stream p50 / p99 ms | each further create p50 / p99 ms | target CPU s | etcd CPU s | bench client CPU s |\n|---|---|---|---|---|---|---|---|---|---|---|\n";

fn restart_row(s: &mut String, target: &Value, c: &Value) {
    if let Some(e) = c.get("error") {
        s.push_str(&err_row(target, e, 9));
        return;
    }
    let all = if c["all_receiving_ms"].is_null() {
        format!("not all within 120 s ({} receiving)", f(&c["receiving_after_120s"]))
    } else {
        format!("{} ({})", f(&c["all_receiving_ms"]), f(&c["all_receiving_after_ready_ms"]))
    };
    s.push_str(&format!(
        "| {} | {} ({}) | {} | {} | {} | {} | {} / {} | {} | {} | {} / {} |\n",
        f(target),
        f(&c["watchers"]),
        f(&c["streams"]),
        f(&c["what"]),
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

pub(crate) fn tables(results: &[Value]) -> String {
    let mut s = String::new();
    s.push_str("### A. fan-out\n\n");
    load_rows(&mut s, results, "A");
    s.push_str("\n### Watch creation (one stream of 50 serial creates on the idle target; A: the fleet above; D: the larger fleet)\n\n");
    s.push_str(CREATE_HEAD);
    for r in results {
        for (phase, key, sub) in [
            ("one stream, idle", "A", "create_round_trip"),
            ("A", "A", "create"),
            ("D", "D", "create"),
        ] {
            let c = &r[key][sub];
            if c.is_object() {
                s.push_str(&create_row(&r["target"], phase, c));
            }
        }
    }
    s.push_str("\n### B. reconnect storm\n\n");
    s.push_str("| target | watchers (streams) | all created ms | all caught up ms | etcd Watch streams started / ended | etcd Watch messages received | etcd Range requests | watchcache upstream requests | missing / duplicates |\n");
    s.push_str("|---|---|---|---|---|---|---|---|---|\n");
    for r in results {
        let b = &r["B"];
        if let Some(e) = b.get("error") {
            s.push_str(&err_row(&r["target"], e, 8));
            continue;
        }
        if b.is_null() {
            continue;
        }
        s.push_str(&format!(
            "| {} | {} ({}) | {} | {} | {} / {} | {} | {} | {} | {} / {} |\n",
            f(&r["target"]),
            f(&b["watchers"]),
            f(&b["streams"]),
            f(&b["all_created_ms"]),
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
    s.push_str("\n### C. restart of the target (etcd itself: the same watchers reconnecting)\n\n");
    s.push_str("| target | watchers (streams) | what | kill to ready ms | all receiving again ms (after ready) | etcd Range requests | etcd Watch streams started / ended | etcd Watch messages received | watchcache upstream requests (new processes) | missing / duplicates |\n");
    s.push_str("|---|---|---|---|---|---|---|---|---|---|\n");
    for r in results {
        for key in ["C", "C_big"] {
            if !r[key].is_null() {
                restart_row(&mut s, &r["target"], &r[key]);
            }
        }
    }
    if results.iter().any(|r| r["D"].is_object()) {
        s.push_str("\n### D. the larger fleet (a fresh target process, then C again with it)\n\n");
        load_rows(&mut s, results, "D");
        s.push_str("\n| target | RSS before / after the creates MiB | RSS growth per watcher KiB | etcd RSS before / after MiB | etcd RSS growth per watcher KiB |\n|---|---|---|---|---|\n");
        for r in results {
            let d = &r["D"];
            if d.get("error").is_some() || d.is_null() {
                continue;
            }
            s.push_str(&format!(
                "| {} | {} / {} | {} | {} / {} | {} |\n",
                f(&r["target"]),
                f(&d["rss_before_mib"]),
                f(&d["rss_after_create_mib"]),
                f(&d["rss_growth_per_watcher_kib"]),
                f(&d["etcd_rss_before_mib"]),
                f(&d["etcd_rss_after_create_mib"]),
                f(&d["etcd_rss_growth_per_watcher_kib"]),
            ));
        }
    }
    s
}

// ---------------------------------------------------------------------------------------------
// Issue 12's targets.

fn by_key<'a>(results: &'a [Value], key: &str) -> Option<&'a Value> {
    results.iter().find(|r| r["key"] == key)
}

fn num(r: Option<&Value>, path: &[&str]) -> Option<f64> {
    let mut v = r?;
    for p in path {
        v = v.get(*p)?;
    }
    v.as_f64()
}

fn ratio(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => Some(a / b),
        _ => None,
    }
}

fn rx(r: Option<f64>) -> String {
    r.map(|x| format!("{x:.2}×")).unwrap_or_else(|| "–".into())
}

fn met(ok: Option<bool>) -> &'static str {
    match ok {
        Some(true) => "✔",
        Some(false) => "✘",
        None => "–",
    }
}

/// The table of issue 12's targets, and the same as JSON.
pub(crate) fn issue_targets(results: &[Value]) -> (String, Value) {
    let etcd = by_key(results, "etcd");
    let proxy = by_key(results, "proxy");
    let wcs: Vec<(&str, Option<&Value>)> = vec![
        ("watchcache", by_key(results, "watchcache")),
        ("watchcache, 2 replicas", by_key(results, "watchcache2")),
    ];
    let mut rows: Vec<Value> = Vec::new();
    let mut add =
        |what: String, figure: String, ratio: Option<f64>, goal: &str, ok: Option<bool>| {
            rows.push(
                json!({"target": what, "figure": figure, "ratio": ratio, "goal": goal, "met": ok}),
            );
        };
    let ms_s =
        |v: Option<f64>| v.map(|x| format!("{:.3} s", x / 1000.0)).unwrap_or_else(|| "–".into());

    for (name, wc) in &wcs {
        if wc.is_none() {
            continue;
        }
        // 1. Watch creation at etcd's speed.
        let e = num(etcd, &["D", "create", "all_created_ms"]);
        let w = num(*wc, &["D", "create", "all_created_ms"]);
        let n = num(*wc, &["D", "create", "watches"]).unwrap_or(0.0);
        let st = num(*wc, &["D", "create", "streams"]).unwrap_or(0.0);
        let r = ratio(w, e);
        add(
            format!("{name}: {n} watches on {st} streams created (D)"),
            format!("{} against etcd's {}", ms_s(w), ms_s(e)),
            r,
            "≤ 1.5× etcd's",
            r.map(|r| r <= 1.5),
        );
        let e = num(etcd, &["A", "create", "all_created_ms"]);
        let w = num(*wc, &["A", "create", "all_created_ms"]);
        let n = num(*wc, &["A", "create", "watches"]).unwrap_or(0.0);
        let r = ratio(w, e);
        add(
            format!("{name}: {n} watches created (A)"),
            format!("{} against etcd's {}", ms_s(w), ms_s(e)),
            r,
            "(the same goal, at A's size)",
            None,
        );
        let e = num(etcd, &["A", "create_round_trip", "further_create_ms", "p50"]);
        let w = num(*wc, &["A", "create_round_trip", "further_create_ms", "p50"]);
        let e99 = num(etcd, &["A", "create_round_trip", "further_create_ms", "p99"]);
        let w99 = num(*wc, &["A", "create_round_trip", "further_create_ms", "p99"]);
        let o = |x: Option<f64>| x.map(fx).unwrap_or_else(|| "–".into());
        add(
            format!("{name}: one create's round trip, one stream on the idle target"),
            format!("p50 {} ms (p99 {}) against etcd's {} ms ({})", o(w), o(w99), o(e), o(e99)),
            ratio(w, e),
            "(what each serial create waits for)",
            None,
        );
        // Reconnection inside the window: 0 requests to etcd, ≤ 1.5× etcd's time.
        let e = num(etcd, &["B", "all_caught_up_ms"]);
        let w = num(*wc, &["B", "all_caught_up_ms"]);
        // The cache's own once-a-second compaction probe is no request of the watchers'.
        let probes = num(*wc, &["B", "watchcache_upstream_requests", "compaction_probe"]);
        let all_reqs = num(*wc, &["B", "etcd", "watch_streams_started"])
            .zip(num(*wc, &["B", "etcd", "range_requests"]))
            .map(|(a, b)| a + b);
        let reqs = all_reqs.map(|a| (a - probes.unwrap_or(0.0)).max(0.0));
        let r = ratio(w, e);
        add(
            format!("{name}: watchers resumed inside the window (B)"),
            format!(
                "all caught up in {} against etcd's {}; requests to etcd {} (Watch streams + Ranges {}, minus the cache's compaction probes {})",
                ms_s(w),
                ms_s(e),
                reqs.map(fx).unwrap_or_else(|| "–".into()),
                all_reqs.map(fx).unwrap_or_else(|| "–".into()),
                probes.map(fx).unwrap_or_else(|| "0".into()),
            ),
            r,
            "≤ 1.5× etcd's, 0 requests to etcd",
            r.zip(reqs).map(|(r, q)| r <= 1.5 && q == 0.0),
        );
        // 2. Restart without a storm.
        let replicas = if *name == "watchcache" { 1.0 } else { 2.0 };
        for (key, label) in [("C", "C"), ("C_big", "C, D's watchers")] {
            let c = wc.and_then(|v| v.get(key));
            let Some(c) = c.filter(|c| c.get("error").is_none()) else { continue };
            let list = c["watchcache_upstream_requests"]["list"].as_f64().unwrap_or(0.0);
            let watch = c["watchcache_upstream_requests"]["watch"].as_f64().unwrap_or(0.0);
            let started = c["etcd"]["watch_streams_started"].as_f64();
            let ranges = c["etcd"]["range_requests"].as_f64();
            let clean = c["missing"].as_u64() == Some(0) && c["duplicates"].as_u64() == Some(0);
            let e = num(etcd, &[key, "all_receiving_ms"]);
            let w = c["all_receiving_ms"].as_f64();
            let r = ratio(w, e);
            add(
                format!("{name}: restart with {} watchers ({label})", f(&c["watchers"])),
                format!(
                    "etcd saw {} Watch streams and {} Range requests (watchcache: list pages {}, watches {}); missing {}, duplicates {}; all receiving again {} after the kill against etcd's reconnection {}",
                    started.map(fx).unwrap_or_else(|| "–".into()),
                    ranges.map(fx).unwrap_or_else(|| "–".into()),
                    fx(list),
                    fx(watch),
                    f(&c["missing"]),
                    f(&c["duplicates"]),
                    ms_s(w),
                    ms_s(e)
                ),
                r,
                "one paginated list and one watch per prefix (per replica); every event exactly once",
                Some(started == Some(replicas) && watch == replicas && list >= replicas && clean),
            );
        }
        // 4. CPU per delivery.
        let w = num(*wc, &["A", "server_cpu_seconds_per_million_deliveries"]);
        let e = num(etcd, &["A", "server_cpu_seconds_per_million_deliveries"]);
        let p = num(proxy, &["A", "server_cpu_seconds_per_million_deliveries"]);
        let r = ratio(w, e);
        add(
            format!("{name}: CPU s per 1 M deliveries, etcd + target (A)"),
            format!(
                "{} against etcd directly's {}",
                w.map(fx).unwrap_or_else(|| "–".into()),
                e.map(fx).unwrap_or_else(|| "–".into())
            ),
            r,
            "≤ 0.2× etcd directly's",
            r.map(|r| r <= 0.2),
        );
        let r = ratio(w, p);
        add(
            format!("{name}: CPU s per 1 M deliveries, etcd + target (A)"),
            format!(
                "{} against the proxy's {}",
                w.map(fx).unwrap_or_else(|| "–".into()),
                p.map(fx).unwrap_or_else(|| "–".into())
            ),
            r,
            "≤ 0.3× the proxy's",
            r.map(|r| r <= 0.3),
        );
        let u = num(*wc, &["A", "target_us_per_delivery"]);
        let pu = num(proxy, &["A", "target_us_per_delivery"]);
        add(
            format!("{name} alone: µs per delivery (A)"),
            format!(
                "{} (the proxy alone: {})",
                u.map(fx).unwrap_or_else(|| "–".into()),
                pu.map(fx).unwrap_or_else(|| "–".into())
            ),
            ratio(u, pu),
            "≤ 0.4 µs",
            u.map(|u| u <= 0.4),
        );
        // p99, informative.
        let w = num(*wc, &["A", "latency_ms", "p99"]);
        let e = num(etcd, &["A", "latency_ms", "p99"]);
        let p = num(proxy, &["A", "latency_ms", "p99"]);
        add(
            format!("{name}: p99 put-to-receive (A)"),
            format!(
                "{} ms against etcd's {} ms and the proxy's {} ms",
                w.map(fx).unwrap_or_else(|| "–".into()),
                e.map(fx).unwrap_or_else(|| "–".into()),
                p.map(fx).unwrap_or_else(|| "–".into())
            ),
            ratio(w, e),
            "(no goal; ratio to etcd's)",
            None,
        );
        // 6. Scaling out.
        if *name != "watchcache" {
            let ew = num(*wc, &["A", "etcd_watchers_max"]);
            add(
                format!("{name}: etcd's watchers during A"),
                ew.map(fx).unwrap_or_else(|| "–".into()),
                None,
                "one per replica (2)",
                ew.map(|x| x == 2.0),
            );
        }
        let rss = num(*wc, &["D", "rss_growth_per_watcher_kib"]);
        let erss = num(etcd, &["D", "etcd_rss_growth_per_watcher_kib"]);
        add(
            format!("{name}: RSS growth per watcher (D)"),
            format!(
                "{} KiB (etcd's own per watcher: {} KiB)",
                rss.map(fx).unwrap_or_else(|| "–".into()),
                erss.map(fx).unwrap_or_else(|| "–".into())
            ),
            None,
            "≤ 2 KiB at 100 000 (make bench-scale)",
            None,
        );
    }
    let mut s = String::from("### Issue 12's targets (ratios from this run)\n\n");
    s.push_str("| target | figure | ratio | goal | met |\n|---|---|---|---|---|\n");
    for r in &rows {
        s.push_str(&format!(
            "| {} | {} | {} | {} | {} |\n",
            f(&r["target"]),
            f(&r["figure"]),
            rx(r["ratio"].as_f64()),
            f(&r["goal"]),
            met(r["met"].as_bool()),
        ));
    }
    (s, Value::Array(rows))
}

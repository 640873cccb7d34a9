//! The workload simulator (`cacher_core::simulate`): deterministic for a seed, sane on the
//! workloads whose outcome is known, errors that name the field, and the report's shape.

use cacher_core::simulate::{self, report_to_json, simulate, simulate_str, Report, Workload};
use serde_json::{json, Value};

fn sim(v: Value) -> Report {
    simulate(&v).unwrap_or_else(|e| panic!("{e}"))
}

fn err(v: Value) -> String {
    match simulate(&v) {
        Ok(_) => panic!("expected an error for {v}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn the_same_seed_gives_the_same_report() {
    let w = json!({
        "duration_s": 120, "seed": 7,
        "writes": {"rate_per_s": 50, "keys": 200, "delete_fraction": 0.1,
                   "bursts": [{"at_s": 30, "duration_s": 10, "rate_per_s": 400}]},
        "watchers": {"count": 30, "selector_fraction": 0.25, "consume_rate_per_s": 40},
        "disconnects": {"rate_per_watcher_per_h": 60, "reconnect_delay_s": {"dist": "exp", "mean": 3}},
        "etcd": {"compaction_interval_s": 20},
        "restarts": [{"at_s": 60, "outage_s": 4}]
    });
    let a = sim(w.clone());
    let b = sim(w.clone());
    assert_eq!(a, b);
    assert_eq!(report_to_json(&a), report_to_json(&b));
    let mut other = w;
    other["seed"] = json!(8);
    assert_ne!(sim(other).summary, a.summary, "another seed, another run");
}

#[test]
fn no_watchers_no_deliveries() {
    let r = sim(json!({"duration_s": 30, "writes": {"rate_per_s": 100}, "watchers": {"count": 0}}));
    let s = &r.summary;
    assert!(s.events_written > 2000, "{}", s.events_written);
    assert_eq!(s.events_cached, s.events_written);
    assert_eq!((s.deliveries, s.bookmarks_sent, s.watch_410, s.relists), (0, 0, 0, 0));
    assert_eq!(s.p50_delivery_lag_ms, None);
    assert_eq!(s.cache_lists, 1, "the cache's own list at time 0");
    assert!(r.series.iter().all(|x| x.connected_watchers == 0 && x.deliveries == 0));
}

#[test]
fn a_huge_fixed_window_without_disconnects_never_expires() {
    let r = sim(json!({
        "duration_s": 300,
        "config": {"capacity": 200000, "dynamic_capacity": false},
        "writes": {"rate_per_s": 100},
        "watchers": {"count": 50, "selector_fraction": 0.1, "bookmarks": false}
    }));
    let s = &r.summary;
    assert_eq!((s.watch_410, s.relists, s.watcher_terminations), (0, 0, 0));
    assert_eq!(s.watches_started, 50, "one watch each, never re-watched");
    // Only the cache's own list read etcd: 1000 objects in one page.
    assert_eq!((s.etcd_range_requests, s.etcd_range_objects), (1, 1000));
    assert_eq!(s.peak_ring_capacity, 200000);
    assert!(r.series.iter().all(|x| x.connected_watchers == 50 && x.ready));
}

#[test]
fn a_small_window_and_a_long_reconnect_delay_mean_410s_and_relists() {
    let r = sim(json!({
        "duration_s": 300,
        "config": {"capacity": 100, "dynamic_capacity": false},
        "writes": {"rate_per_s": 100, "keys": 1000},
        "watchers": {"count": 40},
        "disconnects": {"rate_per_watcher_per_h": 120, "reconnect_delay_s": 5},
        "etcd": {"objects_per_page": 500, "compaction_interval_s": 0}
    }));
    let s = &r.summary;
    assert!(s.disconnects > 50, "{}", s.disconnects);
    // A 1 s window and 5 s away: every resume is too old.
    assert!(
        s.watch_410 + 45 >= s.disconnects,
        "{} 410s for {} disconnects",
        s.watch_410,
        s.disconnects
    );
    assert_eq!(s.relists, s.watch_410, "each 410 is one relist");
    // Each relist reads 1000 objects in 2 pages; the cache's own list is 1 page.
    assert_eq!(s.etcd_range_requests, 2 * s.relists + 1);
    assert_eq!(s.etcd_range_objects, 1000 * (s.relists + 1));
    assert_eq!(s.etcd_list_410, 0, "nothing compacted");
    // Without delay nobody misses anything.
    let quick = sim(json!({
        "duration_s": 300,
        "config": {"capacity": 100000, "dynamic_capacity": false},
        "writes": {"rate_per_s": 100},
        "watchers": {"count": 40},
        "disconnects": {"rate_per_watcher_per_h": 120, "reconnect_delay_s": 5}
    }));
    assert_eq!(quick.summary.watch_410, 0);
    assert!(quick.summary.disconnects > 50);
    // The events written while a watcher was away reach it when it resumes, late.
    assert!(quick.summary.p99_delivery_lag_ms.unwrap() >= 1000.0);
}

#[test]
fn compacted_resume_revisions_cost_one_refused_list_each() {
    let r = sim(json!({
        "duration_s": 300,
        "config": {"capacity": 100, "dynamic_capacity": false},
        "writes": {"rate_per_s": 100},
        "watchers": {"count": 40},
        "disconnects": {"rate_per_watcher_per_h": 120, "reconnect_delay_s": 30},
        "etcd": {"compaction_interval_s": 5}
    }));
    let s = &r.summary;
    assert!(s.compactions > 50);
    // Away 30 s, compaction keeps 5–10 s: etcd refuses every relist at the resume RV.
    assert!(
        s.relists > 0 && s.etcd_list_410 == s.relists,
        "{} refused of {}",
        s.etcd_list_410,
        s.relists
    );
    assert_eq!(s.etcd_range_requests, 3 * s.relists + 1);
}

#[test]
fn client_go_relists_after_a_410_are_served_by_the_cache_not_etcd() {
    let w = |relist_from: &str| {
        sim(json!({
            "duration_s": 300,
            "config": {"capacity": 100, "dynamic_capacity": false},
            "writes": {"rate_per_s": 100, "keys": 1000},
            "watchers": {"count": 40, "relist_from": relist_from},
            "disconnects": {"rate_per_watcher_per_h": 120, "reconnect_delay_s": 30},
            "etcd": {"objects_per_page": 500, "compaction_interval_s": 5}
        }))
        .summary
    };
    let (etcd, cache) = (w("etcd"), w("cache"));
    assert!(etcd.relists > 20 && cache.relists > 20, "{} {}", etcd.relists, cache.relists);
    assert_eq!(cache.relists, cache.watch_410, "each 410 is still one relist");
    // From etcd: 2 pages per relist, plus a refused list at every compacted RV.
    assert_eq!(etcd.etcd_range_requests, 2 * etcd.relists + etcd.etcd_list_410 + 1);
    assert!(etcd.etcd_list_410 > 0);
    // Through the cache (a list at the last RV without a limit): only the cache's own list.
    assert_eq!((cache.etcd_range_requests, cache.etcd_list_410), (1, 0));
    assert_eq!(cache.cache_lists, 1);
}

#[test]
fn client_go_backoff_brings_watchers_back_later_than_the_outage() {
    // One disconnect each (rate 1/h over 60 s is rare): use a high rate and a window that
    // holds everything, so every return is a plain re-watch; compare when they come back.
    let w = |backoff: &str| {
        sim(json!({
            "duration_s": 600, "seed": 3,
            "config": {"capacity": 1000000, "dynamic_capacity": false},
            "writes": {"rate_per_s": 10},
            "watchers": {"count": 200, "backoff": backoff},
            "disconnects": {"rate_per_watcher_per_h": 60, "reconnect_delay_s": 30}
        }))
    };
    let (none, go) = (w("none"), w("client-go"));
    for r in [&none, &go] {
        assert_eq!(r.summary.watch_410, 0);
        assert!(r.summary.disconnects > 100, "{}", r.summary.disconnects);
    }
    // Mean time away, from the watchers connected: (count − connected) integrated over time.
    let away = |r: &Report| {
        let s: f64 = r.series.iter().map(|x| f64::from(200 - x.connected_watchers)).sum();
        s / r.summary.disconnects as f64
    };
    let (a_none, a_go) = (away(&none), away(&go));
    // Exactly 30 s without backoff; client-go's first try at or after 30 s comes 5–15 s later
    // (tries at 0, 0.8–1.6, then doubling waits with jitter).
    assert!((a_none - 30.0).abs() < 2.0, "{a_none}");
    assert!(a_go > a_none + 4.0 && a_go < a_none + 16.0, "{a_none} {a_go}");
}

#[test]
fn client_go_relists_wait_one_backoff_step_after_the_410() {
    let w = |backoff: &str| {
        sim(json!({
            "duration_s": 300,
            "config": {"capacity": 100, "dynamic_capacity": false},
            "writes": {"rate_per_s": 100},
            "watchers": {"count": 40, "backoff": backoff, "relist_from": "cache"},
            "disconnects": {"rate_per_watcher_per_h": 120, "reconnect_delay_s": 5}
        }))
        .summary
    };
    let (none, go) = (w("none"), w("client-go"));
    assert!(go.watch_410 > 20, "{}", go.watch_410);
    // Every 410 is relisted one wait later (the waits have grown with the retries of the
    // disconnects before: up to 30 s ×[1, 2)), so at the end some watchers still wait, at
    // most one relist each.
    assert!(
        go.relists < go.watch_410 && go.relists + go.relists_pending <= go.watch_410,
        "{} relists and {} pending for {} 410s",
        go.relists,
        go.relists_pending,
        go.watch_410
    );
    assert!(go.relists_pending <= 40, "at most one per watcher");
    assert_eq!((none.relists, none.relists_pending), (none.watch_410, 0));
}

#[test]
fn bookmarks_keep_selective_watchers_resumable() {
    let w = |bookmarks: bool| {
        json!({
            "duration_s": 600, "seed": 3,
            "config": {"capacity": 600, "dynamic_capacity": false, "bookmark_frequency_ms": 5000},
            "writes": {"rate_per_s": 20, "keys": 1000},
            "watchers": {"count": 50, "bookmarks": bookmarks, "selector_fraction": 0.001},
            "disconnects": {"rate_per_watcher_per_h": 30, "reconnect_delay_s": 1}
        })
    };
    let on = sim(w(true)).summary;
    let off = sim(w(false)).summary;
    assert_eq!(off.bookmarks_sent, 0);
    assert!(on.bookmarks_sent > 0);
    assert_eq!(on.selector_fraction, 0.001);
    assert!(off.disconnects > 50 && on.disconnects > 50);
    // Without bookmarks a watcher resumes from its last matching event, minutes old, far
    // outside a 30 s window; with bookmarks every 5 s it resumes inside it.
    assert!(
        on.watch_410 * 4 < off.watch_410,
        "bookmarks on: {} 410s, off: {}",
        on.watch_410,
        off.watch_410
    );
    assert!(on.etcd_range_objects < off.etcd_range_objects);
}

#[test]
fn a_restart_closes_the_gate_and_every_watcher_relists() {
    for profile in ["v1.30", "v1.34"] {
        let r = sim(json!({
            "duration_s": 30,
            "config": {"profile": profile},
            "writes": {"rate_per_s": 20},
            "watchers": {"count": 25},
            "restarts": [{"at_s": 10, "outage_s": 5}]
        }));
        let s = &r.summary;
        assert_eq!(s.restarts, 1);
        assert_eq!(s.cache_lists, 2, "{profile}: at time 0 and after the outage");
        assert_eq!(s.relists, 25, "{profile}: one relist per watcher");
        assert_eq!(s.watch_410, 25, "{profile}");
        assert!(
            s.events_cached < s.events_written,
            "{profile}: writes during the outage are lost to the cache"
        );
        for x in &r.series {
            let down = (11..=15).contains(&x.t_s);
            assert_eq!(x.ready, !down, "{profile} at {}s", x.t_s);
            if down {
                assert_eq!(x.connected_watchers, 0, "{profile} at {}s", x.t_s);
                assert!(x.cache_rv < x.etcd_rv);
            }
        }
        assert_eq!(r.series.last().unwrap().connected_watchers, 25, "{profile}");
        assert_eq!(r.series[15].relists, 25, "{profile}: all at the end of the outage");
        if profile == "v1.34" {
            assert!(s.watches_rejected >= 25, "429 while initialising: {}", s.watches_rejected);
        } else {
            assert_eq!(s.watches_rejected, 0, "v1.30 waits for the gate");
        }
    }
}

#[test]
fn selectors_really_filter() {
    let r = sim(json!({
        "duration_s": 200, "seed": 11,
        "writes": {"rate_per_s": 100, "keys": 1000},
        "watchers": {"count": 40, "selector_fraction": 0.25, "bookmarks": false}
    }));
    let s = &r.summary;
    assert_eq!(s.selector_fraction, 0.25);
    let expected = s.events_written as f64 * 40.0 * 0.25;
    let got = s.deliveries as f64;
    assert!(
        (got - expected).abs() < expected * 0.05,
        "{got} deliveries, expected about {expected}"
    );
    let all = sim(json!({
        "duration_s": 200, "seed": 11,
        "writes": {"rate_per_s": 100, "keys": 1000},
        "watchers": {"count": 40, "bookmarks": false}
    }));
    assert_eq!(all.summary.deliveries, all.summary.events_written * 40);
    assert_eq!(all.summary.p99_delivery_lag_ms, Some(0.0), "keeping up: no lag");
}

#[test]
fn slow_consumers_lag_and_get_terminated() {
    let slow = sim(json!({
        "duration_s": 120,
        "writes": {"rate_per_s": 200},
        "watchers": {"count": 10, "consume_rate_per_s": 50}
    }));
    let s = &slow.summary;
    assert!(s.watcher_terminations > 10, "{}", s.watcher_terminations);
    assert!(s.p50_delivery_lag_ms.unwrap() > 0.0);
    let fast = sim(json!({
        "duration_s": 120,
        "writes": {"rate_per_s": 200},
        "watchers": {"count": 10, "consume_rate_per_s": 10000, "consume_tick_ms": 50}
    }));
    let f = &fast.summary;
    assert_eq!(f.watcher_terminations, 0);
    assert_eq!(f.deliveries, f.events_written * 10);
    assert!(f.p99_delivery_lag_ms.unwrap() <= 50.0, "{:?}", f.p99_delivery_lag_ms);
    // The lag policy keeps slow watchers open until they fall out of the window.
    let lag = sim(json!({
        "duration_s": 120,
        "config": {"capacity": 1000, "dynamic_capacity": false},
        "writes": {"rate_per_s": 200},
        "watchers": {"count": 10, "consume_rate_per_s": 50, "slow_policy": "lag"}
    }));
    assert_eq!(lag.summary.watcher_terminations, 0);
    assert!(lag.summary.watch_410 > 0);
}

#[test]
fn bursts_change_the_write_rate() {
    let r = sim(json!({
        "duration_s": 30,
        "writes": {"rate_per_s": 10, "bursts": [{"at_s": 10, "duration_s": 5, "rate_per_s": 1000}]},
        "watchers": {"count": 1}
    }));
    let burst: u64 = r.series[10..15].iter().map(|x| x.writes).sum();
    let calm: u64 = r.series[20..25].iter().map(|x| x.writes).sum();
    assert!((4500..5500).contains(&burst), "{burst}");
    assert!(calm < 150, "{calm}");
    // The ring grows with the burst (dynamic capacity).
    assert!(r.summary.peak_ring_capacity > 100);
    assert!(r.summary.capacity_increases > 0);
}

#[test]
fn watch_timeouts_rewatch_from_the_last_rv() {
    let r = sim(json!({
        "duration_s": 120,
        "writes": {"rate_per_s": 50},
        "watchers": {"count": 10, "timeout_s": 10}
    }));
    let s = &r.summary;
    assert!(s.watches_started > 60, "{}", s.watches_started);
    assert_eq!((s.watch_410, s.relists), (0, 0));
    assert_eq!(s.deliveries, s.events_written * 10, "nothing lost across re-watches");
}

#[test]
fn errors_name_the_field() {
    let cases = [
        (json!({"writes": {"rate_per_s": -1}}), "writes.rate_per_s: must be a non-negative number, got -1"),
        (json!({"writes": {"rate_per_s": "fast"}}), "writes.rate_per_s: must be a non-negative number, got a string"),
        (json!({"duration_s": -5}), "duration_s: must be a non-negative number, got -5"),
        (json!({"watchers": {"count": 1.5}}), "watchers.count: expected a non-negative integer, got 1.5"),
        (json!({"watchers": {"count": 200000}}), "watchers.count: must be at most 100000, got 200000"),
        (json!({"watchers": {"selector_fraction": 2}}), "watchers.selector_fraction: must be between 0 and 1, got 2"),
        (json!({"watchers": {"slow_policy": "drop"}}), "watchers.slow_policy: expected \"terminate\" or \"lag\", got \"drop\""),
        (json!({"watchers": {"backoff": "exp"}}), "watchers.backoff: expected \"none\" or \"client-go\", got \"exp\""),
        (json!({"watchers": {"relist_from": "disk"}}), "watchers.relist_from: expected \"etcd\" or \"cache\", got \"disk\""),
        (json!({"writes": {"keys": 0}}), "writes.keys: must be between 1 and 10000000, got 0"),
        (
            json!({"writes": {"bursts": [{"at_s": 1, "duration_s": 2, "rate_per_s": -3}]}}),
            "writes.bursts[0].rate_per_s: must be a non-negative number, got -3",
        ),
        (json!({"writes": {"bursts": [{"at_s": 1, "rate_per_s": 3}]}}), "writes.bursts[0].duration_s: required field is missing"),
        (
            json!({"disconnects": {"reconnect_delay_s": {"dist": "normal"}}}),
            "disconnects.reconnect_delay_s.dist: expected \"const\", \"exp\" or \"uniform\", got \"normal\"",
        ),
        (json!({"disconnects": {"reconnect_delay_s": {"dist": "exp"}}}), "disconnects.reconnect_delay_s.mean: required for dist \"exp\""),
        (
            json!({"disconnects": {"reconnect_delay_s": {"dist": "uniform", "min": 5, "max": 1}}}),
            "disconnects.reconnect_delay_s.max: must be at least min (5), got 1",
        ),
        (json!({"etcd": {"objects_per_page": 0}}), "etcd.objects_per_page: must be at least 1"),
        (json!({"config": {"capacity": 0}}), "config.capacity: must be at least 1"),
        (json!({"config": {"profile": "v2"}}), "config.profile: unknown profile \"v2\"; expected \"v1.30\", \"v1.34\" or \"v1.37\""),
        (json!({"restarts": [{"outage_s": 1}]}), "restarts[0].at_s: required field is missing"),
        (json!({"restarts": {"at_s": 1}}), "restarts: expected an array, got an object"),
        (json!({"watchers": {"cont": 5}}), "watchers.cont: unknown field"),
        (json!([1, 2]), "expected an object, got an array"),
    ];
    for (w, want) in cases {
        let got = err(w.clone());
        assert!(got.starts_with(want), "{w}:\n  got  {got}\n  want {want}");
    }
    assert!(simulate_str("{").unwrap_err().to_string().starts_with("invalid JSON"));
    // The typed API checks the same values, with the same names.
    let mut w = Workload::default();
    w.watchers.consume_rate_per_s = Some(f64::NAN);
    assert_eq!(
        simulate::run(&w).unwrap_err().to_string(),
        "watchers.consume_rate_per_s: must be a non-negative number, got NaN"
    );
}

#[test]
fn the_report_has_its_documented_shape() {
    let r = sim(json!({"duration_s": 5, "watchers": {"count": 3}}));
    let v: Value = serde_json::from_str(&report_to_json(&r)).expect("the report is JSON");
    let summary = v["summary"].as_object().expect("summary");
    for k in [
        "events_written",
        "deliveries",
        "watch_410",
        "relists",
        "etcd_range_requests",
        "etcd_range_objects",
        "watcher_terminations",
        "bookmarks_sent",
        "p50_delivery_lag_ms",
        "p99_delivery_lag_ms",
        "peak_ring_capacity",
        "cache_lists",
        "etcd_list_410",
        "selector_fraction",
    ] {
        assert!(summary.contains_key(k), "summary.{k} missing");
    }
    let series = v["series"].as_array().expect("series");
    assert_eq!(series.len(), 5);
    for (i, s) in series.iter().enumerate() {
        assert_eq!(s["t_s"], json!(i + 1));
        for k in [
            "etcd_rv",
            "cache_rv",
            "ready",
            "window_rv",
            "window_s",
            "window_events",
            "capacity",
            "writes",
            "deliveries",
            "watch_410",
            "relists",
            "etcd_range_requests",
            "etcd_range_objects",
            "connected_watchers",
        ] {
            assert!(s.get(k).is_some(), "series[{i}].{k} missing");
        }
    }
    // The window: with the default 100-event ring at 10 writes/s it spans about 10 s once full.
    let long = sim(
        json!({"duration_s": 60, "config": {"dynamic_capacity": false}, "watchers": {"count": 1}}),
    );
    let last = long.series.last().unwrap();
    assert_eq!(last.window_events, 100);
    assert_eq!(last.window_rv, 100);
    assert!((5.0..20.0).contains(&last.window_s), "{}", last.window_s);
    // Without the series.
    let bare = sim(json!({"duration_s": 5, "series": false}));
    assert!(bare.series.is_empty());
    assert!(report_to_json(&bare).contains("\"series\": []"));
}

#[test]
fn the_example_workloads_run() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios/simulate");
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).expect("scenarios/simulate") {
        let path = entry.expect("entry").path();
        if path.extension().and_then(|e| e.to_str()) != Some("json") {
            continue;
        }
        let mut w: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        // Checked in full by the CLI; a debug-build test runs a shorter stretch of each.
        let full = w["duration_s"].as_f64().unwrap_or(60.0);
        w["duration_s"] = json!(full.min(120.0));
        let r = simulate(&w).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert!(r.summary.events_written > 0, "{}", path.display());
        n += 1;
    }
    assert!(n >= 2, "{n} example workloads");
}

mod random_workloads {
    use cacher_core::simulate::{run, Burst, Delay, Restart, Workload};
    use cacher_core::{Config, Profile, SlowPolicy};
    use proptest::prelude::*;

    prop_compose! {
        fn workload()(
            duration in 0u32..40,
            seed in any::<u64>(),
            v134 in any::<bool>(),
            small in any::<bool>(),
            dynamic in any::<bool>(),
            rate in 0u32..300,
            keys in 1u64..300,
            delete_pct in 0u32..50,
            burst in proptest::option::of((0u32..30, 0u32..10, 0u32..2000)),
            count in 0u32..25,
            bookmarks in any::<bool>(),
            fraction in prop_oneof![Just(1.0), Just(0.0), Just(0.5), Just(0.01), 0.0f64..1.0],
            consume in proptest::option::of(0.0f64..400.0),
            lag in any::<bool>(),
            timeout in proptest::option::of(1u32..20),
            disconnects in 0u32..2000,
            delay in 0u32..3,
            compaction in proptest::option::of(1u32..30),
            restarts in proptest::collection::vec((0u32..40, 0u32..10), 0..3),
        ) -> Workload {
            let mut config = Config::for_profile(if v134 { Profile::V1_34 } else { Profile::V1_30 });
            if small {
                config.capacity = 10;
                config.lower_bound_capacity = 10;
            }
            config.dynamic_capacity = dynamic;
            config.bookmark_frequency_ms = 3000;
            let mut w = Workload { duration_s: f64::from(duration), seed, config, ..Workload::default() };
            w.writes.rate_per_s = f64::from(rate);
            w.writes.keys = keys;
            w.writes.delete_fraction = f64::from(delete_pct) / 100.0;
            w.writes.bursts = burst
                .map(|(at, d, r)| Burst { at_s: f64::from(at), duration_s: f64::from(d), rate_per_s: f64::from(r) })
                .into_iter()
                .collect();
            w.watchers.count = count;
            w.watchers.bookmarks = bookmarks;
            w.watchers.selector_fraction = fraction;
            w.watchers.consume_rate_per_s = consume;
            w.watchers.slow_policy = if lag { SlowPolicy::Lag } else { SlowPolicy::Terminate };
            w.watchers.timeout_s = timeout.map(f64::from);
            w.disconnects.rate_per_watcher_per_h = f64::from(disconnects);
            w.disconnects.reconnect_delay_s = match delay {
                0 => Delay::Const(2.0),
                1 => Delay::Exp { mean: 3.0 },
                _ => Delay::Uniform { min: 0.0, max: 8.0 },
            };
            w.etcd.compaction_interval_s = compaction.map(f64::from);
            w.restarts = restarts
                .into_iter()
                .map(|(at, out)| Restart { at_s: f64::from(at), outage_s: f64::from(out) })
                .collect();
            w
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn any_workload_runs_and_adds_up(w in workload()) {
            let r = run(&w).expect("a valid workload");
            let s = &r.summary;
            prop_assert_eq!(r.series.len() as f64, w.duration_s.floor());
            prop_assert!(s.events_cached <= s.events_written);
            prop_assert_eq!(s.relists, s.watch_410, "every 410 is one relist");
            prop_assert!(s.etcd_range_requests >= s.relists + s.cache_lists);
            prop_assert!(s.etcd_list_410 <= s.relists);
            if w.watchers.count == 0 {
                prop_assert_eq!(s.deliveries + s.bookmarks_sent + s.watches_started, 0);
            }
            if !w.watchers.bookmarks {
                prop_assert_eq!(s.bookmarks_sent, 0);
            }
            if w.restarts.is_empty() {
                prop_assert_eq!(s.cache_lists, 1);
                prop_assert_eq!(s.events_cached, s.events_written);
            }
            for x in &r.series {
                prop_assert!(x.connected_watchers <= w.watchers.count);
                prop_assert!(x.cache_rv <= x.etcd_rv);
                prop_assert!(x.window_events <= x.capacity);
            }
            prop_assert_eq!(run(&w).expect("again"), r, "deterministic");
        }
    }
}

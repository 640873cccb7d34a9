//! The simulator's prediction against the real server, in short (docs/slo.md has the long
//! runs, `make validate-slo`): the load generator of `examples/slo_validate.rs` plays a small
//! window with reconnects past it (and a restart of the cache), and the same window with
//! reconnects inside it, against a real etcd and the real `watchcache` binary.

#[allow(dead_code)]
#[path = "../examples/slo_validate.rs"]
mod slo_validate;

use std::path::Path;

use cacher_core::simulate::workload_from_json;
use serde_json::{json, Value};

fn workload(delay_s: f64, duration_s: f64, restart: bool) -> cacher_core::simulate::Workload {
    let restarts = if restart { json!([{"at_s": 28, "outage_s": 2}]) } else { json!([]) };
    workload_from_json(&json!({
        "duration_s": duration_s, "seed": 7,
        // 300 events at 50 writes/s: W = 6 s.
        "config": {"profile": "v1.30", "capacity": 300, "dynamic_capacity": false},
        "writes": {"rate_per_s": 50, "keys": 200},
        "watchers": {"count": 10, "bookmarks": true},
        "disconnects": {"rate_per_watcher_per_h": 360, "reconnect_delay_s": delay_s},
        "restarts": restarts,
    }))
    .expect("a valid workload")
}

fn n(v: &Value, k: &str) -> u64 {
    v[k].as_u64().unwrap_or_else(|| panic!("{k} in {v}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_simulator_predicts_the_real_servers_410s_and_relists() {
    let bin = Path::new(env!("CARGO_BIN_EXE_watchcache"));
    let storm = workload(9.0, 36.0, true);
    let calm = workload(1.0, 30.0, false);
    let (real_storm, real_calm) =
        tokio::join!(slo_validate::play(&storm, bin), slo_validate::play(&calm, bin));
    let real_storm = real_storm.expect("the storm workload runs");
    let real_calm = real_calm.expect("the calm workload runs");
    let sim_storm = slo_validate::predict(&storm).expect("simulates");
    let sim_calm = slo_validate::predict(&calm).expect("simulates");
    eprintln!("storm: simulated {sim_storm}\n       real {real_storm}");
    eprintln!("calm: simulated {sim_calm}\n      real {real_calm}");

    // d = 9 s > W = 6 s: every reconnect is a 410 and a relist, in both; the restart adds one
    // per watcher (at most: a watcher away at that moment gets one 410 for both).
    for (what, v) in [("simulated", &sim_storm), ("real", &real_storm)] {
        let (e, r, d) = (n(v, "watch_410"), n(v, "relists"), n(v, "disconnects"));
        assert_eq!(e, r, "{what}: one relist per 410");
        assert!(d >= 5, "{what}: the workload disconnects ({d})");
        assert!(r + 3 >= d && r <= d + 10, "{what}: {r} relists for {d} disconnects and a restart");
        assert!(r >= 10, "{what}: the restart sends every watcher to relist ({r})");
    }
    // d = 1 s < W: no 410 at all, in both.
    for (what, v) in [("simulated", &sim_calm), ("real", &real_calm)] {
        assert!(n(v, "disconnects") >= 5, "{what}: the workload disconnects");
        assert_eq!((n(v, "watch_410"), n(v, "relists")), (0, 0), "{what}: {v}");
    }
    assert_eq!(n(&real_storm, "restarts"), 1);
    for v in [&real_storm, &real_calm] {
        assert_eq!(n(v, "stale_events"), 0, "no event at or below a watch's resourceVersion: {v}");
    }
    assert!(n(&real_calm, "deliveries") > 1000, "the watchers received the writes: {real_calm}");
}

#[test]
fn workloads_the_real_server_cannot_play_are_refused_by_field() {
    let mut w = workload(1.0, 10.0, false);
    w.watchers.consume_rate_per_s = Some(5.0);
    let e = slo_validate::check_playable(&w).expect_err("refused");
    assert!(e.starts_with("watchers.consume_rate_per_s"), "{e}");
    let mut w = workload(1.0, 10.0, false);
    w.watchers.selector_fraction = 0.3;
    let e = slo_validate::check_playable(&w).expect_err("refused");
    assert!(e.starts_with("watchers.selector_fraction"), "{e}");
}

"""watchcache.simulate: workloads in, reports out (dicts), as the Rust core runs them."""

import json
import os
import pathlib
import subprocess

import pytest

import watchcache

ROOT = pathlib.Path(__file__).resolve().parents[2]
WORKLOADS = sorted((ROOT / "scenarios" / "simulate").glob("*.json"))

SMALL = {
    "duration_s": 60,
    "seed": 4,
    "config": {"capacity": 100, "dynamic_capacity": False},
    "writes": {"rate_per_s": 50, "keys": 500},
    "watchers": {"count": 20, "selector_fraction": 0.25},
    "disconnects": {"rate_per_watcher_per_h": 120, "reconnect_delay_s": {"dist": "const", "value": 5}},
}


def test_report_shape():
    r = watchcache.simulate(SMALL)
    assert list(r) == ["summary", "series"]
    s = r["summary"]
    for k in ("events_written", "deliveries", "watch_410", "relists", "etcd_range_requests",
              "etcd_range_objects", "watcher_terminations", "bookmarks_sent", "p50_delivery_lag_ms",
              "p99_delivery_lag_ms", "peak_ring_capacity"):
        assert k in s, k
    assert isinstance(s["events_written"], int) and isinstance(s["p99_delivery_lag_ms"], float)
    assert len(r["series"]) == 60
    assert [x["t_s"] for x in r["series"]] == list(range(1, 61))
    assert set(r["series"][0]) >= {"window_rv", "window_s", "capacity", "watch_410", "relists",
                                   "etcd_range_requests", "connected_watchers"}
    # pandas-friendly: every series record has the same keys.
    assert len({tuple(x) for x in r["series"]}) == 1


def test_dict_and_json_text_give_the_same_report_and_the_same_seed_repeats():
    a = watchcache.simulate(SMALL)
    assert watchcache.simulate(json.dumps(SMALL)) == a
    assert watchcache.simulate(SMALL) == a
    assert watchcache.simulate({**SMALL, "seed": 5})["summary"] != a["summary"]


def test_small_window_and_long_reconnect_delay_give_410s_and_relists():
    s = watchcache.simulate(SMALL)["summary"]
    assert s["disconnects"] > 0
    assert s["watch_410"] > 0
    assert s["relists"] == s["watch_410"]
    assert s["etcd_range_objects"] == 500 * (s["relists"] + 1)


def test_no_watchers_no_deliveries():
    s = watchcache.simulate({"duration_s": 10, "watchers": {"count": 0}})["summary"]
    assert s["deliveries"] == 0 and s["bookmarks_sent"] == 0
    assert s["p50_delivery_lag_ms"] is None


def test_restart_closes_the_gate():
    r = watchcache.simulate({"duration_s": 20, "watchers": {"count": 5},
                             "restarts": [{"at_s": 5, "outage_s": 3}]})
    assert [x["t_s"] for x in r["series"] if not x["ready"]] == [6, 7, 8]
    assert r["summary"]["relists"] == 5


@pytest.mark.parametrize("workload, message", [
    ({"writes": {"rate_per_s": -1}}, "writes.rate_per_s: must be a non-negative number, got -1"),
    ({"watchers": {"count": "many"}}, "watchers.count: expected a non-negative integer"),
    ({"watchers": {"bookmark": True}}, "watchers.bookmark: unknown field"),
    ({"disconnects": {"reconnect_delay_s": {"dist": "pareto"}}}, "disconnects.reconnect_delay_s.dist"),
    ({"config": {"capacity": 0}}, "config.capacity: must be at least 1"),
    ({"restarts": [{"at_s": -3}]}, "restarts[0].at_s: must be a non-negative number, got -3"),
    ("{not json", "invalid JSON"),
])
def test_bad_workloads_raise_scenario_error_naming_the_field(workload, message):
    with pytest.raises(watchcache.ScenarioError) as e:
        watchcache.simulate(workload)
    assert str(e.value).startswith(message), str(e.value)
    assert isinstance(e.value, ValueError) and isinstance(e.value, watchcache.WatchCacheError)
    assert e.value.code == 400


def test_wrong_types_are_type_errors():
    with pytest.raises(TypeError, match="workload"):
        watchcache.simulate(42)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        watchcache.simulate({"writes": {1: 2}})


def test_example_workloads_match_the_cli():
    assert len(WORKLOADS) >= 2
    for f in WORKLOADS:
        w = json.loads(f.read_text())
        w["duration_s"] = min(w.get("duration_s", 60), 30)
        r = watchcache.simulate(w)
        assert r["summary"]["events_written"] > 0, f.name
    # make test-python builds the CLI and names it; run alone, build it first.
    cli = pathlib.Path(os.environ.get("WATCHCACHE_CLI", ROOT / "target" / "release" / "watchcache"))
    assert cli.exists(), f"{cli} not built: cargo build --release -p host-etcd --bin watchcache (make test-python does)"
    f = WORKLOADS[0]
    w = json.loads(f.read_text())
    w["duration_s"] = 20
    tmp = json.dumps(w)
    out = subprocess.run([str(cli), "simulate", "/dev/stdin"], input=tmp, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == watchcache.simulate(tmp)

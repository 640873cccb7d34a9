"""Replaying a 100 000-event scenario from Python vs the same replay in Rust.

Usage: python replay_bench.py PATH_TO_RUST_replay_bench_BINARY
Prints one JSON line per measurement; BENCHMARKS.md quotes them.
"""

import json
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

import watchcache


def scenario(events: int = 100_000, watchers: int = 1) -> dict:
    steps = [{"at": 0, "op": "replace", "rv": 1,
              "objects": [{"key": f"/pods/ns/p{i:04d}", "value": "x" * 64} for i in range(1000)]}]
    for w in range(watchers):
        steps.append({"at": 0, "op": "watch", "id": f"w{w}", "key": "/pods/", "rv": "1"})
    for i in range(events):
        rv = 2 + i
        steps.append({"at": i // 10, "op": "put", "rv": rv,
                      "object": {"key": f"/pods/ns/p{i % 1000:04d}", "value": f"v{rv}",
                                 "labels": {"app": "web"}}})
    return {"name": "bench", "config": {"dispatch_tick_jitter": 0}, "steps": steps}


def best_and_median(f, runs=7):
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        out = f()
        times.append((time.perf_counter() - t) * 1000)
        del out
    times.sort()
    return times[0], statistics.median(times)


def main() -> None:
    rust_bin = sys.argv[1]
    sc = scenario()
    text = json.dumps(sc)
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        f.write(text)
        path = f.name
    rust = json.loads(subprocess.check_output([rust_bin, path, "7"], text=True))
    py_best, py_median = best_and_median(lambda: watchcache.replay(text))
    dict_best, dict_median = best_and_median(lambda: watchcache.replay(sc))
    records = len(watchcache.replay(text))
    assert records == rust["records"], (records, rust["records"])
    res = {
        "events": 100_000, "records": records,
        "rust_best_ms": rust["best_ms"], "rust_median_ms": rust["median_ms"],
        "python_json_text_best_ms": round(py_best, 2), "python_json_text_median_ms": round(py_median, 2),
        "python_dict_best_ms": round(dict_best, 2), "python_dict_median_ms": round(dict_median, 2),
        "ratio_json_text_median": round(py_median / rust["median_ms"], 2),
        "ratio_dict_median": round(dict_median / rust["median_ms"], 2),
    }
    print(json.dumps(res))
    pathlib.Path(path).unlink()


if __name__ == "__main__":
    main()

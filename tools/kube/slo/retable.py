#!/usr/bin/env python3
"""docs/slo.md's table again from kube-harness slo's real runs (artifacts/slo-k8s.json) and a
fresh simulate() of the same workloads and seeds: for a change of the model without running the
clusters again (20 minutes). Same rows, columns and formats as kube-harness slo prints.

Usage: tools/kube/slo/retable.py [artifacts/slo-k8s.json] [target/release/watchcache]
"""
import glob, json, math, os, statistics, subprocess, sys, tempfile

real_path = sys.argv[1] if len(sys.argv) > 1 else "artifacts/slo-k8s.json"
wc = sys.argv[2] if len(sys.argv) > 2 else "target/release/watchcache"
SIM_SEEDS = 20


def simulate(w, seed, watchers_override=None):
    m = {k: v for k, v in w.items() if k != "k8s"}
    m["seed"], m["series"] = seed, False
    if watchers_override:
        m["watchers"] = {**m.get("watchers", {}), **watchers_override}
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(m, f)
    try:
        out = subprocess.run([wc, "simulate", f.name], capture_output=True, text=True, check=True).stdout
    finally:
        os.unlink(f.name)
    s = json.loads(out)["summary"]
    s["watchers"] = w["watchers"]["count"]
    return s


def mean_sd(xs):
    xs = [x for x in xs if not math.isnan(x)]
    if not xs:
        return math.nan, 0.0
    return statistics.mean(xs), (statistics.stdev(xs) if len(xs) > 1 else 0.0)


def fmt(m, sd):
    if math.isnan(m):
        return "—"
    return f"{m:.2f} ± {sd:.2f}" if m != 0 and abs(m) < 1 else f"{m:.1f} ± {sd:.1f}"


def pct(real, sim):
    if math.isnan(real) or math.isnan(sim):
        return "—"
    if sim == 0:
        return "0 %" if real == 0 else "n/a (sim 0)"
    return f"{100 * (real - sim) / sim:+.0f} %"


def div(a, b):
    return a / b if b else 0.0


def reconnects(s):
    return s["watches_started"] - s["watchers"] - s["relists"]


def lists_to_etcd(r):
    if r["Backend"] == "etcd":
        return r["APIListsToStorage"]
    u = r.get("WCUpstream") or {}
    return u.get('watchcache_upstream_requests_total{kind="list"}', 0) + u.get('watchcache_upstream_requests_total{kind="range"}', 0)


ROWS = [
    ("410s", lambda s: s["watch_410"], lambda r: r["C"]["Watch410"]),
    ("relists", lambda s: s["relists"] + s.get("relists_pending", 0), lambda r: r["C"]["Relists"]),
    ("  of which after a 410", lambda s: s["relists"] + s.get("relists_pending", 0), lambda r: r["C"]["RelistsAfter410"]),
    ("lists reaching etcd", lambda s: s["etcd_range_requests"] - 1, lists_to_etcd),
    ("events", lambda s: s["deliveries"], lambda r: r["C"]["Events"]),
    ("disconnects", lambda s: s["disconnects"], lambda r: r["C"]["Disconnects"]),
    ("reconnects", reconnects, lambda r: r["C"]["Reconnects"]),
    ("410s per reconnect", lambda s: div(s["watch_410"], reconnects(s)), lambda r: div(r["C"]["Watch410"], r["C"]["Reconnects"])),
    ("mean reconnect delay (s)", lambda s: math.nan, lambda r: div(r["C"]["ReconnectDelaySum"], r["C"]["Reconnects"])),
]

real = {r["Name"]: r for r in json.load(open(real_path))}
print("| workload | count | simulate (same seeds) | simulate, more seeds | simulate, old model (no backoff, relists charged to etcd) | kube-apiserver on etcd | Δ | kube-apiserver on watchcache | Δ |")
print("|---|---|---|---|---|---|---|---|---|")
for path in sorted(glob.glob(os.path.join(os.path.dirname(__file__), "k8s_*.json"))):
    w = json.load(open(path))
    r = real.get(w["name"])
    if r is None:
        continue
    runs = sorted({x["Seed"] for x in r["Real"]})
    same = [simulate(w, s) for s in runs]
    more = [simulate(w, w["seed"] + 101 + i) for i in range(SIM_SEEDS)]
    old = [simulate(w, s, {"backoff": "none", "relist_from": "etcd"}) for s in runs]
    et = [x for x in r["Real"] if x["Backend"] == "etcd"]
    wcr = [x for x in r["Real"] if x["Backend"] == "watchcache"]
    for i, (name, sim, rl) in enumerate(ROWS):
        sm, ssd = mean_sd([sim(s) for s in same])
        mm, msd = mean_sd([sim(s) for s in more])
        om, osd = mean_sd([sim(s) for s in old])
        ev = [rl(x) for x in et]
        wv = [rl(x) for x in wcr]
        em, esd = mean_sd(ev)
        wm, wsd = mean_sd(wv)
        label = f"`{w['name']}`" if i == 0 else ""
        print(f"| {label} | {name} | {fmt(sm, ssd)} | {fmt(mm, msd)} | {fmt(om, osd)} | {fmt(em, esd)} ({', '.join(f'{x:.0f}' for x in ev)}) | {pct(em, sm)} | {fmt(wm, wsd)} ({', '.join(f'{x:.0f}' for x in wv)}) | {pct(wm, sm)} |")

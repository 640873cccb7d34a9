#!/usr/bin/env python3
"""Runs a workload of scenarios/simulate/ over a grid of field values; one line per run.

    .venv/bin/python tools/simulate_sweep.py WORKLOAD.json [FIELD=V1,V2,...]...

FIELD is a dotted path into the workload (``disconnects.reconnect_delay_s``,
``config.bookmark_frequency_ms``, ``watchers.bookmarks``); each value is JSON (``30``,
``false``, ``{"dist":"exp","mean":20}`` — quote it for the shell). Every combination runs
through ``watchcache.simulate`` (the same core and report as ``watchcache simulate FILE``).

Printed per run: the values, then ``reconnects`` (watch requests after a client-side disconnect:
``watches_started - watchers.count - relists``, as nothing else ends a watch in these
workloads), ``watch_410``, ``relists``, ``share`` (410s per reconnect), ``etcd_list_410``,
``etcd_objects`` (objects read from etcd) and ``peak_ring_capacity``. Used by docs/slo.md.
"""

import copy
import itertools
import json
import sys

import watchcache


def parse_assignment(text):
    path, _, values = text.partition("=")
    if not path or not values:
        sys.exit(f"expected FIELD=V1,V2,..., got {text!r}")
    # Split on commas outside braces, so {"dist":"exp","mean":20} stays one value.
    out, depth, cur = [], 0, ""
    for ch in values:
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
            continue
        depth += ch in "{[" and 1 or ch in "}]" and -1 or 0
        cur += ch
    out.append(cur)
    return path.split("."), [json.loads(v) for v in out]


def set_path(doc, path, value):
    for key in path[:-1]:
        doc = doc.setdefault(key, {})
    doc[path[-1]] = value


def main(argv):
    if len(argv) < 2 or argv[1] in ("-h", "--help"):
        print(__doc__)
        return 0
    with open(argv[1]) as f:
        base = json.load(f)
    grid = [parse_assignment(a) for a in argv[2:]]
    names = [".".join(p) for p, _ in grid]
    cols = names + ["reconnects", "watch_410", "relists", "share", "etcd_list_410", "etcd_objects",
                    "peak_ring_capacity"]
    print("\t".join(cols))
    for combo in itertools.product(*[vals for _, vals in grid]) if grid else [()]:
        w = copy.deepcopy(base)
        for (path, _), v in zip(grid, combo):
            set_path(w, path, v)
        w["series"] = False
        s = watchcache.simulate(w)["summary"]
        watchers = w.get("watchers", {}).get("count", 10)
        reconnects = s["watches_started"] - watchers - s["relists"]
        share = s["watch_410"] / reconnects if reconnects else float("nan")
        row = [json.dumps(v, separators=(",", ":")) for v in combo] + [
            reconnects, s["watch_410"], s["relists"], f"{share:.3f}", s["etcd_list_410"],
            s["etcd_range_objects"], s["peak_ring_capacity"]]
        print("\t".join(str(x) for x in row))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

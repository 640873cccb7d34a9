"""Python and JS expose the same surface: the same config fields, metrics, outputs, getters,
simulate reports and traces, field by field.

The calls of ``bindings-wasm/tests/surface/calls.json`` run on a Python ``Cacher`` here and on
the JS one in Node (``dump.mjs``, against the built ``bindings-wasm/pkg-node``); the results
must be equal after the mappings each language makes by design, and only those:

- names: JS spells fields in camelCase (``lastRv``), Python in snake_case (``last_rv``);
  config fields and metrics are snake_case in both (they are the scenario format's names);
- ``continue`` (JS) is ``continue_token`` in Python, where ``continue`` is a keyword;
- a field without a value is absent in JS and ``None`` in Python;
- the items of a read sent to storage: absent in JS (outputs are told apart by ``source``),
  an empty tuple in Python (``items`` is always iterable);
- 64-bit numbers are BigInt in JS, int in Python;
- ``poll_timeout()`` is ``(ms, reason)`` in Python and ``{atMs, reason}`` in JS;
  ``window_events()`` items are tuples ``(rv, key, is_delete)`` in Python, objects in JS;
- errors: the statuses and the core's errors are the same classes by name, code and reason
  (``InvalidRequest``, ``StorageInputError``, ``ConfigError``, ...); a wrong argument is each
  language's own (``TypeError``/``ValueError``; JS ``TypeError``), compared only as "raised";
  Python's outputs also carry ``.error``, the exception object, which JS has no use for.
"""

import json
import pathlib
import re
import shutil
import subprocess

import pytest

import watchcache

ROOT = pathlib.Path(__file__).resolve().parents[2]
SURFACE = ROOT / "bindings-wasm" / "tests" / "surface"
CALLS = json.loads((SURFACE / "calls.json").read_text())

# Keys that hold data (label names, metric label values), not field names: never renamed.
DATA_MAPS = {"labels", "fields", "cache_lists", "cache_list_fetched", "annotations"}
OUTPUT_CLASSES = tuple(
    getattr(watchcache, n)
    for n in ["WatchItem", "WatchStarted", "WatchError", "WatchClosed", "WatchDelegated", "ReadResult",
              "RangeResult", "Rejected", "RequestProgress", "NeedCurrentRevision", "Relist"]
)
RECORD_CLASSES = OUTPUT_CLASSES + (watchcache.Item, watchcache.Window, watchcache.WatcherInfo)


def snake(name: str) -> str:
    return re.sub(r"[A-Z]", lambda m: "_" + m.group(0).lower(), name)


# ----- the JS side -------------------------------------------------------------------------------


def from_js(v, parent=None, outputs=False):
    """The JS dump with BigInts as ints and field names in Python's spelling."""
    if isinstance(v, dict):
        if set(v) == {"$bigint"}:
            return int(v["$bigint"])
        out = {}
        for k, x in v.items():
            name = k if parent in DATA_MAPS else snake(k)
            if outputs and name == "continue":
                name = "continue_token"
            out[name] = from_js(x, name, outputs)
        return out
    if isinstance(v, list):
        return [from_js(x, parent, outputs) for x in v]
    return v


@pytest.fixture(scope="module")
def js():
    node = shutil.which("node")
    pkg = ROOT / "bindings-wasm" / "pkg-node"
    # make test-python builds the wasm package first; a missing one fails, never skips.
    assert node, "node not found (make test-python installs it)"
    assert (pkg / "watchcache.js").exists(), f"{pkg} is not built: run make wasm"
    out = subprocess.run([node, str(SURFACE / "dump.mjs"), str(pkg)], check=True, capture_output=True,
                         text=True, timeout=120).stdout
    return json.loads(out)


# ----- the Python side ---------------------------------------------------------------------------


def record(o):
    """A Python output, item, window or watcher as a dict of its public attributes, the values
    that are None left out (JS leaves them out)."""
    d = {}
    for name in dir(o):
        if name.startswith("_") or name == "error":
            continue
        v = getattr(o, name)
        if callable(v) or v is None:
            continue
        d[name] = to_plain(v)
    if d.get("source") == "storage" and d.get("items") == []:
        del d["items"]
    return d


def to_plain(v):
    if isinstance(v, RECORD_CLASSES):
        return record(v)
    if isinstance(v, (list, tuple)):
        return [to_plain(x) for x in v]
    if isinstance(v, dict):
        return {k: to_plain(x) for k, x in v.items()}
    return v


def error_of(e):
    if isinstance(e, watchcache.WatchCacheError):
        return {"error": type(e).__name__, "code": e.code, "reason": e.reason}
    return {"error": "argument error"}


def js_error_of(e):
    own = e["error"] in ("TypeError", "RangeError")
    return {"error": "argument error"} if own else e


def snapshot(c):
    t = c.poll_timeout()
    getters = ["now_ms", "resource_version", "list_resource_version", "ready_state", "store_len", "budget_ms",
               "parked", "auto_current_revision"]
    return {
        **{g: getattr(c, g) for g in getters},
        "window": record(c.window),
        "window_events": [{"rv": rv, "key": k, "is_delete": d} for rv, k, d in c.window_events()],
        "objects": to_plain(c.objects()),
        "watchers": to_plain(c.watchers()),
        "poll_timeout": None if t is None else {"at_ms": t[0], "reason": t[1]},
        "metrics": c.metrics(),
        "config": c.config(),
    }


# Fields the calls cannot give a value: a watch error never carries a Retry-After today.
NEVER_SET = {"WatchError": {"retry_after_s"}}


def py_run(r, raw=False):
    try:
        c = watchcache.Cacher(**r["config"])
    except Exception as e:  # noqa: BLE001 - compared with JS's error
        return {"name": r["name"], "created": error_of(e), "steps": []}
    names = {}

    def arg(a):
        return names[a["$ref"]] if isinstance(a, dict) and "$ref" in a else a

    steps = []
    for s in r["steps"]:
        call = s["call"]
        if call == "snapshot":
            steps.append({"call": call, "snapshot": snapshot(c)})
            continue
        if call == "set":
            setattr(c, *s["args"])
            steps.append({"call": call})
            continue
        args = [arg(a) for a in s["args"]]
        if call == "handle_txn":
            args[2] = [tuple(x) for x in args[2]]
        kwargs = {k: arg(v) for k, v in (s.get("kwargs") or {}).items()}
        try:
            ret = getattr(c, call)(*args, **kwargs)
        except Exception as e:  # noqa: BLE001 - compared with JS's error
            steps.append({"call": call, "raised": error_of(e)})
            continue
        if "name" in s:
            names[s["name"]] = ret
        drained = [] if call == "poll_output" else c.drain()
        outputs = drained if raw else [record(o) for o in drained]
        steps.append({"call": call, "ret": to_plain(ret), "outputs": outputs})
    return {"name": r["name"], "steps": steps}


# ----- comparing ---------------------------------------------------------------------------------


def differences(py, js, path="", out=None):
    out = [] if out is None else out
    if isinstance(py, dict) and isinstance(js, dict):
        for k in sorted(set(py) | set(js)):
            if k not in js:
                out.append(f"{path}.{k}: Python has {py[k]!r}, JS has nothing")
            elif k not in py:
                out.append(f"{path}.{k}: JS has {js[k]!r}, Python has nothing")
            else:
                differences(py[k], js[k], f"{path}.{k}", out)
    elif isinstance(py, list) and isinstance(js, list) and len(py) == len(js):
        for i, (a, b) in enumerate(zip(py, js)):
            differences(a, b, f"{path}[{i}]", out)
    elif py != js or type(py) is bool and type(js) is not bool:
        out.append(f"{path}: Python {py!r} != JS {js!r}")
    return out


def assert_same(py, js, what):
    diffs = differences(py, js, what)
    assert not diffs, f"{len(diffs)} difference(s) between the Python and JS surfaces:\n" + "\n".join(diffs[:40])


@pytest.mark.parametrize("i", range(len(CALLS["runs"])), ids=[r["name"] for r in CALLS["runs"]])
def test_cacher_surfaces_are_the_same(js, i):
    py = py_run(CALLS["runs"][i])
    j = from_js(js["runs"][i], outputs=True)
    if "created" in j:
        j["created"] = js_error_of(j["created"])
    for s in j["steps"]:
        if "raised" in s:
            s["raised"] = js_error_of(s["raised"])
    assert_same(py, j, f"runs[{i}]")


def test_every_output_class_and_field_is_compared():
    # The calls must reach every kind of output and give every field a value, or the
    # comparison above proves less than it says.
    seen = {}
    for r in CALLS["runs"]:
        for s in py_run(r, raw=True)["steps"]:
            for o in s.get("outputs", []):
                seen.setdefault(type(o), set()).update(n for n, v in record(o).items())
    missing = [cls.__name__ for cls in OUTPUT_CLASSES if cls not in seen]
    assert not missing, f"no output of {missing} was compared"
    for cls, fields in seen.items():
        declared = {n for n in dir(cls) if not n.startswith("_") and n not in ("error", "to_dict")}
        unset = declared - fields - NEVER_SET.get(cls.__name__, set())
        assert not unset, f"{cls.__name__}: {sorted(unset)} never had a value in the compared runs"


def test_config_has_every_field_in_both(js):
    # The issue that started this: Python's config() had 24 fields, JS's 18.
    py = watchcache.Cacher().config()
    first = next(s for s in js["runs"][0]["steps"] if s["call"] == "snapshot")
    assert list(py) == list(first["snapshot"]["config"])
    assert len(py) >= 24


def test_simulate_reports_are_the_same(js):
    for i, w in enumerate(CALLS["simulate"]):
        assert_same(watchcache.simulate(w), from_js(js["simulate"][i]), f"simulate[{i}]")


def test_replay_traces_are_the_same(js):
    for f in CALLS["replay"]:
        text = (ROOT / "scenarios" / f).read_text()
        assert_same(watchcache.replay(text), from_js(js["replay"][f]), f)

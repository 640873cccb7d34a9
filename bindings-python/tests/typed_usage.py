"""A small program type-checked with mypy --strict against the stubs."""

from typing import Any, Dict, List

import watchcache


def main() -> int:
    c = watchcache.Cacher(capacity=10)
    c.handle_replace(0, 5, [{"key": "/pods/ns/a", "value": "a"}])
    w: int = c.start_watch(1, "/pods/", rv="5", allow_bookmarks=True, consume="manual")
    c.handle_put(2, {"key": "/pods/ns/a", "value": "b", "rv": 6})
    n: int = c.consume(3, w, 10)
    trace: List[Dict[str, Any]] = watchcache.replay({"steps": []})
    report: Dict[str, Any] = watchcache.simulate({"duration_s": 1})
    assert report["summary"]["events_written"] >= 0
    for o in c.drain():
        if isinstance(o, watchcache.WatchItem):
            print(o.type, o.rv)
    window = c.window
    return n + len(trace) + (window.newest_rv or 0)


if __name__ == "__main__":
    main()

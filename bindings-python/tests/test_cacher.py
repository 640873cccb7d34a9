"""The Cacher API: storage inputs, watches, reads, time, getters, outputs."""

import watchcache
from watchcache import ReadResult, WatchClosed, WatchItem, WatchStarted


def pod(name, rv, **labels):
    return {"key": f"/pods/ns/{name}", "value": f"{name}@{rv}", "rv": rv, "labels": labels,
            "fields": {"metadata.namespace": "ns", "metadata.name": name}}


def items_of(outputs, id_):
    return [(o.type, o.key, o.rv) for o in outputs if isinstance(o, WatchItem) and o.id == id_]


def test_watch_replays_window_and_streams():
    c = watchcache.Cacher(capacity=5, dynamic_capacity=False)
    c.handle_replace(0, 10, [pod("a", 3)])
    c.handle_put(1, pod("a", 11))
    c.handle_put(2, pod("b", 12))
    w = c.start_watch(3, "/pods/", rv="10")
    out = c.drain()
    assert isinstance(out[0], WatchStarted) and out[0].rv == 10 and out[0].initial == "ring"
    assert items_of(out, w) == [("MODIFIED", "/pods/ns/a", 11), ("ADDED", "/pods/ns/b", 12)]
    c.handle_delete(4, "/pods/ns/a", 13)
    out = c.drain()
    assert items_of(out, w) == [("DELETED", "/pods/ns/a", 13)]
    assert out[0].value == "a@11"  # a DELETED carries the last stored object


def test_pattern_matching_and_to_dict():
    c = watchcache.Cacher()
    c.handle_replace(0, 5, [pod("a", 1)])
    c.start_watch(1, "/pods/", rv="0")
    seen = []
    for o in c.drain():
        match o:
            case WatchStarted(at, id_, rv):
                seen.append(("started", rv))
            case WatchItem(at, id_, "ADDED", key, rv, value):
                seen.append((key, rv, value))
    assert seen == [("started", 5), ("/pods/ns/a", 1, "a@1")]


def test_lists_and_gets():
    c = watchcache.Cacher(profile="v1.34")
    c.handle_replace(0, 10, [pod(n, i + 1, app="web" if i % 2 else "db") for i, n in enumerate("abcde")])
    c.list(1, "/pods/ns", rv="0", label_selector="app=web")
    c.list(2, "/pods/ns", limit=2)  # consistent, answered automatically
    c.get(3, "/pods/ns/zz", rv="0")
    out = [o for o in c.drain() if not isinstance(o, watchcache.NeedCurrentRevision)]
    web, page, missing = out
    assert isinstance(web, ReadResult) and web.source == "cache"
    assert [i.key for i in web.items] == ["/pods/ns/b", "/pods/ns/d"]
    assert web.items[0].labels == {"app": "web"}
    assert page.continue_token and page.remaining == 3 and len(page.items) == 2
    assert isinstance(missing, watchcache.Rejected) and missing.code == 404
    assert isinstance(missing.error, watchcache.NotFound)
    c.list(4, "/pods/ns", limit=2, continue_token=page.continue_token)
    nxt = c.drain()[0]
    assert [i.key for i in nxt.items] == ["/pods/ns/c", "/pods/ns/d"]


def test_time_and_timers():
    c = watchcache.Cacher(dispatch_tick_jitter=0, bookmark_frequency_ms=1000)
    c.handle_replace(0, 10, [])
    w = c.start_watch(0, "/pods/", rv="10", allow_bookmarks=True, timeout_ms=5000)
    c.handle_put(100, pod("a", 11))
    assert c.poll_timeout() == (1000, "dispatch_tick")
    c.advance(5000)
    out = c.drain()
    bookmarks = [o for o in out if isinstance(o, WatchItem) and o.type == "BOOKMARK"]
    # Every second until deadline - 2 s; at exactly that boundary Kubernetes' nextBookmarkTime
    # schedules one more (see scenarios/bookmark_before_watch_timeout.json).
    assert [b.at for b in bookmarks] == [1000, 2000, 3000, 4000]
    closed = [o for o in out if isinstance(o, WatchClosed)]
    assert closed[0].cause == "timeout" and closed[0].at == 5000 and closed[0].id == w


def test_slow_watcher_and_getters():
    c = watchcache.Cacher(dispatch_tick_jitter=0)
    c.handle_replace(0, 100, [])
    slow = c.start_watch(0, "/pods/", rv="100", consume="manual", slow_policy="lag", queue_capacity=2)
    for rv in range(101, 106):
        c.handle_put(10, pod("p", rv))
    info = c.watcher(slow)
    assert info.state == "lagging" and info.queued == 2 and info.policy == "lag"
    assert c.consume(20, slow) == 5
    assert c.watcher(slow).state == "active"
    assert c.window.len == 5 and c.window.newest_rv == 105
    assert [rv for rv, _, _ in c.window_events()] == [101, 102, 103, 104, 105]
    m = c.metrics()
    assert m["events_received"] == 5 and m["deliveries"] == 5
    assert c.config()["profile"] == "v1.30"
    assert c.store_len == 1 and c.objects()[0].rv == 105


def test_txn_is_one_revision():
    c = watchcache.Cacher()
    c.handle_replace(0, 1, [pod("a", 1)])
    w = c.start_watch(0, "/pods/", rv="1")
    c.handle_txn(1, 2, [("put", pod("b", 2)), ("delete", "/pods/ns/a")])
    assert items_of(c.drain(), w) == [("ADDED", "/pods/ns/b", 2), ("DELETED", "/pods/ns/a", 2)]


def test_manual_current_revision():
    c = watchcache.Cacher(profile="v1.34")
    c.auto_current_revision = False
    c.handle_replace(0, 10, [])
    lid = c.list(1, "/pods/")
    (need,) = c.drain()
    assert isinstance(need, watchcache.NeedCurrentRevision) and need.id == lid
    c.handle_current_revision(2, lid, 12)
    assert c.parked == 1
    c.handle_progress(3, 12)
    (res,) = c.drain()
    assert res.source == "cache" and res.rv == 12


def test_big_resource_versions_stay_exact():
    big = 2**63 + 12345
    c = watchcache.Cacher()
    c.handle_replace(0, big, [])
    c.handle_put(1, {"key": "/k/a", "value": "x", "rv": big + 1})
    w = c.start_watch(2, "/k/", rv=str(big))
    (_, item) = c.drain()
    assert item.rv == big + 1 and c.resource_version == big + 1
    assert watchcache.replay({"steps": [{"at": 0, "op": "replace", "rv": str(2**64 - 2)},
                                        {"at": 1, "op": "put", "rv": 2**64 - 1, "object": {"key": "/a"}},
                                        {"at": 2, "op": "list", "id": "l", "key": "/", "rv": "0"}]})[0]["rv"] == 2**64 - 1


def test_polling_gives_exactly_what_draining_gives():
    # One output can be several items: a fan-out (one event, several watchers) and a manual
    # consume (several events for one watcher). poll_output must return each item once, in
    # order, and drain after a partial poll must neither lose nor repeat any.
    def run():
        c = watchcache.Cacher(dispatch_tick_jitter=0)
        c.handle_replace(0, 100, [])
        for _ in range(3):
            c.start_watch(0, "/pods/", rv="100")
        slow = c.start_watch(0, "/pods/", rv="100", consume="manual")
        for rv in range(101, 105):
            c.handle_put(10, pod("p", rv))
        assert c.consume(20, slow) == 4
        return c

    def key(o):
        return repr(o.to_dict())

    drained = [key(o) for o in run().drain()]
    assert len(drained) >= 3 * 4 + 4
    c = run()
    polled = []
    while (o := c.poll_output()) is not None:
        polled.append(key(o))
    assert polled == drained
    # Half by polling, the rest by draining.
    c = run()
    half = [key(c.poll_output()) for _ in range(len(drained) // 2)]
    assert half + [key(o) for o in c.drain()] == drained
    assert c.poll_output() is None

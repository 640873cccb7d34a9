"""Hypothesis: random operation sequences never crash the core, and every watch stream is
ordered, duplicate-free and gap-free, with nothing after its end."""

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import watchcache
from watchcache import WatchClosed, WatchItem

KEYS = [f"/pods/ns/k{i}" for i in range(5)]

op = st.one_of(
    st.tuples(st.just("put"), st.sampled_from(KEYS), st.booleans()),
    st.tuples(st.just("delete"), st.sampled_from(KEYS)),
    st.tuples(st.just("progress"), st.integers(0, 3)),
    st.tuples(st.just("relist"), st.integers(0, 3)),
    st.tuples(st.just("watch"), st.sampled_from(["", "0", "back", "ahead"]),
              st.sampled_from([None, True, False]), st.booleans(), st.booleans(), st.booleans()),
    st.tuples(st.just("consume"), st.integers(0, 20), st.one_of(st.none(), st.integers(1, 5))),
    st.tuples(st.just("stop"), st.integers(0, 20)),
    st.tuples(st.just("list"), st.sampled_from(["", "0", "back"]), st.integers(0, 3)),
    st.tuples(st.just("advance"), st.integers(0, 3000)),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(profile=st.sampled_from(["v1.30", "v1.34"]), capacity=st.integers(1, 6), ops=st.lists(op, max_size=60))
def test_random_sequences(profile, capacity, ops):
    c = watchcache.Cacher(profile=profile, capacity=capacity, lower_bound_capacity=1,
                          upper_bound_capacity=16, watch_list=True, bookmark_frequency_ms=1000)
    now, rv = 0, 1
    state = {}
    c.handle_replace(now, rv, [])
    history = []  # (rv, key) of every change the cache saw
    watches = []
    cache_up = True
    for o in ops:
        now += 5
        kind = o[0]
        if kind == "put":
            rv += 1
            state[o[1]] = rv
            obj = {"key": o[1], "value": str(rv), "rv": rv, "labels": {"app": "web"} if o[2] else {}}
            if cache_up:
                c.handle_put(now, obj)
                history.append((rv, o[1]))
        elif kind == "delete" and o[1] in state:
            rv += 1
            del state[o[1]]
            if cache_up:
                c.handle_delete(now, o[1], rv)
                history.append((rv, o[1]))
        elif kind == "progress":
            rv += o[1]
            if cache_up:
                c.handle_progress(now, rv)
        elif kind == "relist":
            c.handle_storage_error(now, "test")
            rv += o[1]
            c.handle_replace(now, rv, [{"key": k, "value": str(v), "rv": v} for k, v in state.items()])
            cache_up = True
        elif kind == "watch":
            rvs = {"": "", "0": "0", "back": str(max(1, rv - 2)), "ahead": str(rv + 1)}[o[1]]
            watches.append(c.start_watch(now, "/pods/", rv=rvs, send_initial_events=o[2],
                                         allow_bookmarks=o[3], consume="manual" if o[4] else "auto",
                                         slow_policy="lag" if o[5] else "terminate", queue_capacity=3))
        elif kind == "consume" and watches:
            c.consume(now, watches[o[1] % len(watches)], o[2])
        elif kind == "stop" and watches:
            c.stop_watch(now, watches[o[1] % len(watches)])
        elif kind == "list":
            rvs = {"": "", "0": "0", "back": str(max(1, rv - 2))}[o[1]]
            c.list(now, "/pods/", rv=rvs, limit=o[2])
        elif kind == "advance":
            now += o[1]
            c.advance(now)
        c.set_etcd_rv(rv)
    for w in watches:
        c.stop_watch(now, w)
    outputs = c.drain()

    changes = {w: [] for w in watches}
    closed = {w: 0 for w in watches}
    started = {}
    for out in outputs:
        if isinstance(out, watchcache.WatchStarted):
            started[out.id] = out.rv
        if isinstance(out, WatchItem) and out.id in changes:
            assert closed[out.id] == 0, "event after the end of the watch"
            # Initial state (ADDED at the object's own RV) is not a change after the start.
            if out.type != "BOOKMARK" and out.rv > started[out.id]:
                changes[out.id].append((out.rv, out.key))
        if isinstance(out, (WatchClosed, watchcache.Rejected)) and out.id in closed:
            closed[out.id] += 1
    for w, live in changes.items():
        assert closed[w] == 1, f"watch {w} ended {closed[w]} times"
        rvs = [r for r, _ in live]
        assert rvs == sorted(rvs), "out of order"
        assert len(set(live)) == len(live), "duplicate event"
        if live:
            # Gap-free: exactly the history's changes after the start, as far as it got.
            after = [h for h in history if h[0] > started[w]]
            assert live == after[: len(live)], f"gap: {live} vs {after}"

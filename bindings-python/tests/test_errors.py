"""Exceptions by type, TypeErrors that name the argument, and no panics."""

import pytest

import watchcache


def ready():
    c = watchcache.Cacher()
    c.handle_replace(0, 10, [{"key": "/pods/ns/a", "value": "a"}])
    return c


def test_hierarchy():
    for cls in (watchcache.InvalidRequest, watchcache.NotFound, watchcache.ResourceExpired,
                watchcache.TooLargeResourceVersion, watchcache.NotReady, watchcache.ScenarioError,
                watchcache.ConfigError, watchcache.StorageInputError):
        assert issubclass(cls, watchcache.WatchCacheError)
    assert issubclass(watchcache.InvalidRequest, ValueError)
    assert issubclass(watchcache.ScenarioError, ValueError)


@pytest.mark.parametrize("kwargs", [
    {"rv": "ten"}, {"rv": "-1"}, {"label_selector": "app=web,"}, {"field_selector": "nope"},
    {"range_end": "/a"},
])
def test_invalid_watch_options(kwargs):
    with pytest.raises(watchcache.InvalidRequest) as e:
        ready().start_watch(1, "/pods/b", **kwargs)
    assert e.value.code == 400 and e.value.reason == "BadRequest"


def test_invalid_list_options():
    c = ready()
    with pytest.raises(watchcache.InvalidRequest, match="resourceVersionMatch"):
        c.list(1, "/pods/", rv="0", rv_match="Exact")
    with pytest.raises(watchcache.InvalidRequest, match="Unsupported"):
        c.list(1, "/pods/", rv="5", rv_match="Newest")


def test_status_outputs_carry_typed_errors():
    c = ready()
    c.start_watch(1, "/pods/", rv="5")
    err = next(o for o in c.drain() if isinstance(o, watchcache.WatchError))
    assert err.code == 410
    assert isinstance(err.error, watchcache.ResourceExpired)
    with pytest.raises(watchcache.ResourceExpired):
        watchcache.raise_for(err)
    c.get(2, "/pods/ns/a", rv="99")
    c.advance(5000)
    rej = c.drain()[-1]
    assert rej.code == 504 and rej.retry_after_s == 1
    assert isinstance(rej.error, watchcache.TooLargeResourceVersion)
    c2 = watchcache.Cacher(profile="v1.34")
    c2.start_watch(0, "/pods/", rv="0")
    rej = c2.drain()[0]
    assert isinstance(rej.error, watchcache.NotReady) and rej.code == 429


def test_storage_input_errors_leave_state_unchanged():
    c = ready()
    with pytest.raises(watchcache.StorageInputError, match="went back"):
        c.handle_put(1, {"key": "/pods/ns/b", "value": "b", "rv": 9})
    with pytest.raises(watchcache.StorageInputError, match="unknown key"):
        c.handle_delete(1, "/pods/ns/zz", 11)
    assert c.resource_version == 10 and c.store_len == 1


def test_config_errors_name_the_field():
    with pytest.raises(watchcache.ConfigError, match="capacity"):
        watchcache.Cacher(capacity=0)
    with pytest.raises(watchcache.ConfigError, match="unknown field"):
        watchcache.Cacher(capcity=10)
    with pytest.raises(watchcache.ConfigError, match="profile"):
        watchcache.Cacher(profile="v2")


@pytest.mark.parametrize("call", [
    lambda c: c.start_watch("now", "/pods/"),
    lambda c: c.start_watch(1, 42),
    lambda c: c.handle_put(1, "not a dict"),
    lambda c: c.handle_put(1, {"key": 1, "rv": 11}),
    lambda c: c.handle_replace(1, 11, {"key": "/a"}),
    lambda c: c.handle_put(1, {"key": "/a", "rv": 11, "labels": {"app": 1}}),
    lambda c: c.list(1, "/pods/", rv=1.5),
    lambda c: watchcache.replay(42),
])
def test_wrong_types_are_type_errors(call):
    with pytest.raises(TypeError):
        call(ready())


def test_negative_and_huge_numbers_are_clean_errors():
    c = ready()
    with pytest.raises((OverflowError, TypeError, ValueError)):
        c.handle_put(-1, {"key": "/a", "rv": 11})
    with pytest.raises((OverflowError, TypeError, ValueError)):
        c.handle_progress(1, 2**64)
    with pytest.raises(ValueError, match="time goes back"):
        c.advance(100)
        c.advance(50)


def test_bad_scenarios_never_panic():
    for bad in ["", "{", "[]", '{"steps": 3}', '{"steps": [{"at": 1e400, "op": "advance"}]}',
                '{"steps": [{"at": 0, "op": "watch", "id": "w", "key": "/", "rv": "\\u0000"}]}']:
        try:
            watchcache.replay(bad)
        except watchcache.ScenarioError:
            pass


def test_a_far_advance_can_be_interrupted():
    # Stepping to 10^12 ms is a billion dispatch ticks. Ctrl-C (SIGINT from outside, as a
    # terminal or Jupyter sends it) stops it with KeyboardInterrupt, and the cacher goes on
    # from where it stopped.
    import os
    import signal
    import subprocess

    # Python raises KeyboardInterrupt only with its own SIGINT handler installed, as it is in a
    # terminal or a kernel; a runner started in the background (`make test &`) inherits SIGINT
    # ignored, so install it for this test.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    c = watchcache.Cacher(dispatch_tick_jitter=0)
    c.handle_replace(0, 10, [])
    c.start_watch(0, "/pods/", rv="10", allow_bookmarks=True)
    killer = subprocess.Popen(["sh", "-c", f"sleep 0.5; kill -INT {os.getpid()}"])
    try:
        with pytest.raises(KeyboardInterrupt):
            c.advance(10**12)
    finally:
        killer.wait()
        signal.signal(signal.SIGINT, previous)
    stopped = c.now_ms
    assert 0 < stopped < 10**12
    c.advance(stopped + 5000)

"""The hand-written stubs match the built module; every docstring example runs."""

import doctest
import pathlib
import subprocess
import sys

import watchcache
import watchcache._core
import watchcache._errors

HERE = pathlib.Path(__file__).resolve().parent


def test_stubtest_finds_no_mismatch():
    r = subprocess.run([sys.executable, "-m", "mypy.stubtest", "watchcache._core"],
                       capture_output=True, text=True, cwd=HERE)
    assert r.returncode == 0, r.stdout + r.stderr


def test_usage_type_checks():
    code = HERE / "typed_usage.py"
    r = subprocess.run([sys.executable, "-m", "mypy", "--strict", str(code)], capture_output=True, text=True, cwd=HERE)
    assert r.returncode == 0, r.stdout + r.stderr


def test_docstring_examples():
    for mod in (watchcache, watchcache._core, watchcache._errors):
        result = doctest.testmod(mod, optionflags=doctest.ELLIPSIS)
        assert result.failed == 0, f"{mod.__name__}: {result}"
    # Methods and classes of the native module carry examples too.
    finder = doctest.DocTestFinder()
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    tests = finder.find(watchcache.Cacher, "watchcache.Cacher", globs={"watchcache": watchcache})
    assert any(t.examples for t in tests)
    for t in tests:
        runner.run(t)
    assert runner.failures == 0


def test_every_public_item_is_documented():
    for name in watchcache.__all__:
        obj = getattr(watchcache, name)
        if callable(obj) or isinstance(obj, type):
            assert obj.__doc__, f"{name} has no docstring"


def test_installed_wheel_is_abi3_for_cpython_3_9_and_later():
    import importlib.metadata

    wheel = importlib.metadata.distribution("watchcache").read_text("WHEEL") or ""
    assert "cp39-abi3" in wheel, wheel
    assert (pathlib.Path(watchcache.__file__).parent / "py.typed").exists()

"""The Python package as pip expects it: ``maturin sdist`` makes an sdist, pip builds a wheel from
it in a fresh venv (in isolation, with maturin from PyPI as the declared build backend, as any
user's pip would), the wheel installs there, and the installed copy has its metadata, its
``__version__`` and replays a scenario equal to its golden trace; the README's example runs.

The Rust build reuses ``target/packaging`` between runs (only the crates of the unpacked sdist
are compiled again), so the test costs about a minute, not a cold build.
"""

import json
import os
import pathlib
import subprocess
import sys
import tarfile
import textwrap
import zipfile

import pytest

import watchcache

ROOT = pathlib.Path(__file__).resolve().parents[2]
PKG = ROOT / "bindings-python"
BIN = pathlib.Path(sys.executable).parent


def crate_version() -> str:
    for line in (ROOT / "Cargo.toml").read_text().split("[workspace.package]", 1)[1].splitlines():
        if line.startswith("version"):
            return line.split('"')[1]
    raise AssertionError("no workspace version")


def run(*cmd, **kw):
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=900, **kw)
    assert r.returncode == 0, f"{' '.join(map(str, cmd))} failed:\n{r.stdout}\n{r.stderr}"
    return r.stdout


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("packaging")
    run(BIN / "maturin", "sdist", "-m", PKG / "Cargo.toml", "-o", tmp / "dist")
    (sdist,) = (tmp / "dist").glob("watchcache-*.tar.gz")
    venv = tmp / "venv"
    run(sys.executable, "-m", "venv", venv)
    constraints = tmp / "constraints.txt"
    maturin_pin = next(l for l in (PKG / "requirements-dev.txt").read_text().splitlines() if l.startswith("maturin=="))
    constraints.write_text(maturin_pin + "\n")
    env = {
        **os.environ,
        "CARGO_TARGET_DIR": str(ROOT / "target" / "packaging"),
        "PIP_CONSTRAINT": str(constraints),
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    }
    vpy = venv / "bin" / "python"
    run(vpy, "-m", "pip", "wheel", "-q", "--no-deps", "-w", tmp / "wheels", sdist, env=env)
    (wheel,) = (tmp / "wheels").glob("watchcache-*.whl")
    run(vpy, "-m", "pip", "install", "-q", "--no-index", "--no-deps", wheel, env=env)
    print(f"\n# {sdist.name}: {sdist.stat().st_size} bytes; {wheel.name}: {wheel.stat().st_size} bytes")
    return {"sdist": sdist, "wheel": wheel, "python": vpy}


def test_the_sdist_has_the_sources_and_nothing_else(built):
    with tarfile.open(built["sdist"]) as t:
        names = [n.split("/", 1)[1] for n in t.getnames() if "/" in n]
    for want in ["pyproject.toml", "PKG-INFO", "README.md", "python/watchcache/__init__.py",
                 "python/watchcache/_core.pyi", "python/watchcache/py.typed"]:
        assert any(n.endswith(want) for n in names), f"{want} is not in the sdist"
    assert any(n.endswith("cacher-core/src/replay/driver.rs") for n in names), "the core is not in the sdist"
    junk = [n for n in names if "target/" in n or n.startswith("bindings-python/tests/") or "bench/" in n
            or "host-etcd" in n or "web-demo" in n or n.endswith(".ipynb")]
    assert not junk, f"the sdist carries {junk[:5]}"


def test_the_wheel_is_abi3_with_stubs(built):
    assert "abi3" in built["wheel"].name
    with zipfile.ZipFile(built["wheel"]) as z:
        names = z.namelist()
    assert "watchcache/_core.pyi" in names and "watchcache/py.typed" in names


def test_installed_copy_has_its_metadata_and_replays_a_scenario(built):
    scenario = ROOT / "scenarios" / "watch_too_old_rv_gets_410.json"
    probe = textwrap.dedent(f"""
        import json, importlib.metadata as md, pathlib, watchcache
        m = md.metadata("watchcache")
        print(json.dumps({{
            "file": watchcache.__file__,
            "version": watchcache.__version__,
            "dist_version": md.version("watchcache"),
            "summary": m["Summary"],
            "license": m.get("License-Expression") or m.get("License"),
            "requires_python": m["Requires-Python"],
            "classifiers": m.get_all("Classifier"),
            "description": m.get_payload() or m.get("Description"),
            "trace": watchcache.replay_json(pathlib.Path({str(scenario)!r}).read_text()),
        }}))
    """)
    out = json.loads(run(built["python"], "-c", probe, cwd="/"))
    assert out["file"].startswith(str(built["python"].parent.parent)), "imported a copy outside the fresh venv"
    assert out["version"] == out["dist_version"] == crate_version() == watchcache.__version__
    assert "watch cache" in out["summary"]
    assert out["license"] == "Apache-2.0"
    assert out["requires_python"] == ">=3.9"
    assert "Typing :: Typed" in out["classifiers"] and "Programming Language :: Rust" in out["classifiers"]
    assert out["description"].startswith("# watchcache (Python)"), "the description is not the README"
    assert out["trace"] == scenario.with_suffix(".trace.json").read_text()


def test_the_readme_example_runs_against_the_installed_copy(built):
    readme = (PKG / "README.md").read_text()
    example = readme.split("```python\n", 1)[1].split("```", 1)[0]
    out = run(built["python"], "-c", example, cwd="/")
    assert out.splitlines()[:2] == ["[('STARTED', 9), ('ADDED', 10)]", "[('ERROR', 410), ('CLOSED', None)]"]

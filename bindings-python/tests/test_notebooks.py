"""The notebooks under examples/ run top to bottom in a real Jupyter kernel."""

import contextlib
import os
import pathlib
import signal
import time

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = pathlib.Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "examples").glob("*.ipynb"))
# Issue 6: the SLO notebook's sweeps must run in well under two minutes on two cores.
TIME_BUDGET_S = {"slo": 120}


def test_there_is_a_tour():
    assert (ROOT / "examples" / "tour.ipynb") in NOTEBOOKS


def test_there_is_the_slo_notebook():
    assert (ROOT / "examples" / "slo.ipynb") in NOTEBOOKS


def run_notebook(path):
    """Executes a notebook in a fresh python3 kernel; raises CellExecutionError on a failing cell."""
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}})
    start = time.perf_counter()
    client.execute()
    return nb, time.perf_counter() - start


@contextlib.contextmanager
def oracle_build_paused():
    """`make test` builds the Kubernetes oracles in the background (the Makefile's
    oracle-build-start, in a process group of its own whose leader's pid is in
    .tools/oracle-build/pid). A time budget is the notebook's on two cores, so that build is
    stopped while a timed notebook runs and continued after (oracle-build-wait continues it
    too, should this process die in between)."""
    bg = ROOT / ".tools" / "oracle-build"
    pgid = None
    if (bg / "pid").exists() and not (bg / "status").exists():
        try:
            pgid = os.getpgid(int((bg / "pid").read_text()))
            if pgid == os.getpgid(0):
                pgid = None  # not a group of its own: leave it
            else:
                os.killpg(pgid, signal.SIGSTOP)
        except (ProcessLookupError, ValueError):
            pgid = None  # it has ended
    try:
        yield pgid is not None
    finally:
        if pgid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGCONT)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs(path, tmp_path):
    if path.stem in TIME_BUDGET_S:
        with oracle_build_paused():
            nb, seconds = run_notebook(path)
    else:
        nb, seconds = run_notebook(path)
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.output_type == "error"]
    assert not errors
    # Keep the executed notebook (with its plots) as a test artifact.
    out = ROOT / "artifacts" / "notebooks"
    out.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, out / path.name)
    budget = TIME_BUDGET_S.get(path.stem)
    if budget is not None:
        assert seconds < budget, f"{path.name} took {seconds:.0f} s (budget {budget} s)"


def test_the_slo_notebook_checks_its_findings():
    # Its last cell asserts the documented findings (docs/slo.md); a failing assert fails the run
    # above. Here: that the cell is still there, so the findings stay checked.
    nb = nbformat.read(ROOT / "examples" / "slo.ipynb", as_version=4)
    last = nb.cells[-1]
    assert last.cell_type == "code" and last.source.count("assert ") >= 5

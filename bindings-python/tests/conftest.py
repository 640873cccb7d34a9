import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture
def root() -> pathlib.Path:
    return ROOT


def scenario_files():
    return sorted(p for p in (ROOT / "scenarios").glob("*.json") if not p.name.endswith(".trace.json"))


def invalid_files():
    return sorted((ROOT / "scenarios" / "invalid").glob("*.json"))

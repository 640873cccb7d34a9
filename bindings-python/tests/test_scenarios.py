"""Every scenario under scenarios/ replayed from Python equals its golden trace."""

import json

import pytest

import watchcache

from conftest import invalid_files, scenario_files


def test_there_are_scenarios():
    assert len(scenario_files()) >= 30


@pytest.mark.parametrize("path", scenario_files(), ids=lambda p: p.stem)
def test_json_text_matches_golden_byte_for_byte(path):
    golden = path.with_name(path.stem + ".trace.json").read_text()
    assert watchcache.replay_json(path.read_text()) == golden


@pytest.mark.parametrize("path", scenario_files(), ids=lambda p: p.stem)
def test_dict_replay_matches_golden_records(path):
    golden = json.loads(path.with_name(path.stem + ".trace.json").read_text())
    trace = watchcache.replay(json.loads(path.read_text()))
    assert trace == golden
    # Same key order as the golden file's records.
    assert [list(r) for r in trace] == [list(r) for r in golden]


@pytest.mark.parametrize("path", invalid_files(), ids=lambda p: p.stem)
def test_invalid_scenarios_raise_scenario_error(path):
    want = path.with_name(path.stem + ".error.txt").read_text().strip()
    with pytest.raises(watchcache.ScenarioError) as e:
        watchcache.replay(path.read_text())
    assert str(e.value) == want
    assert isinstance(e.value, ValueError)
    assert e.value.code == 400


def test_trace_drops_into_pandas():
    import pandas

    path = next(p for p in scenario_files() if p.stem == "list_decisions_v1_30")
    df = pandas.DataFrame(watchcache.replay(path.read_text()))
    assert {"at", "id", "type", "source", "rv"} <= set(df.columns)
    assert (df["type"] == "LIST").all()
    assert df.loc[df["id"] == "rv-unset", "source"].item() == "storage"

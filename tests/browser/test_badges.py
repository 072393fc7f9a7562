"""The run times on the chapter badges are measurements of this build, never typed or stale
(book/_ext/course_badges.py). No browser needed."""
import importlib.util
import json
import pathlib
import time
import types

import pytest

EXT = pathlib.Path(__file__).resolve().parents[2] / "book" / "_ext" / "course_badges.py"


@pytest.fixture
def badges(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("course_badges_under_test", EXT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    monkeypatch.setattr(mod, "RECORD", tmp_path / "book" / "timings.json")   # the tracked record
    mod.app = types.SimpleNamespace(outdir=str(tmp_path / "_build" / "html"))
    mod.TIMINGS = tmp_path / "_build" / "timings.json"   # where a build writes
    return mod


def _env(badges, exec_data, read_now):
    env = types.SimpleNamespace()
    badges.remember_read(None, env, read_now)
    env.nb_metadata = {doc: {"exec_data": ex} for doc, ex in exec_data.items()}
    return env


def test_only_notebooks_run_by_this_build_are_recorded(badges, monkeypatch):
    monkeypatch.setenv("COURSE_QUICK", "1")
    now = time.time() + 1
    env = _env(badges, {
        "book/a": {"method": "force", "succeeded": True, "runtime": 12.34, "mtime": now},
        "book/failed": {"method": "force", "succeeded": False, "runtime": 3.0, "mtime": now},
        "book/cached": {"method": "cache", "succeeded": True, "runtime": 9.0, "mtime": now},
        "book/old": {"method": "force", "succeeded": True, "runtime": 5.0, "mtime": now - 3600},
        "book/not_read": {"method": "force", "succeeded": True, "runtime": 7.0, "mtime": now},
    }, ["book/a", "book/failed", "book/cached", "book/old"])
    badges.record(badges.app, env)
    saved = json.loads(badges.TIMINGS.read_text())
    assert not badges.RECORD.exists(), "a build must not rewrite the tracked book/_ext/timings.json"
    assert list(saved) == ["book/a"]
    assert saved["book/a"]["quick"]["seconds"] == 12.3
    assert "CPU cores" in saved["book/a"]["quick"]["machine"]


def test_a_full_size_build_keeps_the_quick_times(badges, monkeypatch):
    badges.RECORD.parent.mkdir(parents=True)
    badges.RECORD.write_text(json.dumps(
        {"book/a": {"quick": {"seconds": 20.0, "machine": "m", "date": "d"}}}))
    monkeypatch.delenv("COURSE_QUICK", raising=False)
    monkeypatch.setenv("COURSE_FULL", "1")
    env = _env(badges, {"book/a": {"method": "force", "succeeded": True, "runtime": 301.0,
                                   "mtime": time.time() + 1}}, ["book/a"])
    badges.record(badges.app, env)
    saved = json.loads(badges.TIMINGS.read_text())["book/a"]
    assert saved["quick"]["seconds"] == 20.0 and saved["full"]["seconds"] == 301.0
    assert "full" not in json.loads(badges.RECORD.read_text())["book/a"], "record rewritten"


def test_a_build_without_execution_shows_the_record(badges):
    badges.RECORD.parent.mkdir(parents=True)
    badges.RECORD.write_text(json.dumps(
        {"book/a": {"full": {"seconds": 90.0, "machine": "gpu box", "date": "d"}}}))
    env = _env(badges, {"book/a": {"method": "off"}}, ["book/a"])
    badges.record(badges.app, env)
    assert not badges.TIMINGS.exists()
    assert env.course_timings["book/a"]["full"]["machine"] == "gpu box"


@pytest.mark.parametrize("seconds, text", [(4.4, "4 s"), (59.6, "1 min 00 s"), (185, "3 min 05 s")])
def test_times_read_well(badges, seconds, text):
    assert badges.fmt_seconds(seconds) == text

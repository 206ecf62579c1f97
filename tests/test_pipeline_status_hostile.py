"""``hnce status`` never crashes on a corrupt or half-written run file: each is reported on its
own line (and in ``problems`` of ``--json``, which is strict JSON), and the logs a crash can tear
are repaired by their next append and never misread."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hnce.cluster.stores.jsonl import append_jsonl, read_jsonl
from hnce.cluster.stores.lock_holder import REFRESH, holder_file
from hnce.cluster.stores.refresh_log import LOG_FILE as REFRESH_LOG
from hnce.cluster.stores.run_events import LOG_FILE as EVENT_LOG
from hnce.cluster.stores.run_events import read_events
from hnce.events import RunEvent
from hnce.pipeline.cli.main import main
from hnce.pipeline.event_log import EventLog


def test_a_torn_last_line_is_never_read_and_the_next_append_repairs_it(tmp_path: Path) -> None:
    log = EventLog(tmp_path)
    log.write(RunEvent.STEP, step=1, loss=0.5)
    with (tmp_path / EVENT_LOG).open("a") as handle:
        handle.write('{"event": "step", "step": 2, "lo')  # the writer died here
    assert [e["step"] for e in read_events(tmp_path, RunEvent.STEP)] == [1]
    log.write(RunEvent.STEP, step=2, loss=float("nan"))
    lines = (tmp_path / EVENT_LOG).read_text().splitlines()
    assert len(lines) == 2 and all(json.loads(line) for line in lines)
    assert read_events(tmp_path, RunEvent.STEP)[-1]["loss"] is None  # NaN is not JSON: null


def test_a_corrupt_line_is_named_and_skipped(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    path.write_text('{"a": 1}\nnot json\n[1, 2]\n{"a": 2}\n')
    found = read_jsonl(path)
    assert [r["a"] for r in found.records] == [1, 2]
    assert found.problems[0].startswith(f"{path}:2: not a JSON record")
    assert found.problems[1] == f"{path}:3: not a JSON object"
    append_jsonl(path, {"a": 3})
    assert [r["a"] for r in read_jsonl(path).records] == [1, 2, 3]
    following = read_jsonl(path, found.offset, found.line)  # only what was appended
    with path.open("a") as handle:
        handle.write("oops\n")
    appended = read_jsonl(path, following.offset, following.line)
    assert appended.problems == [
        f"{path}:6: not a JSON record (Expecting value: line 1 column 1 (char 0))"
    ]
    assert [r["a"] for r in following.records] == [3] and appended.line == 7


def _broken_run(run_dir: Path) -> Path:
    """A run directory whose every record is corrupt or half-written."""
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "config.yaml").write_text("run: {}\n")
    (run_dir / EVENT_LOG).write_text('{"event": "start", "step": 0, "time": 1.0}\n{"event": "st')
    (run_dir / REFRESH_LOG).write_text('{"event": "refresh", "outcome": "published"}\nnonsense\n')
    (run_dir / holder_file(REFRESH)).write_text("{not json")
    for store in ("index", "negatives"):
        (run_dir / store).mkdir()
        (run_dir / store / "CURRENT").write_text("v7\n")  # names a version that is not there
    return run_dir


def test_status_of_a_run_whose_files_are_all_corrupt_reports_each(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = _broken_run(tmp_path / "run")
    assert main(["status", str(run_dir)]) == 0
    screen = capsys.readouterr().out
    problems = [line for line in screen.splitlines() if line.startswith("problem")]
    assert any("refresh.lock.json:1: invalid lock holder record JSON" in line for line in problems)
    assert any(f"{run_dir / REFRESH_LOG}:2: not a JSON record" in line for line in problems)
    for store in ("index", "negatives"):  # each names its CURRENT and the missing version
        (line,) = [line for line in problems if line.startswith(f"problem       {store}:")]
        assert f"{run_dir / store / 'CURRENT'}:1: names v7, which is not a published" in line
    assert main(["status", str(run_dir), "--json"]) == 0
    status = json.loads(capsys.readouterr().out)  # strict JSON
    assert len(status["problems"]) == len(problems)


def test_a_config_that_is_not_yaml_is_a_problem_line_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "config.yaml").write_text("refresh: [trigger: stale\n")
    assert main(["status", str(tmp_path)]) == 0
    screen = capsys.readouterr().out
    assert f"problem       refresh trigger: {tmp_path / 'config.yaml'}:2: not valid YAML" in screen
    assert "trigger       unknown" in screen


def test_refresh_records_of_the_wrong_types_are_named_not_crashed_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A refresh-log line is read against the record's schema: a ``started`` that is NaN,
    infinite or a string, a checkpoint that is not an integer, an unknown outcome or key is a
    problem naming its file and line (the status screen formats the good records only)."""
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    good = {"outcome": "published", "role": "hnce refresh", "started": 1.0e9, "checkpoint": 4}
    bad = [
        '{"outcome": "failed", "role": "hnce refresh", "started": NaN}',
        '{"outcome": "failed", "role": "hnce refresh", "started": Infinity}',
        '{"outcome": "failed", "role": "hnce refresh", "started": "yesterday"}',
        '{"outcome": "failed", "role": "hnce refresh", "started": 1.0, "checkpoint": 4.5}',
        '{"outcome": "exploded", "role": "hnce refresh", "started": 1.0}',
        '{"outcome": "failed", "role": "hnce refresh", "started": 1.0, "colour": "red"}',
    ]
    (run_dir / REFRESH_LOG).write_text("\n".join([json.dumps(good), *bad]) + "\n")
    assert main(["status", str(run_dir), "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    named = [p for p in status["problems"] if p.startswith(f"{run_dir / REFRESH_LOG}:")]
    assert [int(p.split(":")[1]) for p in named] == [2, 3, 4, 5, 6, 7], named
    assert status["refreshes"]["published"] == 1
    assert main(["status", str(run_dir)]) == 0
    assert "Traceback" not in capsys.readouterr().err

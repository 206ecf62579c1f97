"""The refresh lock, intervals and CLI exit codes (no Ray: the locked-out run exits first)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from cluster.refresh import RefreshPlan
from cluster.refresh_job import (
    EXIT_LOCKED,
    EXIT_NO_CHECKPOINT,
    RefreshLock,
    RefreshLocked,
    parse_interval,
    refresh_once,
)

REPO = Path(__file__).resolve().parents[1]


def test_parse_interval() -> None:
    assert parse_interval("6h") == 21600
    assert parse_interval("30m") == 1800
    assert parse_interval("45") == 45
    assert parse_interval("1d") == 86400
    for bad in ("", "-1h", "6 hours", "0s"):
        with pytest.raises(ValueError, match="bad interval"):
            parse_interval(bad)


def test_second_lock_on_one_run_fails_and_names_the_holder(tmp_path: Path) -> None:
    with (
        RefreshLock(tmp_path),
        pytest.raises(RefreshLocked, match=f"pid {os.getpid()}"),
        RefreshLock(tmp_path),
    ):
        pass
    with RefreshLock(tmp_path):  # released: taken again
        pass


def test_refresh_once_exit_codes(tmp_path: Path) -> None:
    config = RefreshPlan(tmp_path / "run", tmp_path / "data")
    lines: list[str] = []
    assert refresh_once(config, report=lines.append) == EXIT_NO_CHECKPOINT
    assert "no complete checkpoint" in lines[-1]
    with RefreshLock(config.run_dir):
        assert refresh_once(config, report=lines.append) == EXIT_LOCKED
    assert "another refresh" in lines[-1]


@pytest.mark.slow  # the CLI imports torch, transformers and Ray (~8 s)
def test_cli_exits_with_clear_message_while_another_refresh_holds_the_lock(tmp_path: Path) -> None:
    data = tmp_path / "data"
    (data / "entities").mkdir(parents=True)
    (data / "mentions").mkdir()
    (data / "mentions" / "train.parquet").touch()
    with RefreshLock(tmp_path):
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "pipeline.cli.main",
                "refresh",
                "--set",
                f"run.dir={tmp_path}",
                "--set",
                f"data.root={data}",
            ],
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert result.returncode == EXIT_LOCKED, result.stderr
    assert "another refresh of" in result.stdout and "is running" in result.stdout

"""Held-out recall of each refresh (``refresh.heldout_recall``): the eval split scored against the
index version the refresh has just built equals ``hnce eval`` of that checkpoint, it is logged in
the refresh log and shown by ``hnce status``, and a dataset without the split skips it."""

from __future__ import annotations

import json
import logging
from dataclasses import asdict
from pathlib import Path

import pytest
from store_helpers import write_checkpoint
from training_helpers import CONFIGS, REFRESHED, synthetic_config, write_letter_export

from hnce.cluster.compute.refresh.heldout import HeldoutSpec, score_heldout
from hnce.cluster.compute.refresh.job import EXIT_OK, refresh_once
from hnce.cluster.stores.refresh_log import (
    LOG_FILE,
    HeldoutRecall,
    RefreshRecord,
    append_heldout,
    append_record,
    read_log,
)
from hnce.pipeline.cli.main import main
from hnce.pipeline.run import refresh_plan
from hnce.pipeline.status import run_status

STEP = 3
KS = (1, 4, 16)


def _settings(run_dir: Path, data: Path, model_dir: Path) -> list[str]:
    """The recipe overrides of the refresh and of the evaluation alike: one run, one dataset."""
    return [
        f"run.dir={run_dir}",
        f"data.root={data}",
        f"model.path={model_dir}",
        f"eval.ks=[{', '.join(map(str, KS))}]",
        *REFRESHED,
        "data.max_eval_mentions=50",
        "refresh.shard_size=32",
        "refresh.heldout_recall=true",
    ]


@pytest.mark.slow  # Ray: an encoder actor for the refresh, another for the evaluation
def test_refresh_logs_the_heldout_recall_that_hnce_eval_reports(
    ray_session: str,
    small_dataset: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    export = write_letter_export(tmp_path / "dual", "dual")
    run_dir = tmp_path / "run"
    write_checkpoint(run_dir, STEP, export)
    settings = _settings(run_dir, small_dataset, export.parent)
    config = synthetic_config(run_dir, small_dataset, export.parent, *settings)

    assert refresh_once(refresh_plan(config), STEP, report=lambda line: None) == EXIT_OK
    log = read_log(run_dir)
    (heldout,) = log.heldout
    (record,) = log.records
    assert (heldout.step, heldout.index_version) == (STEP, record.index_version)
    assert (heldout.split, heldout.mentions) == (config.data.eval_split, 50)
    assert 0 < heldout.seconds < record.seconds

    out = tmp_path / "eval.json"
    overrides = [part for setting in settings for part in ("--set", setting)]
    recipe = ["--config", str(CONFIGS / "synthetic-test.yaml"), *overrides, "--no-progress"]
    assert main(["eval", *recipe, "--checkpoint", "newest", "--out", str(out)]) == 0
    (report,) = json.loads(out.read_text())
    assert report["index"] == str(run_dir.resolve() / "index" / f"v{record.index_version}")
    assert report["num_mentions"] == heldout.mentions
    assert heldout.recall == report["recall"]  # exactly: the same mentions, index and search
    assert len(set(heldout.recall.values())) > 1  # figures that tell splits apart

    capsys.readouterr()
    assert main(["status", str(run_dir)]) == 0
    assert heldout.line() in capsys.readouterr().out


def test_a_dataset_without_the_eval_split_skips_it_with_one_line(
    small_dataset: Path, caplog: pytest.LogCaptureFixture
) -> None:
    spec = HeldoutSpec("validation", 0, KS, per_domain=False, batch_size=8)
    with caplog.at_level(logging.INFO, logger="hnce.cluster.compute.refresh.heldout"):
        # Nothing is encoded or searched: no pool, index or version is touched.
        assert score_heldout(spec, small_dataset, None, None, None, STEP) is None  # type: ignore[arg-type]
    (line,) = caplog.messages
    assert "held-out recall skipped" in line and "'validation'" in line


def test_the_refresh_log_keeps_records_and_heldout_recalls_apart(tmp_path: Path) -> None:
    heldout = HeldoutRecall(STEP, 2, "test", 50, {"1": 0.25, "16": 0.75}, 1.5, 10.0)
    append_heldout(tmp_path, heldout)
    append_record(tmp_path, RefreshRecord("published", "hnce refresh", 9.0, 3.0, STEP, 2, 2))
    problems: list[str] = []
    log = read_log(tmp_path, problems=problems)
    assert log.heldout == [heldout] and [r.checkpoint for r in log.records] == [STEP]
    assert problems == [] and log.offset == (tmp_path / LOG_FILE).stat().st_size
    assert heldout.line() == (
        "refresh v2 (step 3): held-out R@1 0.250 R@16 0.750 (test, 50 mentions, 1.5 s)"
    )
    (tmp_path / "config.yaml").touch()  # what makes it a run directory for hnce status
    status = run_status(tmp_path)
    assert status.heldout_recall == asdict(heldout) and status.problems == []
    assert heldout.line() in status.render()

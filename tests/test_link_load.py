"""One :class:`hnce.EntityLinker` called from many threads, and many ``hnce link`` processes on one
exported model: every caller gets exactly the answer it gets alone (docs/link.md, "Threads and
processes").

Quick: eight threads, started together, link different mention lists through one linker whose
cluster part (Ray, the encoder pool and the index: ``open_index``) is an in-process stand-in,
slow to open and answering each mention from its text alone; the catalogue has more row groups
than it caches, so its cache evicts all the time, and Python switches threads every few
bytecodes. The index is opened once, Ray started once, and every thread's candidates (keys,
titles, texts, scores) are the single-threaded ones. Slow: three ``hnce link --json``
processes started together on a fresh run directory and a tiny export build its index version
once and print the same answers, the exact top k.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from training_helpers import (
    CONFIGS,
    assert_exact_top_k,
    exact_scores,
    small_synthetic_dataset,
    write_letter_export,
)

import hnce
from hnce.cluster.compute.retrieval import EVAL_INDEX_DIR, Retrieved
from hnce.cluster.stores.index_store import IndexStore
from hnce.cluster.stores.tables import Entity, Mention, mention_split_path
from hnce.cluster.stores.tables_read import EntityCatalogue, MentionSplit
from hnce.cluster.stores.tables_write import write_dataset
from hnce.pipeline.link import texts_mentions

REPO = Path(__file__).resolve().parents[1]
THREADS = 8
ENTITIES = 96  # in files of 4 rows: 24 row groups, 3 times what the catalogue caches
CALLS, PER_CALL = 16, 3  # each thread's calls and the mentions of each
K = 8

Answer = list[list[tuple[str, str, str, float]]]  # per mention: (key, title, text, score)


def stand_in_answer(mention: Mention, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The stand-in index's top k of ``mention``: entity ids and falling scores drawn from its
    text alone, so that a mention's answer does not depend on who else is linking."""
    draw = np.random.default_rng(zlib.crc32(mention.mention.encode()))
    ids = draw.choice(ENTITIES, size=k, replace=False)
    return ids, np.sort(draw.random(k, dtype=np.float32))[::-1]


class StandInIndex:
    """In place of :class:`~hnce.cluster.compute.retrieval.OpenIndex`: each retrieval pauses (the
    other threads run meanwhile), then answers its mentions by :func:`stand_in_answer`."""

    def retrieve(self, mentions: Sequence[Mention], k: int) -> Retrieved:
        time.sleep(0.002)
        ids, scores = zip(*(stand_in_answer(mention, k) for mention in mentions), strict=True)
        version = SimpleNamespace(version=1, path=Path("stand-in/v1"))
        return Retrieved(np.stack(ids), np.stack(scores), index_version=version, built=False)


@pytest.fixture
def stand_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> SimpleNamespace:
    """``new()``: a linker over a catalogue of :data:`ENTITIES` whose Ray and index are stand-ins;
    ``opened`` and ``started`` record each opening of the index and each start of Ray."""
    data = tmp_path / "data"
    entities = [Entity(i, f"key-{i}", f"title {i}", f"text of entity {i}") for i in range(ENTITIES)]
    write_dataset(data, entities, rows_per_file=4)
    recipe = [f"data.root={data}", f"run.dir={tmp_path / 'run'}"]
    config = hnce.load_config(CONFIGS / "synthetic-test.yaml", recipe)
    opened: list[object] = []
    started: list[float] = []

    @contextlib.contextmanager
    def open_index(plan: object, model: object) -> Iterator[StandInIndex]:
        opened.append(model)
        time.sleep(0.2)  # slow to open: every thread's first call arrives meanwhile
        yield StandInIndex()

    running: list[float] = []  # the stand-in Ray instance, while it runs

    def init_ray(cluster: object, cpus: float) -> None:
        started.append(cpus)
        running.append(cpus)

    ray = SimpleNamespace(is_initialized=lambda: bool(running), shutdown=running.clear)
    monkeypatch.setattr("hnce.pipeline.link.open_index", open_index)
    monkeypatch.setattr("hnce.pipeline.link.init_ray", init_ray)
    monkeypatch.setattr("hnce.pipeline.link.ray", ray)
    return SimpleNamespace(
        new=lambda: hnce.EntityLinker(config, model=None, name="stand-in"),
        opened=opened,
        started=started,
    )


def linked(linker: hnce.EntityLinker, calls: list[list[Mention]]) -> Answer:
    """What ``linker`` answers to each call, mention by mention."""
    return [
        [(c.key, c.title, c.text, c.score) for c in item.candidates]
        for mentions in calls
        for item in linker.link_mentions(mentions, K)
    ]


def truth(calls: list[list[Mention]]) -> Answer:
    """What a linker over the stand-in index answers to each call, mention by mention."""
    answers = []
    for mention in (mention for mentions in calls for mention in mentions):
        ids, scores = stand_in_answer(mention, K)
        answers.append(
            [
                (f"key-{i}", f"title {i}", f"text of entity {i}", float(score))
                for i, score in zip(ids, scores, strict=True)
            ]
        )
    return answers


def test_threads_sharing_one_linker_open_it_once_and_get_the_single_threaded_answers(
    stand_in: SimpleNamespace,
) -> None:
    calls = {
        thread: [
            [
                Mention(
                    f"t{thread}-{call}-{n}", "left", f"mention {thread} {call} {n}", "right", -1
                )
                for n in range(PER_CALL)
            ]
            for call in range(CALLS)
        ]
        for thread in range(THREADS)
    }
    expected = {thread: truth(thread_calls) for thread, thread_calls in calls.items()}
    with stand_in.new() as alone:  # one thread: what the stand-in index answers
        assert linked(alone, calls[0]) == expected[0]
    stand_in.opened.clear()
    stand_in.started.clear()

    shared = stand_in.new()
    barrier = threading.Barrier(THREADS)
    found: dict[int, Answer] = {}
    failures: list[BaseException] = []

    def client(thread: int) -> None:
        barrier.wait()  # every thread's first call at once, before anything is open
        try:
            found[thread] = linked(shared, calls[thread])
        except BaseException as error:  # kept for the assertion below
            failures.append(error)

    threads = [threading.Thread(target=client, args=(n,), daemon=True) for n in calls]
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # a thread switch every few bytecodes: a race shows at once
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)  # a deadlock fails the test instead of hanging it
    finally:
        sys.setswitchinterval(switch)
    assert not any(thread.is_alive() for thread in threads), "a thread is stuck"
    shared.close()
    assert failures == []
    assert (len(stand_in.opened), len(stand_in.started)) == (1, 1)
    assert found == expected


# ---------------------------------------------------------------- processes


def marked(mention: Mention) -> str:
    return f"{mention.context_left} [START_ENT] {mention.mention} [END_ENT] {mention.context_right}"


def json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines()]


@pytest.mark.slow  # each process imports torch, transformers and Ray, and starts its own Ray
def test_link_processes_started_together_build_the_version_once_and_answer_alike(
    tmp_path: Path,
) -> None:
    """Three processes on a run directory with no index: one builds the export's version into
    ``<run>/eval-index/`` (the store's lock), the others wait and find it; all three print the
    same candidates, ids and scores, for every mention, and those are the exact top k (scored
    in this process, without an index), which one process alone prints
    (tests/test_pipeline_link.py)."""
    data = small_synthetic_dataset(tmp_path / "data")
    export = write_letter_export(tmp_path / "model", "dual")
    mentions = MentionSplit.open(mention_split_path(data, "test")).read_all()
    texts = tmp_path / "texts.txt"
    texts.write_text("".join(marked(mention) + "\n" for mention in mentions))
    run_dir = tmp_path / "run"
    command = [
        sys.executable,
        "-m",
        "hnce.pipeline.cli.main",
        "link",
        *("--config", str(CONFIGS / "synthetic-test.yaml"), "--export", str(export)),
        *("--json", "-k", str(K)),
        *("--set", f"data.root={data}", "--set", f"run.dir={run_dir}"),
        *("--set", "cluster.num_cpus=1"),  # one torch thread in every process's encoder
    ]
    environment = {**os.environ, "PYTHONPATH": str(REPO)}

    def start(name: str) -> subprocess.Popen[bytes]:
        with (
            texts.open("rb") as stdin,
            (tmp_path / f"{name}.out").open("wb") as out,
            (tmp_path / f"{name}.err").open("wb") as err,
        ):
            return subprocess.Popen(
                command, cwd=REPO, env=environment, stdin=stdin, stdout=out, stderr=err
            )

    def output(name: str, process: subprocess.Popen[bytes]) -> list[dict[str, Any]]:
        status = process.wait(timeout=300)
        assert status == 0, (tmp_path / f"{name}.err").read_text()
        return json_lines((tmp_path / f"{name}.out").read_text())

    together = {f"together-{n}": start(f"together-{n}") for n in range(3)}
    first, *others = [output(name, process) for name, process in together.items()]
    assert IndexStore(run_dir / EVAL_INDEX_DIR).versions() == [1]
    IndexStore(run_dir / EVAL_INDEX_DIR).open(1)  # its manifest and shard layout verified
    assert [line["id"] for line in first] == [
        f"stdin line {n}#1" for n in range(1, len(mentions) + 1)
    ]
    assert all(answer == first for answer in others)
    linked = texts_mentions(texts.read_text().splitlines(), [line["id"] for line in first])
    truth = exact_scores(export, data, linked)
    keys = [c["key"] for line in first for c in line["candidates"]]
    ids = EntityCatalogue.open(data).ids_for_keys(keys).reshape(len(first), K)
    assert_exact_top_k(ids, truth)
    scores = [[c["score"] for c in line["candidates"]] for line in first]
    np.testing.assert_allclose(scores, np.take_along_axis(truth, ids, axis=1), rtol=0, atol=1e-4)

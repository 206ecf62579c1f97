"""Shared test helpers: tiny WordPiece tokenizers and BERT configs built offline in temp dirs,
JSON-lines input files, and a free local port.

Test modules import the functions (`from conftest import tiny_bert_config`); pytest puts
`tests/` on the path.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import string
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

import faiss
import pytest
import torch
from transformers import BertConfig, BertModel, BertTokenizerFast

# Nodes may take longer than Ray's 60 s to register on a loaded 2-core machine. Set before any
# Ray instance starts, so every instance and its workers inherit it.
os.environ.setdefault("RAY_raylet_start_wait_time_s", "600")
if os.environ.get("PYTEST_XDIST_WORKER"):
    # Two test processes share the cores: one torch thread and one FAISS (OpenMP) thread each,
    # or their thread pools fight (beside two busy processes, an in-process DeepSpeed test took
    # 10.9 s with torch's two threads, 1.9 s with one).
    torch.set_num_threads(1)
    faiss.omp_set_num_threads(1)
#: the torch threads every test starts with (restored after each: ``torch_cpu_state_as_found``)
_TORCH_THREADS = torch.get_num_threads()

# BERT's special tokens plus BLINK's mention / title markers (docs/input-formats.md).
SPECIAL_TOKENS = (
    "[PAD]",
    "[unused0]",
    "[unused1]",
    "[unused2]",
    "[UNK]",
    "[CLS]",
    "[SEP]",
    "[MASK]",
)

TINY_WORDS = (
    "the",
    "capital",
    "of",
    "france",
    "is",
    "paris",
    "a",
    "city",
    "on",
    "river",
    "seine",
    "big",
)

#: the lower-case letters and their word-piece continuations: every lower-case word tokenizes
LETTER_PIECES = (*string.ascii_lowercase, *(f"##{c}" for c in string.ascii_lowercase))


def write_jsonl(path: Path, rows: Iterable[object], extra: str | None = None) -> Path:
    """``rows`` as JSON lines (UTF-8, non-ASCII kept as is), then ``extra`` as it is (a raw
    line, e.g. a malformed one), in ``path`` (its directories made); returns ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps(row, ensure_ascii=False) for row in rows]
    if extra is not None:
        lines.append(extra)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def free_port() -> int:
    """A TCP port of 127.0.0.1 that was free a moment ago (bound to port 0, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def write_wordpiece_tokenizer(directory: Path, tokens: Iterable[str]) -> BertTokenizerFast:
    """A tokenizer whose vocab is the special tokens then ``tokens`` (deduplicated, in order),
    written to ``directory/vocab.txt`` and saved there with ``save_pretrained``."""
    vocab = list(dict.fromkeys([*SPECIAL_TOKENS, *tokens]))
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "vocab.txt").write_text("\n".join(vocab) + "\n")
    # transformers 5 ignores vocab_file=; vocab= takes the file.
    tokenizer = BertTokenizerFast(vocab=str(directory / "vocab.txt"))
    tokenizer.save_pretrained(directory)
    return tokenizer


def tiny_bert_config(vocab_size: int, hidden_size: int = 32) -> BertConfig:
    """A 2-layer, 32-wide (unless ``hidden_size``) BERT: milliseconds per batch on a CPU."""
    return BertConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
    )


def write_letter_bert(directory: Path) -> Path:
    """A tiny random BERT whose WordPiece vocabulary is the letters (every lower-case word
    tokenizes), saved in ``directory`` like a Hugging Face model: a ``model.path`` for training."""
    tokenizer = write_wordpiece_tokenizer(directory, [".", ",", *LETTER_PIECES])
    torch.manual_seed(0)
    BertModel(tiny_bert_config(len(tokenizer))).save_pretrained(directory)
    return directory


@pytest.fixture(scope="session")
def tiny_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> BertTokenizerFast:
    """Special tokens, '.', and a dozen words: enough to hand-check BLINK input ids."""
    return write_wordpiece_tokenizer(tmp_path_factory.mktemp("vocab"), [".", *TINY_WORDS])


@pytest.fixture(scope="session")
def small_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three synthetic worlds of 30 entities, 2 mentions each: train, dev, test a world apiece."""
    from training_helpers import small_synthetic_dataset

    return small_synthetic_dataset(tmp_path_factory.mktemp("synthetic"))


@pytest.fixture(scope="session")
def syllable_bert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny BERT directory whose vocabulary reads the synthetic data (training_helpers)."""
    from training_helpers import write_syllable_bert

    return write_syllable_bert(tmp_path_factory.mktemp("syllable-bert"))


@pytest.fixture(scope="session")
def real_wordnet(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """Debian's WordNet converted once for the session: (dataset root, conversion summary)."""
    from hnce.pipeline.data.wordnet import convert_wordnet

    root = tmp_path_factory.mktemp("real-wordnet") / "wordnet"
    return root, convert_wordnet(root)


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory: pytest.TempPathFactory, ray_session: str):
    """One trained run for the whole test session (``training_helpers.build_trained_run``),
    shared by both pytest processes: the first to ask builds it in their common temp directory
    under a file lock, the other waits for it. Its tests only read it: whatever they write goes
    to their own directories (a test that needs to change a run trains its own)."""
    from filelock import FileLock
    from training_helpers import TrainedRun, build_trained_run

    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent  # the directory both processes' temp directories are made in
    root, built = shared / "trained-run", shared / "trained-run.built"
    with FileLock(shared / "trained-run.lock"):
        if not built.is_file():
            shutil.rmtree(root, ignore_errors=True)
            build_trained_run(root)
            built.touch()
    return TrainedRun(root / "run", root / "data", root / "model")


#: logical CPUs of the session's Ray instance: two trainer workers and two encoder actors fit,
#: five one-CPU encoders do not (test_cluster_refresh counts on exactly this many)
SESSION_RAY_CPUS = 4
_session_ray: dict[str, str] = {}


@pytest.fixture(scope="session")
def ray_session() -> Iterator[str]:
    """One local Ray instance for every test that runs hnce in this process, started the way
    ``hnce`` starts one (``init_ray``: hnce's worker environment), as the commands of one process
    share theirs; yields its GCS address for child processes that join it. Starting an instance
    per module cost ~5 s each on 2 cores."""
    import ray

    from hnce.cluster.compute.session import ClusterSettings, init_ray

    init_ray(ClusterSettings(num_cpus=SESSION_RAY_CPUS))
    _session_ray["address"] = ray.get_runtime_context().gcs_address
    yield _session_ray["address"]
    _session_ray.clear()
    ray.shutdown()


@pytest.fixture(autouse=True, scope="module")
def ray_left_as_found() -> Iterator[None]:
    """After each module: the session instance has every CPU free again (a module that leaves
    an actor or a placement group behind fails here, not in a later module that cannot place
    its own), and any other instance a module started is shut down."""
    yield
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return
    if ray.get_runtime_context().gcs_address != _session_ray.get("address"):
        ray.shutdown()
        return
    deadline = time.monotonic() + 30
    while ray.available_resources().get("CPU", 0) < SESSION_RAY_CPUS:
        assert time.monotonic() < deadline, f"CPUs still held: {ray.available_resources()}"
        time.sleep(0.2)


@pytest.fixture(autouse=True)
def torch_cpu_state_as_found() -> Iterator[None]:
    """After each test: torch's thread count as the process started with, and subnormal floats kept again, as
    in a fresh process. A trainer worker built in the test process sets both for its steps
    (``TrainerThreads.for_step``, ``flush_subnormal_floats``), process-wide settings that would
    otherwise reach every later test of the process: two threads in each of two test
    processes fight over the cores, and hypothesis refuses to draw floats without subnormals
    (a CI run failed so)."""
    yield
    torch.set_num_threads(_TORCH_THREADS)
    torch.set_flush_denormal(False)


@pytest.fixture(scope="session", autouse=True)
def no_progress_output() -> Iterator[None]:
    """Tests show no progress bars, as ``hnce --no-progress`` would."""
    from hnce.progress import quiet

    with quiet():
        yield


@pytest.fixture
def hf_modules_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """transformers copies a model's own module file (``trust_remote_code``: the mention window
    of a sentence-transformers export) into its modules cache before importing it: each test
    gets its own, not the home's (shared by parallel workers)."""
    from transformers import dynamic_module_utils

    monkeypatch.setattr(dynamic_module_utils, "HF_MODULES_CACHE", str(tmp_path / "hf-modules"))
    monkeypatch.setattr(sys, "path", list(sys.path))  # init_hf_modules appends the cache

"""Past the Ray boundary: the store files a worker or a shard holder reads, damaged as a hostile
user would, and the contract their one reader keeps.

tests/boundary.py runs each command up to the point where Ray would start; what a worker reads
when it resumes (a checkpoint's negative cache rows), what a shard holder loads (an index
version's codes and ids) and the refresh log the payoff trigger follows are read beyond it. Here
each is read by the reader those processes call, on a small workspace written by the code that
writes it in use. One example is (case, damage, seed): the damage is ``bytes`` (one of
tests/boundary.py's, re-signed half the time) or one of the case's named damages, each a defect
a checksum cannot catch (the file's checksums are re-signed); the seed draws the file, where and
how. Shared by tests/test_store_contents_boundary.py and benchmarks/boundary_fuzz.py.

The contract: the reader refuses the file with an ``InputError`` of one line naming it, or what
it read is usable (finite vectors in the cache, an index that searches, a log whose every line
is read as a valid record or named as a damaged one).
"""

from __future__ import annotations

import dataclasses
import io
import json
import math
import random
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from boundary import damage, resign
from safetensors.torch import load, save
from store_helpers import index_parameters, write_checkpoint

from hnce.cluster.compute.entity_encoding import compress_tokens
from hnce.cluster.compute.refresh.timing import RefreshTiming
from hnce.cluster.stores.checkpoint_cache import read_cache_rows, write_cache_rows
from hnce.cluster.stores.checkpoints import checkpoint_dir, mark_complete, verify_checkpoint
from hnce.cluster.stores.faiss_index import train_index
from hnce.cluster.stores.index_spec import IndexSpec
from hnce.cluster.stores.index_store import IndexStore
from hnce.cluster.stores.refresh_log import LOG_FILE, RefreshRecord, append_record, read_log
from hnce.errors import InputError
from hnce.mining.negative_cache import CachedRows, NegativeCache

#: the checkpoint that keeps cache rows, and the cache they belong to (rows, vectors, width)
STEP = 3
CACHE_SHAPE = (12, 2, 8)
#: the plaid version's tokens: entities x tokens each, of width DIM, in two shards
ENTITIES, TOKENS, DIM = 64, 8, 16
PLAID = IndexSpec(kind="plaid", nlist=16, pq_m=4, nprobe=4)


def build_reader_workspace(root: Path) -> Path:
    """A run with a checkpoint keeping negative cache rows, a plaid index version of two shards
    and a refresh log, each written by the code that writes it in use."""
    run = root / "run"
    directory = write_checkpoint(run, STEP, deepspeed_state=True, complete=False)
    rng = torch.Generator().manual_seed(0)
    rows = torch.tensor([1, 4, 5, 9, 11])
    vectors = torch.randn(len(rows), *CACHE_SHAPE[1:], generator=rng)
    write_cache_rows(directory, CachedRows(rows, vectors, torch.tensor([0, 1, 2, 3, 3])), 0)
    mark_complete(directory, {"step": STEP})
    _plaid_version(IndexStore(run / "index"))
    for seconds, start in ((60.0, 5.0), (40.0, 0.0)):
        record = RefreshRecord("published", "training coordinator", 1.0e9, seconds, checkpoint=1)
        record.start_seconds = start
        append_record(run, record)
    append_record(run, RefreshRecord("failed", "hnce refresh", 1.0e9, 2.0, message="x"))
    return root


def _plaid_version(store: IndexStore) -> None:
    """A plaid version of ENTITIES entities, TOKENS token vectors each, in two shards."""
    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((ENTITIES * TOKENS, DIM)).astype("float32")
    ids = np.repeat(np.arange(ENTITIES), TOKENS)
    trained = train_index(vectors, PLAID)
    parameters = dataclasses.replace(
        index_parameters(1, ENTITIES),
        scorer={"name": "som"},
        dim=DIM,
        vectors_per_entity=None,
        index={**PLAID.to_json(), "shard_size": ENTITIES // 2},
    )
    builder = store.begin(parameters)
    for number, start in enumerate((0, ENTITIES // 2)):
        rows = (ids >= start) & (ids < start + ENTITIES // 2)
        built = compress_tokens(trained, [(vectors[rows], ids[rows], 0)], PLAID)
        entities = (start, start + ENTITIES // 2)
        builder.add_shard(number, built.index, built.ids, entities, built.codes)
    builder.publish(2)


# ---------------------------------------------------------------- the readers


def read_cache(run: Path) -> str | None:
    """What a resumed worker does: verify the checkpoint, read its rows, restore its cache."""
    directory = checkpoint_dir(run, STEP)
    verify_checkpoint(directory)
    kept = read_cache_rows(directory, CACHE_SHAPE, STEP)
    assert kept is not None, "the rows the checkpoint kept were read as none"
    cache = NegativeCache(*CACHE_SHAPE)
    cache.restore(kept)
    assert torch.isfinite(cache.vectors).all(), "the cache took rows that are not finite"
    return None


def read_shards(run: Path) -> str | None:
    """What a shard holder does: load the live version's shards; then search them."""
    version = IndexStore(run / "index").current()
    assert version is not None
    held = version.load(candidate_depth=64)
    queries = np.random.default_rng(1).standard_normal((2, 3, DIM)).astype("float32")
    ids, scores = held.search(queries, 5)
    found = ids >= 0
    assert np.isfinite(scores[found]).all(), "the index scored with values that are not finite"
    return None


def read_refresh_log(run: Path) -> str | None:
    """What the payoff trigger does (:class:`RefreshTiming`), and the reader it calls: every
    complete line is a valid record or named as a damaged one (the first is returned: a log
    reader names a line and goes on), and a refresh's cost is a finite, non-negative number of
    seconds."""
    problems: list[str] = []
    log = read_log(run, problems=problems)
    for record in log.records:
        assert math.isfinite(record.seconds) and 0 <= record.start_seconds <= record.seconds
    path = run / LOG_FILE
    data = path.read_bytes() if path.is_file() else b""
    complete = data[: data.rfind(b"\n") + 1].split(b"\n")[:-1]
    lines = sum(1 for line in complete if line.strip())
    assert len(log.records) + len(log.heldout) + len(problems) == lines, problems
    assert all(problem.startswith(f"{path}:") for problem in problems), problems
    timing = RefreshTiming(run)
    timing.read_log()
    cost = timing.refresh_seconds
    assert cost is None or (math.isfinite(cost) and cost >= 0), f"a refresh costs {cost} s"
    return problems[0] if problems else None


# ---------------------------------------------------------------- named damages


Damage = Callable[[bytes, random.Random], bytes]


def _cache_damage(change: Callable[[dict[str, torch.Tensor]], None]) -> Damage:
    def apply(data: bytes, rng: random.Random) -> bytes:
        tensors = load(data)
        change(tensors)
        return save(tensors)

    return apply


def _set(name: str, at: tuple[int, ...], value: float) -> Callable[[dict], None]:
    def change(tensors: dict[str, torch.Tensor]) -> None:
        tensors[name][at] = value

    return change


def _replace(
    name: str, make: Callable[[torch.Tensor], torch.Tensor | None]
) -> Callable[[dict], None]:
    def change(tensors: dict[str, torch.Tensor]) -> None:
        replaced = make(tensors[name])
        if replaced is None:
            del tensors[name]
        else:
            tensors[name] = replaced.contiguous()

    return change


def _array_damage(change: Callable[[np.ndarray, random.Random], np.ndarray]) -> Damage:
    def apply(data: bytes, rng: random.Random) -> bytes:
        codes = np.load(io.BytesIO(data), allow_pickle=False)
        out = io.BytesIO()
        np.save(out, change(codes.copy(), rng), allow_pickle=False)
        return out.getvalue()

    return apply


def _past_nlist(codes: np.ndarray, rng: random.Random) -> np.ndarray:
    codes[rng.randrange(len(codes)), 0] = 255  # the centroid id's one byte (nlist <= 256)
    return codes


def _random_codes(codes: np.ndarray, rng: random.Random) -> np.ndarray:
    return np.frombuffer(rng.randbytes(codes.size), dtype=np.uint8).reshape(codes.shape)


def _log_line(change: Callable[[dict], None]) -> Damage:
    def apply(data: bytes, rng: random.Random) -> bytes:
        lines = data.decode().splitlines(keepends=True)
        at = rng.randrange(len(lines))
        record = json.loads(lines[at])
        change(record)
        lines[at] = json.dumps(record) + "\n"  # Infinity where a value is infinite
        return "".join(lines).encode()

    return apply


def _set_fields(**fields: float) -> Callable[[dict], None]:
    return lambda record: record.update(fields)


@dataclass(frozen=True)
class ReaderCase:
    """A file kind beyond the Ray boundary: the files an example damages (globs under the
    workspace), the reader's side of the contract, and the named damages of its content, each
    with the files it applies to."""

    targets: tuple[str, ...]
    read: Callable[[Path], str | None]
    damages: dict[str, tuple[str, Damage]]

    def files(self, damage_name: str) -> tuple[str, ...]:
        """What an example of ``damage_name`` may damage."""
        return self.targets if damage_name == "bytes" else self.damages[damage_name][:1]


CACHE_ROWS = "run/checkpoints/step-3/deepspeed/negative_cache.safetensors"
CODES, IDS = "run/index/v1/shard-*.codes.npy", "run/index/v1/shard-*.ids.npy"
REFRESH_LOG = f"run/{LOG_FILE}"
READER_CASES: dict[str, ReaderCase] = {
    "resume: negative cache rows": ReaderCase(
        (CACHE_ROWS,),
        read_cache,
        {
            name: (CACHE_ROWS, damage)
            for name, damage in {
                "truncated": lambda data, rng: data[: rng.randrange(len(data))],
                "random bytes": lambda data, rng: rng.randbytes(len(data)),
                "vectors of half the width": _cache_damage(
                    _replace("vectors", lambda t: t[:, :, : t.shape[2] // 2])
                ),
                "one vector fewer than rows": _cache_damage(_replace("vectors", lambda t: t[:-1])),
                "a row past the catalogue": _cache_damage(_set("rows", (2,), CACHE_SHAPE[0] + 5)),
                "a row kept twice": _cache_damage(_set("rows", (1,), 1)),
                "no written_at": _cache_damage(_replace("written_at", lambda t: None)),
                "a step after the checkpoint": _cache_damage(_set("written_at", (0,), STEP + 1)),
                "a row of NaN": _cache_damage(_set("vectors", (3,), float("nan"))),
                "a vector of +inf": _cache_damage(_set("vectors", (0, 1, 2), float("inf"))),
            }.items()
        },
    ),
    "shard load: plaid codes and ids": ReaderCase(
        (CODES, IDS),
        read_shards,
        {
            "centroid ids past nlist": (CODES, _array_damage(_past_nlist)),
            "random bytes of the right shape": (CODES, _array_damage(_random_codes)),
            "codes one row short": (CODES, _array_damage(lambda array, rng: array[:-1])),
            "ids one row short": (IDS, _array_damage(lambda array, rng: array[:-1])),
            "an emptied ids file": (IDS, lambda data, rng: b""),
            "a header bracket left open": (
                CODES,
                lambda data, rng: data.replace(b"'shape': (", b"'shape': ((", 1),
            ),
        },
    ),
    "payoff: refresh log": ReaderCase(
        (REFRESH_LOG,),
        read_refresh_log,
        {
            "negative seconds": (REFRESH_LOG, _log_line(_set_fields(seconds=-50.0))),
            "infinite seconds": (REFRESH_LOG, _log_line(_set_fields(seconds=float("inf")))),
            "pool start past its seconds": (
                REFRESH_LOG,
                _log_line(_set_fields(seconds=1.0, start_seconds=9.0)),
            ),
        },
    ),
}
#: (case, damage) of every named damage: each must be refused, naming the file
NAMED = [(case, name) for case, spec in sorted(READER_CASES.items()) for name in spec.damages]


@dataclass
class ReaderOutcome:
    """What one example did: the damage, the file damaged, what the reader said when it
    refused it (an error's message, or the first line a log reader named), and an exception
    that broke the contract."""

    damage: str
    target: Path
    said: str | None
    error: BaseException | None = None

    def broken(self) -> str | None:
        """Why the outcome breaks the contract (module docs), or None."""
        if self.error is not None:
            return f"raised {type(self.error).__name__}: {self.error}"
        if self.said is not None and self.target.name not in self.said:
            return f"the error does not name {self.target.name}: {self.said}"
        if self.said is not None and "\n" in self.said:
            return f"the error is not one line: {self.said!r}"
        return None


def run_reader_example(
    template: Path, scratch: Path, case_name: str, damage_name: str, seed: int
) -> ReaderOutcome:
    """Copy the workspace ``template`` into ``scratch``, damage one of the case's files (the
    named damage, re-signed; or ``bytes``, re-signed half the time) as ``seed`` draws, and read
    it as the worker or holder does."""
    case = READER_CASES[case_name]
    if scratch.exists():
        shutil.rmtree(scratch)
    shutil.copytree(template, scratch)
    rng = random.Random(seed)
    targets = sorted({p for pattern in case.files(damage_name) for p in scratch.glob(pattern)})
    target = rng.choice(targets)
    original = target.read_bytes()
    if damage_name == "bytes":
        what, damaged = damage(original, rng)
        what, signed = f"bytes, {what}", rng.random() < 0.5
    else:
        what, damaged, signed = damage_name, case.damages[damage_name][1](original, rng), True
    target.write_bytes(damaged)
    if signed and resign(scratch, original, damaged):
        what += " (re-signed)"
    described = f"{target.relative_to(scratch)}: {what}"
    try:
        said = case.read(scratch / "run")
    except InputError as error:
        return ReaderOutcome(described, target, str(error))
    except Exception as error:  # a crash, or content read that cannot be used: what is looked for
        return ReaderOutcome(described, target, None, error)
    return ReaderOutcome(described, target, said)

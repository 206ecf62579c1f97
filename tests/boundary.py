"""The command-line boundary under hostile input: a workspace of real artifacts, the commands that
read them, the ways an input goes wrong, and the contract every run must keep.

Shared by the bounded property test (tests/test_boundary.py) and its full run
(benchmarks/boundary_fuzz.py). One example is (case, seed): the case names a command and the
files it reads; the seed draws which file, which damage and whether its checksums are re-signed,
so ``check_example(case, seed)`` replays any example exactly.

The contract (docs/failures.md): the command ends with exit 0, 2 or 74, or reaches the point
where Ray would start (what it reads before then is the boundary under test; Ray itself is
replaced by a sentinel, so an example costs milliseconds to seconds); a failure is one line on
stderr beginning ``hnce`` (its last; log lines
begin with their time) and no traceback; and nothing outside the command's outputs changes.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import random
import shutil
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import ray
import yaml
from conftest import write_jsonl
from hypothesis import HealthCheck, settings
from store_helpers import mined_split, publish_index, random_word_dataset, write_checkpoint
from training_helpers import CONFIGS, write_letter_export

from hnce.cluster.stores.index_store import IndexStore
from hnce.cluster.stores.negatives_store import NegativesStore
from hnce.cluster.stores.refresh_log import RefreshRecord, append_record
from hnce.events import RunEvent
from hnce.pipeline.cli.main import main
from hnce.pipeline.event_log import EventLog

WORKSPACE_MARK = "@WORKSPACE@"
EXIT_CODES = (0, 2, 74)


class RayWouldStart(Exception):
    """Raised where a command would start Ray: everything before it was read and checked."""


@dataclass(frozen=True)
class Case:
    """A command (``argv``, ``@WORKSPACE@`` standing for the workspace), the files it reads that
    an example may damage (globs under the workspace), the file given as its stdin and the paths
    it may write (its outputs)."""

    argv: tuple[str, ...]
    targets: tuple[str, ...]
    stdin: str | None = None
    outputs: tuple[str, ...] = ()


RECIPE = ("--config", "@WORKSPACE@/recipe.yaml")
CASES: dict[str, Case] = {
    "data kilt": Case(
        (
            "data",
            "kilt",
            "--knowledge-source",
            "@WORKSPACE@/kilt/kilt_knowledgesource.json",
            "--aida",
            "@WORKSPACE@/kilt/aidayago2-train-kilt.jsonl",
            "--out",
            "@WORKSPACE@/out",
        ),
        ("kilt/*.json", "kilt/*.jsonl"),
        outputs=("out",),
    ),
    "data verify": Case(
        ("data", "verify", "@WORKSPACE@/data"), ("data/manifest.json", "data/**/*.parquet")
    ),
    "link (stdin)": Case(
        ("link", *RECIPE, "--export", "@WORKSPACE@/export", "--json"),
        (
            "text.txt",
            "recipe.yaml",
            "data/**/*.parquet",
            "data/manifest.json",
            "export/scorer.json",
            "export/*/model.safetensors",
            "export/*/config.json",
            "export/*/tokenizer.json",
        ),
        stdin="text.txt",
        outputs=("run/eval-index",),
    ),
    "link (blink file)": Case(
        ("link", *RECIPE, "--blink", "@WORKSPACE@/mentions.jsonl", "--checkpoint", "newest"),
        (
            "mentions.jsonl",
            "run/checkpoints/step-1/COMPLETE",
            "run/checkpoints/step-1/training_state.json",
            "run/checkpoints/step-1/export/scorer.json",
            "run/checkpoints/step-1/export/*/model.safetensors",
        ),
        outputs=("run/eval-index",),
    ),
    "eval": Case(
        ("eval", *RECIPE, "--checkpoint", "newest", "--out", "@WORKSPACE@/report.json"),
        (
            "recipe.yaml",
            "data/**/*.parquet",
            "data/manifest.json",
            "run/checkpoints/step-1/COMPLETE",
            "run/checkpoints/step-1/export/scorer.json",
            "run/checkpoints/step-1/export/*/model.safetensors",
        ),
        outputs=("report.json", "run/eval-index"),
    ),
    "plan": Case(("plan", *RECIPE, "--json"), ("recipe.yaml", "export/mention/config.json")),
    "refresh": Case(
        ("refresh", *RECIPE),
        (
            "recipe.yaml",
            "data/**/*.parquet",
            "run/checkpoints/step-1/COMPLETE",
            "run/checkpoints/step-1/training_state.json",
            "run/index/CURRENT",
            "run/index/v*/manifest.json",
            "run/negatives/CURRENT",
            "run/refresh_log.jsonl",
        ),
        outputs=(
            "run/index",
            "run/negatives",
            "run/refresh_log.jsonl",
            "run/refresh.lock",
            "run/refresh.lock.json",
        ),
    ),
    "status": Case(
        ("status", "@WORKSPACE@/run", "--json"),
        (
            "run/index/CURRENT",
            "run/index/v*/manifest.json",
            "run/negatives/CURRENT",
            "run/negatives/v*/manifest.json",
            "run/refresh_log.jsonl",
            "run/events.jsonl",
            "run/config.yaml",
            "run/checkpoints/step-1/COMPLETE",
            "run/checkpoints/step-1/training_state.json",
        ),
    ),
    "export": Case(
        ("export", "@WORKSPACE@/run", "--out", "@WORKSPACE@/st"),
        (
            "run/config.yaml",
            "data/manifest.json",
            "run/index/v*/manifest.json",
            "run/checkpoints/step-1/COMPLETE",
            "run/checkpoints/step-1/training_state.json",
            "run/checkpoints/step-1/export/scorer.json",
            "run/checkpoints/step-1/export/*/model.safetensors",
            "run/checkpoints/step-1/export/*/config.json",
        ),
        outputs=("st", "run/eval-index"),
    ),
    "export (towers)": Case(
        ("export", "@WORKSPACE@/run", "--no-index", "--out", "@WORKSPACE@/st"),
        (
            "run/checkpoints/step-1/COMPLETE",
            "run/checkpoints/step-1/training_state.json",
            "run/checkpoints/step-1/export/scorer.json",
            "run/checkpoints/step-1/export/*/model.safetensors",
            "run/checkpoints/step-1/export/*/config.json",
        ),
        outputs=("st",),
    ),
}


def build_workspace(root: Path) -> Path:
    """Real artifacts, each written by the code that writes it in use: a KILT knowledge source
    and AIDA file, a dataset, an export, and a run with a checkpoint, an index version, a
    negatives version, a refresh log and an event log."""
    pages = [
        {"wikipedia_id": str(n), "wikipedia_title": f"Page {n}", "text": [f"Page {n}\n", "x y"]}
        for n in range(4)
    ]
    write_jsonl(root / "kilt" / "kilt_knowledgesource.json", pages)
    aida = [
        {
            "id": f"q{n}",
            "input": f"a [START_ENT] Page {n} [END_ENT] b",
            "output": [{"answer": f"Page {n}", "provenance": [{"wikipedia_id": str(n)}]}],
        }
        for n in range(4)
    ]
    write_jsonl(root / "kilt" / "aidayago2-train-kilt.jsonl", aida)
    random_word_dataset(root / "data")
    export = write_letter_export(root / "letters", "dual")
    shutil.copytree(export, root / "export")
    run = root / "run"
    write_checkpoint(run, 1, export)
    publish_index(
        IndexStore(run / "index"), 1, np.random.default_rng(0).random((48, 16), "float32")
    )
    NegativesStore(run / "negatives").publish(
        1, {"train": mined_split()}, checkpoint_step=1, top_n=3, num_entities=48
    )
    append_record(
        run, RefreshRecord(outcome="published", role="hnce refresh", started=1.0e9, checkpoint=1)
    )
    EventLog(run).write(RunEvent.STEP, step=1, loss=0.5)
    recipe = yaml.safe_load((CONFIGS / "synthetic-test.yaml").read_text())
    recipe["run"]["dir"] = f"{WORKSPACE_MARK}/run"
    recipe["data"].update(root=f"{WORKSPACE_MARK}/data", eval_split="train")
    recipe["model"]["path"] = f"{WORKSPACE_MARK}/export/mention"
    for path in (root / "recipe.yaml", run / "config.yaml"):
        path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    (root / "text.txt").write_text(
        "the [START_ENT] city [END_ENT] of light\nan [START_ENT] x [END_ENT]\n"
    )
    write_jsonl(
        root / "mentions.jsonl", [{"context_left": "a", "mention": "b", "context_right": "c"}]
    )
    return root


# ---------------------------------------------------------------- damage


HOSTILE_JSON = [float("nan"), float("inf"), -float("inf"), "x", None, [], {}, True, 10**30, -1, ""]
HOSTILE_YAML = [".nan", "-.inf", "[]", "{", "'x'", "1e309", "~", "-1", "0", '"\\ud800"', "|"]
HUGE_BYTES = 1 << 20


def damage(data: bytes, rng: random.Random) -> tuple[str, bytes]:
    """One kind of damage to a file's bytes, drawn by ``rng``: (its name, the damaged bytes)."""
    kind = rng.choice(["truncate", "flip", "not utf-8", "empty", "huge", "wrong value"])
    at = rng.randrange(len(data) + 1)
    if kind == "truncate":
        return f"truncated at {at}", data[:at]
    if kind == "flip" and data:
        at = min(at, len(data) - 1)
        mask = rng.randrange(1, 256)
        return f"byte {at} ^ {mask:#x}", data[:at] + bytes([data[at] ^ mask]) + data[at + 1 :]
    if kind == "not utf-8":
        bad = rng.choice([b"\xff", b"\xc3(", b"\xed\xa0\x80", b"\x80"])
        return f"{bad!r} at {at}", data[:at] + bad + data[at:]
    if kind == "huge":
        return "a 1 MiB line appended", data + b"a" * HUGE_BYTES + b"\n"
    if kind == "wrong value":
        changed = _wrong_value(data, rng)
        if changed is not None:
            return changed
    return "emptied", b""


def _wrong_value(data: bytes, rng: random.Random) -> tuple[str, bytes] | None:
    """A JSON document, a JSON line or a ``key: value`` YAML line with one value replaced by a
    hostile one; None for bytes that are none of these."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    lines = text.splitlines(keepends=True)
    try:
        return _replace_json_leaf(json.loads(text), rng, lambda doc: doc)
    except ValueError:
        pass
    numbered = [n for n, line in enumerate(lines) if line.lstrip().startswith("{")]
    if numbered:
        n = rng.choice(numbered)
        try:
            record = json.loads(lines[n])
        except ValueError:
            return None

        def put_back(doc: str) -> str:
            return "".join(lines[:n]) + doc + "\n" + "".join(lines[n + 1 :])

        return _replace_json_leaf(record, rng, put_back, f"line {n + 1}: ")
    keyed = [
        n for n, line in enumerate(lines) if ": " in line and not line.lstrip().startswith("#")
    ]
    if not keyed:
        return None
    n = rng.choice(keyed)
    key = lines[n].split(": ", 1)[0]
    value = rng.choice(HOSTILE_YAML)
    return f"line {n + 1}: {value}", "".join(
        [*lines[:n], f"{key}: {value}\n", *lines[n + 1 :]]
    ).encode()


def _replace_json_leaf(
    document: object, rng: random.Random, place: Callable[[str], str], where: str = ""
) -> tuple[str, bytes]:
    """``document`` with one of its values (or itself) replaced by a hostile JSON value."""
    paths = list(_json_paths(document, ()))
    path = rng.choice(paths)
    value = rng.choice(HOSTILE_JSON)
    if not path:
        document = value
    else:
        parent = document
        for step in path[:-1]:
            parent = parent[step]  # type: ignore[index]
        parent[path[-1]] = value  # type: ignore[index]
    text = json.dumps(document, allow_nan=True)
    return f"{where}{'/'.join(map(str, path))} = {value!r}", place(text).encode()


def _json_paths(value: object, path: tuple) -> Iterator[tuple]:
    yield path
    if isinstance(value, dict):
        for key, inner in value.items():
            yield from _json_paths(inner, (*path, key))
    elif isinstance(value, list):
        for index, inner in enumerate(value):
            yield from _json_paths(inner, (*path, index))


def resign(workspace: Path, old: bytes, new: bytes) -> int:
    """Replace the SHA-256 of ``old`` by that of ``new`` in every manifest of the workspace that
    records it, as someone who edits a file and fixes its checksum would: the files' own
    content checks, not the checksums, must then catch the damage. Returns manifests changed."""
    before, after = hashlib.sha256(old).hexdigest(), hashlib.sha256(new).hexdigest()
    changed = 0
    for path in workspace.rglob("*"):
        if path.is_file() and path.stat().st_size < HUGE_BYTES and path.suffix != ".parquet":
            text = path.read_bytes()
            if before.encode() in text:
                path.write_bytes(text.replace(before.encode(), after.encode()))
                changed += 1
    return changed


# ---------------------------------------------------------------- one example


@dataclass
class Outcome:
    """What one example did: the damage, the exit status (None: it reached Ray), stderr, and the
    files outside its outputs that changed."""

    damage: str
    status: int | None
    stderr: str
    changed: list[str]
    error: BaseException | None = None

    def broken(self) -> str | None:
        """Why the outcome breaks the contract (module docstring), or None."""
        if self.error is not None:
            return f"raised {type(self.error).__name__}: {self.error}"
        if self.status is not None and self.status not in EXIT_CODES:
            return f"exit {self.status}"
        if "Traceback" in self.stderr:
            return "a traceback on stderr"
        lines = self.stderr.strip().splitlines()  # log lines begin with their time
        said = [line for line in lines if line.startswith("hnce")]
        if self.status not in (None, 0) and (len(said) != 1 or lines[-1] != said[0]):
            return f"the error is not one last line beginning 'hnce': {said!r}"
        if self.changed:
            return f"changed outside its outputs: {self.changed}"
        return None


def run_example(template: Path, scratch: Path, case_name: str, seed: int | None) -> Outcome:
    """Copy the workspace ``template`` into ``scratch``, damage one of the case's files as
    ``seed`` draws (None: none), run the command in this process and observe it."""
    case = CASES[case_name]
    if scratch.exists():
        shutil.rmtree(scratch)
    shutil.copytree(template, scratch)
    for path in scratch.rglob("*.yaml"):
        path.write_text(path.read_text().replace(WORKSPACE_MARK, str(scratch)))
    what = "undamaged" if seed is None else _damage_one(scratch, case, random.Random(seed))
    before = _snapshot(scratch, case.outputs)
    argv = [arg.replace(WORKSPACE_MARK, str(scratch)) for arg in case.argv]
    stdin = (scratch / case.stdin).read_bytes() if case.stdin else b""
    status, stderr, error = _run(argv, stdin)
    after = _snapshot(scratch, case.outputs)
    changed = sorted(
        name for name in before.keys() | after.keys() if before.get(name) != after.get(name)
    )
    return Outcome(what, status, stderr, changed, error)


def _damage_one(scratch: Path, case: Case, rng: random.Random) -> str:
    """Damage one file the case reads, re-signing it half the time; says what was done."""
    targets = sorted({p for pattern in case.targets for p in scratch.glob(pattern) if p.is_file()})
    target = rng.choice(targets)
    original = target.read_bytes()
    what, damaged = damage(original, rng)
    target.write_bytes(damaged)
    signed = resign(scratch, original, damaged) if rng.random() < 0.5 else 0
    return f"{target.relative_to(scratch)}: {what}" + (" (re-signed)" if signed else "")


def _run(argv: list[str], stdin: bytes) -> tuple[int | None, str, BaseException | None]:
    """``hnce argv`` in this process with ``stdin``, Ray replaced by :class:`RayWouldStart`."""
    err = io.StringIO()
    saved = sys.stdin, ray.init, ray.is_initialized
    sys.stdin = io.TextIOWrapper(io.BytesIO(stdin))
    ray.init = _ray_would_start
    ray.is_initialized = lambda: False  # an instance this process holds (a test's) is not joined
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            status: int | None = main([*argv, "--no-progress"])
        return status, err.getvalue(), None
    except RayWouldStart:
        return None, err.getvalue(), None
    except Exception as error:  # a crash is what the property looks for
        return 1, err.getvalue(), error
    finally:
        sys.stdin, ray.init, ray.is_initialized = saved


def _ray_would_start(*args: object, **kwargs: object) -> None:
    raise RayWouldStart


def _snapshot(root: Path, outputs: tuple[str, ...]) -> dict[str, str]:
    """SHA-256 of every file under ``root`` but the outputs'."""
    kept = [root / output for output in outputs]
    return {
        str(path.relative_to(root)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in root.rglob("*")
        if path.is_file() and not any(path.is_relative_to(output) for output in kept)
    }


def hostile_examples(default: int) -> Callable[[Callable], Callable]:
    """Hypothesis settings of a boundary property: ``default`` examples drawn the same every run
    (the quick tier), or ``HNCE_BOUNDARY_EXAMPLES`` of them drawn anew for a longer run by hand
    (benchmarks/boundary_fuzz.py draws its own, from a seed)."""
    examples = os.environ.get("HNCE_BOUNDARY_EXAMPLES")
    return settings(
        max_examples=default if examples is None else int(examples),
        deadline=None,
        derandomize=examples is None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow],
    )

"""The command-line boundary under many hostile inputs: tests/test_boundary.py's property at full
size, and past the Ray boundary tests/test_store_contents_boundary.py's, every example's seed
recorded so any failure replays.

Examples go round the commands of ``tests/boundary.py`` (``CASES``) and the readers of
``tests/store_contents.py`` (``READER_CASES``: the files a resumed worker, a shard holder and the
payoff trigger read) in turn, each with a seed drawn from ``--seed``; the seed picks the input
damaged, the damage and whether its checksums are re-signed (a reader's example also draws its
damage: bytes, or one of the named defects of its content). A result file lists, per command or
reader, the examples run and those that broke the contract (docs/failures.md), grouped by what
broke it, each group with one seed that replays it.

    .venv/bin/python -m benchmarks.boundary_fuzz --examples 600 --seed 1
    .venv/bin/python -m benchmarks.boundary_fuzz --case 'link (stdin)' --seed 116484635
    .venv/bin/python -m benchmarks.boundary_fuzz --case 'payoff: refresh log' --damage bytes --seed 7

The last two forms replay one example and print what it did (no result file).
"""

from __future__ import annotations

import random
import sys
import tempfile
import traceback
from collections import Counter, defaultdict
from pathlib import Path

from benchmarks import harness

sys.path.insert(0, str(harness.ROOT / "tests"))  # the workspace is built by the tests' helpers
from boundary import CASES, Outcome, build_workspace, run_example
from store_contents import READER_CASES, ReaderOutcome, build_reader_workspace, run_reader_example


def signature(outcome: Outcome | ReaderOutcome) -> str:
    """What broke the contract, without the example's paths: an exception's type and the line
    of hnce's code that raised it, or the rule broken."""
    if outcome.error is not None:
        frames = [
            frame
            for frame in traceback.extract_tb(outcome.error.__traceback__)
            if frame.filename.startswith(str(harness.ROOT)) and "/tests/" not in frame.filename
        ]
        where = frames[-1] if frames else None
        place = (
            f" at {Path(where.filename).relative_to(harness.ROOT)}:{where.lineno}" if where else ""
        )
        return f"{type(outcome.error).__name__}{place}"
    return (outcome.broken() or "").split(":")[0]


def main() -> None:
    parser = harness.arguments(__doc__, "boundary_fuzz", examples=600, seed=1)
    parser.add_argument(
        "--case",
        choices=sorted(CASES) + sorted(READER_CASES),
        help="replay one example of this command or reader",
    )
    parser.add_argument("--damage", default="bytes", help="a reader's damage, to replay one")
    args = harness.parse(parser)
    with tempfile.TemporaryDirectory(prefix="hnce-boundary-") as work:
        workspace = build_workspace(Path(work) / "workspace")
        readers = build_reader_workspace(Path(work) / "readers")
        scratch = Path(work) / "scratch"

        def example(case: str, damage: str, seed: int) -> Outcome | ReaderOutcome:
            if case in READER_CASES:
                return run_reader_example(readers, scratch, case, damage, seed)
            return run_example(workspace, scratch, case, seed)

        if args.case is not None:
            outcome = example(args.case, args.damage, args.seed)
            said = outcome.said if isinstance(outcome, ReaderOutcome) else outcome.stderr
            status = "" if isinstance(outcome, ReaderOutcome) else f"exit {outcome.status}\n"
            print(f"{outcome.damage}\n{status}{said}")
            print(outcome.broken() or "kept the contract")
            if outcome.error is not None:
                traceback.print_exception(outcome.error)
            return
        draw = random.Random(args.seed)
        names = sorted(CASES) + sorted(READER_CASES)
        runs: Counter[str] = Counter()
        broken: dict[str, dict[str, list[tuple[int, str]]]] = defaultdict(lambda: defaultdict(list))
        for number in range(args.examples):
            case, seed = names[number % len(names)], draw.randrange(2**32)
            damages = ["bytes", *READER_CASES[case].damages] if case in READER_CASES else ["bytes"]
            outcome = example(case, draw.choice(damages), seed)
            runs[case] += 1
            if outcome.broken() is not None:
                broken[case][signature(outcome)].append((seed, outcome.damage))
            if (number + 1) % 50 == 0:
                failed = sum(len(found) for groups in broken.values() for found in groups.values())
                print(f"{number + 1}/{args.examples} examples, {failed} broke the contract")
    lines = [
        "# The command-line boundary under hostile input",
        "",
        f"`{harness.invocation('benchmarks.boundary_fuzz')}`: {args.examples} examples, seed "
        f"{args.seed}. Each damages one input of a command (tests/boundary.py), or one file a "
        "worker or a shard holder reads (tests/store_contents.py), and checks the error "
        "contract. A group's seed replays it with `--case '<command>' --seed <seed>` (a "
        "reader's with `--damage` too: `bytes`, or the named damage its file shows).",
        "",
        "| command or reader | examples | broke the contract | what broke it (examples, a seed, "
        "its damage) |",
        "|---|---:|---:|---|",
    ]
    for case in names:
        groups = broken.get(case, {})
        found = "; ".join(
            f"{name} ({len(seen)}, seed {seen[0][0]}: {seen[0][1]})"
            for name, seen in groups.items()
        )
        failed = sum(len(seen) for seen in groups.values())
        shown = f"read, {case}" if case in READER_CASES else f"`hnce {case}`"
        lines.append(f"| {shown} | {runs[case]} | {failed} | {found or 'none'} |")
    harness.write_result(args.output, lines)


if __name__ == "__main__":
    main()

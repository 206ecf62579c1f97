"""The command-line boundary under many hostile inputs: tests/test_boundary.py's property at full
size, every example's seed recorded so any failure replays.

Examples go round the commands of ``tests/boundary.py`` (``CASES``) in turn, each with a seed
drawn from ``--seed``; the seed picks the input damaged, the damage and whether its checksums are
re-signed. A result file lists, per command, the examples run and those that broke the contract
(docs/failures.md), grouped by what broke it, each group with one seed that replays it.

    .venv/bin/python -m benchmarks.boundary_fuzz --examples 600 --seed 1
    .venv/bin/python -m benchmarks.boundary_fuzz --case 'link (stdin)' --seed 116484635

The second form replays one example and prints what it did (no result file).
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


def signature(outcome: Outcome) -> str:
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
    parser.add_argument("--case", choices=sorted(CASES), help="replay one example of this command")
    args = harness.parse(parser)
    with tempfile.TemporaryDirectory(prefix="hnce-boundary-") as work:
        workspace = build_workspace(Path(work) / "workspace")
        scratch = Path(work) / "scratch"
        if args.case is not None:
            outcome = run_example(workspace, scratch, args.case, args.seed)
            print(f"{outcome.damage}\nexit {outcome.status}\n{outcome.stderr}")
            print(outcome.broken() or "kept the contract")
            if outcome.error is not None:
                traceback.print_exception(outcome.error)
            return
        draw = random.Random(args.seed)
        names = sorted(CASES)
        runs: Counter[str] = Counter()
        broken: dict[str, dict[str, list[tuple[int, str]]]] = defaultdict(lambda: defaultdict(list))
        for number in range(args.examples):
            case, seed = names[number % len(names)], draw.randrange(2**32)
            outcome = run_example(workspace, scratch, case, seed)
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
        f"{args.seed}. Each damages one input of a command (tests/boundary.py) and checks the "
        "error contract. A group's seed replays it with `--case '<command>' --seed <seed>`.",
        "",
        "| command | examples | broke the contract | what broke it (examples, a seed, its damage) |",
        "|---|---:|---:|---|",
    ]
    for case in names:
        groups = broken.get(case, {})
        found = "; ".join(
            f"{name} ({len(seen)}, seed {seen[0][0]}: {seen[0][1]})"
            for name, seen in groups.items()
        )
        failed = sum(len(seen) for seen in groups.values())
        lines.append(f"| `hnce {case}` | {runs[case]} | {failed} | {found or 'none'} |")
    harness.write_result(args.output, lines)


if __name__ == "__main__":
    main()

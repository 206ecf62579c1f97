"""Rows per second, stage timings and peak memory of every `hnce data` converter and of the
KILT-format generator (a benchmark, not a test).

Every step is one `hnce data ...` command run in its own child process, whose peak resident
memory (``ru_maxrss`` from ``os.wait4``, :func:`benchmarks.harness.run_hnce`) is its own. The
KILT case generates a knowledge source of ``--kilt-pages`` pages in KILT's format with
AIDA-sized mention files (`pipeline/data/kilt_synthetic.py`) and converts them with
`hnce data kilt`; the conversion must stay under 1 GiB whatever the number of pages. Figures go
to benchmarks/results/data_converters.md.

    .venv/bin/python -m benchmarks.data_converters                     # 1M pages, ~10 min
    .venv/bin/python -m benchmarks.data_converters --kilt-pages 5903530 --workers 2 \\
        --work /data/hnce-bench                                        # full scale: ~11 GB
    .venv/bin/python -m benchmarks.data_converters --kilt-pages 100000 --output /tmp/x.md
"""

from __future__ import annotations

import json
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from benchmarks import harness
from hnce.pipeline.data.kilt import knowledge_source_text
from hnce.pipeline.data.kilt_synthetic import KNOWLEDGE_SOURCE, KiltWorld, aida_file_name

LIMIT_BYTES = 1 << 30


@dataclass
class Step:
    """One measured command: what it did, how long, how much memory, what it counted."""

    name: str
    rows: int
    seconds: float
    peak_bytes: int
    input_bytes: int = 0
    stages: dict[str, float] | None = None

    def line(self) -> str:
        rate = f"{self.rows / self.seconds:,.0f} rows/s"
        if self.input_bytes:
            rate += f", {self.input_bytes / self.seconds / 1e6:,.1f} MB/s"
        return (
            f"{self.name}: {self.rows:,} rows in {self.seconds:,.1f} s ({rate}), "
            f"peak RSS {self.peak_bytes / 2**20:,.0f} MiB"
        )


def run_hnce(arguments: list[str]) -> tuple[float, int]:
    """Run ``hnce <arguments>`` in a child process: (wall seconds, its peak resident bytes)."""
    command = harness.run_hnce(arguments)
    return command.seconds, command.child_peak_bytes


def convert(name: str, arguments: list[str], out: Path, counts_mentions: bool = True) -> Step:
    """One `hnce data` conversion into ``out``, with the stage timings of its summary."""
    seconds, peak = run_hnce([*arguments, "--out", str(out), "--overwrite"])
    summary = json.loads((out / "summary.json").read_text())
    rows = summary["entities"] + (sum(summary["mentions"].values()) if counts_mentions else 0)
    inputs = json.loads((out / "manifest.json").read_text())["inputs"]
    size = sum(entry["bytes"] for entry in inputs)
    return Step(name, rows, seconds, peak, size, summary.get("seconds"))


def kilt_steps(work: Path, pages: int, workers: int) -> list[Step]:
    """Generate KILT inputs of ``pages`` pages, then convert them."""
    raw = work / "kilt-raw"
    generate = ["data", "synthetic-kilt", "--out", str(raw), "--pages", str(pages)]
    seconds, peak = run_hnce([*generate, "--workers", str(workers)])
    written = sum(path.stat().st_size for path in raw.iterdir())
    generated = Step(
        f"generate KILT inputs ({pages:,} pages, {workers} workers)", pages, seconds, peak, written
    )
    aida = [str(raw / aida_file_name(split)) for split in ("train", "dev", "test")]
    source = ["--knowledge-source", str(raw / KNOWLEDGE_SOURCE)]
    converted = convert(
        f"hnce data kilt ({pages:,} pages + AIDA)",
        ["data", "kilt", *source, "--aida", *aida],
        work / "kilt",
    )
    return [generated, converted]


def write_blink_entities(path: Path, lines: int) -> None:
    """BLINK's ``entity.jsonl`` for the generated pages (text = the page's lead)."""
    world = KiltWorld(max(lines, 16), seed=1)
    with path.open("w", encoding="utf-8") as handle:
        for line in range(lines):
            page = json.loads(world.page_line(line))
            record = {
                "text": knowledge_source_text(page["text"], 2048),
                "idx": f"https://en.wikipedia.org/wiki?curid={page['wikipedia_id']}",
                "title": page["wikipedia_title"],
                "entity": page["wikipedia_title"],
            }
            handle.write(json.dumps(record, ensure_ascii=False) + "\n")


def other_steps(work: Path, blink_lines: int, worlds: int, entities: int) -> list[Step]:
    """BLINK, Zeshel (raw synthetic worlds), WordNet and the synthetic dataset."""
    from hnce.pipeline.data.synthetic import write_synthetic_zeshel

    write_blink_entities(work / "entity.jsonl", blink_lines)
    write_synthetic_zeshel(work / "zeshel-raw", worlds, entities, 4, seed=0)
    synthetic = ["--worlds", str(worlds), "--entities-per-world", str(entities)]
    return [
        convert(
            f"hnce data blink ({blink_lines:,} lines)",
            ["data", "blink", "--entities", str(work / "entity.jsonl")],
            work / "blink",
        ),
        convert(
            f"hnce data zeshel ({worlds} worlds x {entities:,} documents)",
            ["data", "zeshel", str(work / "zeshel-raw")],
            work / "zeshel",
        ),
        convert(
            "hnce data wordnet (real, /usr/share/wordnet)", ["data", "wordnet"], work / "wordnet"
        ),
        convert(
            f"hnce data synthetic ({worlds} worlds x {entities:,} entities x 4 mentions)",
            ["data", "synthetic", *synthetic],
            work / "synthetic",
        ),
    ]


def report(steps: list[Step], kilt_peak: int) -> str:
    lines = [
        "# Data converters: rows per second, stages and peak memory",
        "",
        "Each step is one `hnce data` command alone in a child process (2-core CPU machine, shared);",
        "peak memory is the child's maximum resident set size. Rows = entities (+ mentions).",
        "",
        "| step | rows | seconds | rows/s | input MB/s | peak RSS (MiB) |",
        "|---|---:|---:|---:|---:|---:|",
        *[
            f"| {s.name} | {s.rows:,} | {s.seconds:,.1f} | {s.rows / s.seconds:,.0f} | "
            f"{s.input_bytes / s.seconds / 1e6:,.1f} | {s.peak_bytes / 2**20:,.0f} |"
            for s in steps
        ],
        "",
        "Stages of each conversion (seconds, from its summary):",
        "",
        *[
            f"- {s.name}: " + ", ".join(f"{k} {v:,.1f}" for k, v in s.stages.items())
            for s in steps
            if s.stages
        ],
        "",
        f"KILT conversion peak / 1 GiB limit: {kilt_peak / LIMIT_BYTES:.2f} "
        f"({'under' if kilt_peak < LIMIT_BYTES else 'OVER'} the limit).",
        "",
    ]
    return "\n".join(lines)


def main() -> int:
    parser = harness.arguments(
        __doc__,
        "data_converters",
        work_dir=None,
        kilt_pages=1_000_000,
        blink_lines=200_000,
        zeshel_worlds=10,
        zeshel_entities=2_000,
    )
    parser.add_argument("--workers", type=int, default=2, help="processes of the generator")
    args = harness.parse(parser)
    with tempfile.TemporaryDirectory(prefix="hnce-bench-", dir=args.work_dir) as scratch:
        work = Path(scratch).resolve()
        steps = kilt_steps(work, args.kilt_pages, args.workers)
        print(*(step.line() for step in steps), sep="\n", flush=True)
        others = other_steps(work, args.blink_lines, args.zeshel_worlds, args.zeshel_entities)
        print(*(step.line() for step in others), sep="\n", flush=True)
    kilt_peak = steps[1].peak_bytes
    harness.write_text(args.output, report([*steps, *others], kilt_peak))
    print(f"peak/limit ratio of the KILT conversion: {kilt_peak / LIMIT_BYTES:.2f}")
    return 0 if kilt_peak < LIMIT_BYTES else 1


if __name__ == "__main__":
    sys.exit(main())

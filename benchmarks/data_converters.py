"""Rows per second and peak memory of each `hnce data` converter (a benchmark, not a test).

Every conversion runs in its own child process so that its peak resident memory (ru_maxrss) is
its own. The KILT knowledge-source case converts a generated 1,000,000-line file in the real
format and must stay under 1 GiB. Figures go to benchmarks/results/data_converters.md.

    .venv/bin/python benchmarks/data_converters.py [--kilt-lines 1000000]
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
from pathlib import Path

from report import update_benchmarks_md

RESULTS = Path(__file__).parent / "results" / "data_converters.md"
LIMIT_BYTES = 1 << 30
_WORDS = [
    "the",
    "of",
    "and",
    "in",
    "a",
    "city",
    "river",
    "founded",
    "known",
    "music",
    "team",
    "league",
    "born",
    "album",
    "war",
    "party",
]


def _paragraph(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(words)) + "."


def write_knowledge_source(path: Path, lines: int, seed: int = 0) -> None:
    """KILT knowledge-source lines: title line, a section header and a few paragraphs."""
    rng = random.Random(seed)
    with path.open("w", encoding="utf-8") as handle:
        for page in range(lines):
            title = f"Page {page} ë"
            record = {
                "wikipedia_id": str(page + 12),
                "wikipedia_title": title,
                "text": [
                    f"{title}\n",
                    _paragraph(rng, 60) + "\n",
                    "Section::::History.\n",
                    _paragraph(rng, 80) + "\n",
                ],
                "anchors": [
                    {
                        "paragraph_id": 1,
                        "start": 0,
                        "end": 4,
                        "text": "city",
                        "href": "City",
                        "wikipedia_id": "5",
                    }
                ],
                "categories": "Cities",
                "history": {"revid": page, "timestamp": "2019-08-01T00:00:00Z"},
                "wikidata_info": {"wikidata_id": f"Q{page}"},
            }
            handle.write(json.dumps(record, ensure_ascii=False) + "\n")


def write_blink_entities(path: Path, lines: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    with path.open("w", encoding="utf-8") as handle:
        for row in range(lines):
            record = {
                "text": _paragraph(rng, 100),
                "idx": f"https://en.wikipedia.org/wiki?curid={row + 12}",
                "title": f"Page {row}",
                "entity": f"Page {row}",
            }
            handle.write(json.dumps(record) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kilt-lines", type=int, default=1_000_000)
    parser.add_argument("--blink-lines", type=int, default=200_000)
    parser.add_argument("--zeshel-worlds", type=int, default=10)
    parser.add_argument("--zeshel-entities", type=int, default=2_000)
    args = parser.parse_args()
    rows: list[tuple[str, int, float, int]] = []
    with tempfile.TemporaryDirectory(prefix="hnce-bench-") as tmp:
        tmp_path = Path(tmp)
        cases: list[tuple[str, str, str]] = []
        write_knowledge_source(tmp_path / "ks.json", args.kilt_lines)
        cases.append(
            (
                f"kilt knowledge source ({args.kilt_lines:,} lines)",
                "entities",
                "from pipeline.data.kilt import convert_kilt\n"
                f"s = convert_kilt({str(tmp_path / 'out-kilt')!r}, [], knowledge_source={str(tmp_path / 'ks.json')!r})",
            )
        )
        write_blink_entities(tmp_path / "entity.jsonl", args.blink_lines)
        cases.append(
            (
                f"blink entity.jsonl ({args.blink_lines:,} lines)",
                "entities",
                "from pipeline.data.kilt import convert_kilt\n"
                f"s = convert_kilt({str(tmp_path / 'out-blink')!r}, [], blink_entities={str(tmp_path / 'entity.jsonl')!r})",
            )
        )
        from pipeline.data.synthetic import write_synthetic_zeshel

        write_synthetic_zeshel(
            tmp_path / "zeshel", args.zeshel_worlds, args.zeshel_entities, 4, seed=0
        )
        cases.append(
            (
                f"zeshel ({args.zeshel_worlds} worlds x {args.zeshel_entities:,} documents)",
                "entities+mentions",
                "from pipeline.data.zeshel import convert_zeshel\n"
                f"s = convert_zeshel({str(tmp_path / 'zeshel')!r}, {str(tmp_path / 'out-zeshel')!r})",
            )
        )
        cases.append(
            (
                "wordnet (real, /usr/share/wordnet)",
                "entities+mentions",
                "from pipeline.data.wordnet import convert_wordnet\n"
                f"s = convert_wordnet({str(tmp_path / 'out-wordnet')!r})",
            )
        )
        cases.append(
            (
                "synthetic (10 worlds x 2,000 entities x 4 mentions)",
                "entities+mentions",
                "from pipeline.data.synthetic import generate_synthetic_dataset\n"
                f"s = generate_synthetic_dataset({str(tmp_path / 'out-synthetic')!r}, 10, 2000, 4, 0)",
            )
        )
        for name, counted, code in cases:
            # each child is measured alone: RUSAGE_CHILDREN's maxrss is the largest child so far,
            # so run each case in a fresh grandchild via a wrapper process
            wrapper = (
                "import json, resource, subprocess, sys, time\n"
                f"t = time.perf_counter(); subprocess.run([sys.executable, '-c', {code + chr(10) + 'import json; print(json.dumps(s))'!r}], check=True, stdout=open('/dev/null', 'w'), stderr=subprocess.DEVNULL)\n"
                "print(json.dumps({'seconds': time.perf_counter() - t, 'peak': resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024}))\n"
            )
            result = subprocess.run(
                [sys.executable, "-c", wrapper], check=True, capture_output=True, text=True
            )
            figures = json.loads(result.stdout.strip().splitlines()[-1])
            summary_path = tmp_path / ("out-" + name.split()[0]) / "summary.json"
            summary = json.loads(summary_path.read_text())
            count = summary["entities"] + (
                sum(summary["mentions"].values()) if "mentions" in counted else 0
            )
            rows.append((name, count, figures["seconds"], figures["peak"]))
            print(
                f"{name}: {count:,} rows in {figures['seconds']:.1f} s = {count / figures['seconds']:,.0f} rows/s, peak RSS {figures['peak'] / 2**20:,.0f} MiB",
                flush=True,
            )
    kilt_peak = rows[0][3]
    lines = [
        "# Data converters: rows per second and peak memory",
        "",
        "Each conversion runs alone in a child process (2-core CPU machine, shared); peak memory is",
        "the child's maximum resident set size. Rows = entities (+ mentions where written).",
        "",
        "| converter | rows | seconds | rows/s | peak RSS (MiB) |",
        "|---|---:|---:|---:|---:|",
        *[f"| {n} | {c:,} | {s:.1f} | {c / s:,.0f} | {p / 2**20:,.0f} |" for n, c, s, p in rows],
        "",
        f"KILT knowledge source peak / 1 GiB limit: {kilt_peak / LIMIT_BYTES:.2f} "
        f"({'under' if kilt_peak < LIMIT_BYTES else 'OVER'} the limit).",
        "",
    ]
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text("\n".join(lines), encoding="utf-8")
    update_benchmarks_md()
    print(f"peak/limit ratio for the 1M-line KILT file: {kilt_peak / LIMIT_BYTES:.2f}")
    return 0 if kilt_peak < LIMIT_BYTES else 1


if __name__ == "__main__":
    sys.exit(main())

"""``hnce data <format>``: convert an input format (docs/input-formats.md) and publish it as a dataset
directory (``entities/``, ``mentions/<split>.parquet``, ``summary.json``, ``manifest.json``;
docs/stores.md). ``hnce data verify DIR`` checks a published dataset's files against its manifest;
``hnce data synthetic-kilt`` writes KILT-format inputs at Wikipedia scale."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hnce.pipeline.data.bad_rows import add_bad_row_arguments
from hnce.pipeline.data.blink import DEFAULT_MAX_TEXT_CHARS
from hnce.pipeline.data.conversion import DatasetOutput
from hnce.pipeline.data.kilt_synthetic import (
    AIDA_MENTIONS,
    BLOCK,
    KILT_PAGES,
    LEAD_CHARS,
    LEAD_MEDIAN_CHARS,
)

KEEP_MISSING_GOLD_HELP = (
    "keep mentions whose gold entity is not in the catalogue, with gold = -1, so that evaluation "
    "counts them as errors (unnormalized accuracy) instead of rejecting them as bad rows"
)


def at_least(minimum: int) -> Callable[[str], int]:
    """An argparse type: an integer no smaller than ``minimum``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        return value

    return parse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    formats = parser.add_subparsers(dest="format", metavar="FORMAT", required=True)
    _add_converters(formats)
    verify = formats.add_parser(
        "verify", help="check every file of a published dataset against its manifest's SHA-256"
    )
    verify.add_argument("dataset", type=Path, help="dataset directory (holds manifest.json)")
    _add_kilt_generator(formats)


def _add_converters(formats: Any) -> None:
    """One subcommand per input format, each with the options of a published dataset."""
    converters = [
        _add_zeshel(formats),
        *_add_kilt_and_blink(formats),
        _add_wordnet(formats),
        _add_foldoc(formats),
        _add_synthetic(formats),
    ]
    for sub in converters:
        sub.add_argument(
            "--out",
            type=Path,
            default=None,
            help="dataset directory to publish (default: runs/data/<format>)",
        )
        sub.add_argument(
            "--overwrite",
            action="store_true",
            help="replace the dataset already in --out, all of it (without: refuse a non-empty "
            "--out)",
        )
        add_bad_row_arguments(sub)


def _add_zeshel(formats: Any) -> argparse.ArgumentParser:
    zeshel = formats.add_parser(
        "zeshel", help="Zeshel documents/ and mentions/ (one domain per world)"
    )
    zeshel.add_argument("zeshel_dir", type=Path, help="directory holding documents/ and mentions/")
    zeshel.add_argument("--keep-missing-gold", action="store_true", help=KEEP_MISSING_GOLD_HELP)
    return zeshel


def _add_kilt_and_blink(formats: Any) -> list[argparse.ArgumentParser]:
    converters = []
    for name, source_flag, source_help in (
        ("kilt", "--knowledge-source", "kilt_knowledgesource.json (one Wikipedia page per line)"),
        ("blink", "--entities", "BLINK entity.jsonl (entity_id = row = BLINK's entity id)"),
    ):
        sub = formats.add_parser(name, help=f"KILT AIDA mentions against {source_help}")
        converters.append(sub)
        sub.add_argument(
            source_flag, dest="catalogue_source", type=Path, required=True, help=source_help
        )
        sub.add_argument(
            "--aida",
            type=Path,
            nargs="*",
            default=[],
            help="aidayago2-{train,dev,test}-kilt.jsonl files (split taken from the file name)",
        )
        sub.add_argument("--keep-missing-gold", action="store_true", help=KEEP_MISSING_GOLD_HELP)
        sub.add_argument(
            "--max-text-chars",
            type=at_least(1),
            default=DEFAULT_MAX_TEXT_CHARS,
            help="cut entity text at this many characters (the encoder reads 128 tokens)",
        )
    return converters


def _add_wordnet(formats: Any) -> argparse.ArgumentParser:
    wordnet = formats.add_parser(
        "wordnet", help="WordNet synsets as entities, own-lemma example sentences as mentions"
    )
    wordnet.add_argument("--wordnet-dir", type=Path, default=Path("/usr/share/wordnet"))
    wordnet.add_argument(
        "--seed", type=at_least(0), default=0, help="seed of the lemma-disjoint split"
    )
    return wordnet


def _add_foldoc(formats: Any) -> argparse.ArgumentParser:
    foldoc = formats.add_parser(
        "foldoc", help="FOLDOC entries as entities, the links between them as mentions"
    )
    foldoc.add_argument(
        "--foldoc-dir",
        type=Path,
        default=Path("/usr/share/dictd"),
        help="directory holding foldoc.index and foldoc.dict.dz (Debian dict-foldoc)",
    )
    foldoc.add_argument(
        "--seed", type=at_least(0), default=0, help="seed of the split by linking entry"
    )
    return foldoc


def _add_synthetic(formats: Any) -> argparse.ArgumentParser:
    synthetic = formats.add_parser("synthetic", help="seeded Zeshel-like worlds with shared names")
    synthetic.add_argument("--worlds", type=at_least(1), default=5)
    synthetic.add_argument("--entities-per-world", type=at_least(2), default=200)
    synthetic.add_argument("--mentions-per-entity", type=at_least(0), default=4)
    synthetic.add_argument("--seed", type=at_least(0), default=0)
    return synthetic


def _add_kilt_generator(formats: Any) -> None:
    generator = formats.add_parser(
        "synthetic-kilt",
        help="write a seeded KILT knowledge source and AIDA files at Wikipedia scale: the inputs "
        "of `hnce data kilt` (pipeline/data/kilt_synthetic.py says how they are made)",
    )
    generator.add_argument("--out", type=Path, required=True, help="directory of the raw files")
    generator.add_argument("--pages", type=at_least(BLOCK), default=KILT_PAGES)
    generator.add_argument("--seed", type=at_least(0), default=0)
    for split, count in AIDA_MENTIONS.items():
        generator.add_argument(f"--{split}", type=at_least(0), default=count, help="mentions")
    generator.add_argument(
        "--part-lines",
        type=at_least(1),
        default=250_000,
        help="pages per restartable part of the knowledge source",
    )
    generator.add_argument(
        "--workers", type=at_least(1), default=1, help="processes writing parts at once"
    )
    generator.add_argument(
        "--lead-median-chars",
        type=at_least(LEAD_CHARS[0]),
        default=LEAD_MEDIAN_CHARS,
        help="median characters of a page's lead (smaller: stubs for short entity windows)",
    )


def run(args: argparse.Namespace) -> int:
    if args.format == "verify":
        from hnce.cluster.stores.tables_read import verify_dataset

        manifest = verify_dataset(args.dataset)
        print(f"{args.dataset}: {len(manifest.files)} files match {manifest.path}")
        return 0
    if args.format == "synthetic-kilt":
        return _generate_kilt_inputs(args)
    out: Path = args.out or Path("runs/data") / args.format
    output = DatasetOutput(out, args.overwrite, args.on_bad_row, args.rejects)
    _print_summary(out, _convert(args, output))
    return 0


def _convert(args: argparse.Namespace, output: DatasetOutput) -> dict[str, Any]:
    if args.format == "zeshel":
        from hnce.pipeline.data.zeshel import convert_zeshel

        return convert_zeshel(args.zeshel_dir, output, args.keep_missing_gold)
    if args.format in ("kilt", "blink"):
        from hnce.pipeline.data.kilt import convert_kilt

        source = {
            "knowledge_source" if args.format == "kilt" else "blink_entities": args.catalogue_source
        }
        return convert_kilt(
            output,
            args.aida,
            keep_missing_gold=args.keep_missing_gold,
            max_text_chars=args.max_text_chars,
            **source,
        )
    if args.format == "wordnet":
        from hnce.pipeline.data.wordnet import convert_wordnet

        return convert_wordnet(output, args.wordnet_dir, args.seed)
    if args.format == "foldoc":
        from hnce.pipeline.data.foldoc import convert_foldoc

        return convert_foldoc(output, args.foldoc_dir, args.seed)
    from hnce.pipeline.data.synthetic import generate_synthetic_dataset

    return generate_synthetic_dataset(
        output, args.worlds, args.entities_per_world, args.mentions_per_entity, args.seed
    )


def _generate_kilt_inputs(args: argparse.Namespace) -> int:
    from hnce.pipeline.data.kilt_synthetic import generate_kilt_inputs

    record = generate_kilt_inputs(
        args.out,
        args.pages,
        args.seed,
        {split: getattr(args, split) for split in AIDA_MENTIONS},
        args.part_lines,
        args.workers,
        args.lead_median_chars,
    )
    for name, entry in record["files"].items():
        print(f"{args.out / name}: {entry['bytes'] / 1e6:,.1f} MB")
    for stage, seconds in record["seconds"].items():
        print(f"{stage}: {seconds:,.1f} s")
    return 0


def _print_summary(out: Path, summary: dict[str, Any]) -> None:
    print(f"dataset published to {out}")
    print(f"entities: {summary['entities']}")
    print(f"mentions: {json.dumps(summary['mentions'], sort_keys=True)}")
    for split, files in summary.get("mention_files", {}).items():
        if len(files) > 1:
            print(f"  {split}: " + ", ".join(f"{f['file']} {f['mentions']}" for f in files))
    if "ambiguous_total" in summary:
        print(
            f"mentions total: {summary['mentions_total']}, ambiguous (lemma shared by >1 synset "
            f"of its part of speech): {summary['ambiguous_total']}, "
            f"over all parts of speech: {summary['ambiguous_any_pos_total']}"
        )
    if "unseen" in summary:
        links = summary["links"]
        print(
            f"links: {links['total']}, resolved {json.dumps(links['resolved'])}, web "
            f"{links['web']}, self {links['self']}, missing {json.dumps(links['missing'])}"
        )
        print(
            f"dev / test mentions whose gold a train mention links to: "
            f"{summary['seen']['dev']} / {summary['seen']['test']}, "
            f"not: {summary['unseen']['dev']} / {summary['unseen']['test']}"
        )
    if summary.get("missing_gold_kept"):
        print(
            f"mentions kept with gold = -1 (gold not in catalogue): {summary['missing_gold_kept']}"
        )
    if summary.get("unlabelled"):
        print(f"unlabelled mentions (test_without_answers, gold = -1): {summary['unlabelled']}")
    bad = summary["bad_rows"]
    if bad["rejected_total"]:
        counts = {kind: n for kind, n in bad["rejected"].items() if n}
        print(f"rejected rows: {bad['rejected_total']} {counts} -> {bad['rejects_file']}")
    print("seconds: " + ", ".join(f"{k} {v:.1f}" for k, v in summary.get("seconds", {}).items()))
    catalogue = summary.get("catalogue", {})
    if catalogue.get("entity_id_is_blink_row") is False:
        print("warning: rows were rejected, so entity_id no longer equals BLINK's entity id")

"""Where the demo's R@1 errors come from: another sense of the mention's own lemma, or elsewhere.

WordNet's entities are synsets and a mention is a lemma in an example sentence, so most held-out
mentions have several candidate senses in the demo's catalogue (the subset takes every sense of
the golds' lemmas: ``hnce.pipeline.data.demo_subset``). For the untrained model and each run of
``hnce demo`` (configs/demo.yaml as shipped, one run directory per seed, run by
:mod:`benchmarks.demo_seeds` where it is not there yet), every held-out mention's top-1 entity by
exact scores over the whole catalogue (the peer benchmark's evaluation path,
:mod:`benchmarks.peer.evaluation`) is sorted into: right; wrong but sharing a lemma with the gold
(a sense confusion: word-sense disambiguation, which negatives can only teach for lemmas they
cover); wrong elsewhere (retrieval). R@1 is also split by whether the gold's lemma has another
sense in the catalogue.

    .venv/bin/python -m benchmarks.demo_errors --seeds 3 --work-dir /work/demo-seeds

writes ``benchmarks/results/demo_errors.md``.
"""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from benchmarks import harness
from benchmarks.demo_seeds import RECIPE, RUNS, run_seed
from benchmarks.peer.evaluation import HeldOut, embed, held_out_set
from hnce.cluster.stores.checkpoints import EXPORT_DIR, newest_checkpoint
from hnce.encoders.biencoder import load_biencoder
from hnce.pipeline.config import load_config
from hnce.pipeline.data.demo_subset import entity_lemmas
from hnce.pipeline.recipe_models import untrained_export

MODELS = ("untrained", *RUNS)


@dataclass(frozen=True)
class Errors:
    """One model's top-1 over the held-out mentions: counts of each kind."""

    mentions: int
    right: int
    sense: int  # wrong, sharing a lemma with the gold
    elsewhere: int  # wrong, sharing none
    ambiguous: int  # mentions whose gold's lemma has another sense in the catalogue
    right_ambiguous: int

    def line(self, name: str) -> str:
        wrong = self.sense + self.elsewhere
        plain = self.mentions - self.ambiguous
        return (
            f"| {name} | {self.right / self.mentions:.3f} | {wrong} | {self.sense} "
            f"({self.sense / max(wrong, 1):.0%}) | {self.elsewhere} | "
            f"{self.right_ambiguous / max(self.ambiguous, 1):.3f} ({self.ambiguous}) | "
            f"{(self.right - self.right_ambiguous) / max(plain, 1):.3f} ({plain}) |"
        )


def classify(top1: np.ndarray, held_out: HeldOut, lemmas: list[frozenset[str]]) -> Errors:
    """Sort each mention's ``top1`` entity (module docs)."""
    by_lemma = Counter(lemma for senses in lemmas for lemma in senses)
    right = sense = elsewhere = ambiguous = right_ambiguous = 0
    for mention, chosen in zip(held_out.mentions, top1.tolist(), strict=True):
        golds = [int(g) for g in (mention.golds or (mention.gold,))]
        gold_lemmas = frozenset().union(*(lemmas[g] for g in golds))
        is_ambiguous = any(by_lemma[lemma] > 1 for lemma in gold_lemmas)
        ambiguous += is_ambiguous
        if chosen in golds:
            right += 1
            right_ambiguous += is_ambiguous
        elif lemmas[chosen] & gold_lemmas:
            sense += 1
        else:
            elsewhere += 1
    return Errors(len(held_out.mentions), right, sense, elsewhere, ambiguous, right_ambiguous)


def seed_errors(run_dir: Path, seed: int) -> dict[str, Errors]:
    """Each model's :class:`Errors` on seed ``seed``'s held-out mentions."""
    runs = run_dir / "runs"
    config = load_config(
        RECIPE,
        [f"run.dir={runs / RUNS[-1]}", f"run.seed={seed}", f"data.root={run_dir / 'wordnet-demo'}"],
    )
    held_out = held_out_set(config)
    lemmas = [frozenset(entity_lemmas(text)) for text in held_out.texts]
    exports = {"untrained": untrained_export(config)}
    for name in RUNS:
        newest = newest_checkpoint(runs / name)
        if newest is None:
            raise SystemExit(f"{runs / name}: no checkpoint")
        exports[name] = newest[1] / EXPORT_DIR
    found = {}
    for name, export in exports.items():
        queries, catalogue = embed(load_biencoder(export), held_out)
        with torch.inference_mode():
            top1 = (queries @ catalogue.T).argmax(dim=1).numpy()
        found[name] = classify(top1, held_out, lemmas)
    return found


def seeds_named(count: int) -> str:
    return "seed 0" if count == 1 else f"seeds 0..{count - 1}"


def main() -> None:
    parser = harness.arguments(__doc__, "demo_errors", work_dir=Path("/tmp/hnce-demo-seeds"))
    parser.add_argument("--seeds", type=int, default=1, help="seeds 0..N-1")
    args = harness.parse(parser)
    work = Path(args.work_dir)
    per_seed = []
    for seed in range(args.seeds):
        run_seed(work, seed)
        per_seed.append(seed_errors(work / f"seed-{seed}", seed))
    lines = [
        "# Where the demo's R@1 errors come from (benchmarks/demo_errors.py)",
        "",
        f"`hnce demo` (configs/demo.yaml as shipped), {seeds_named(args.seeds)}: 400 held-out "
        "mentions whose lemmas training never saw, 8,000 synsets. Each model's top-1 by exact "
        "scores over the whole catalogue. *Another sense*: the top-1 shares a lemma with the "
        "gold (word-sense disambiguation failed); *elsewhere*: it shares none (retrieval "
        "failed). *Ambiguous*: the gold's lemma has another sense in the catalogue.",
        "",
    ]
    for seed, found in enumerate(per_seed):
        lines += [
            f"Seed {seed}:",
            "",
            "| model | R@1 | wrong | another sense (of wrong) | elsewhere | R@1 ambiguous "
            "(mentions) | R@1 unambiguous (mentions) |",
            "|---|---:|---:|---:|---:|---:|---:|",
            *(found[name].line(name) for name in MODELS),
            "",
        ]
    shares = [
        found[name].sense / max(found[name].sense + found[name].elsewhere, 1)
        for found in per_seed
        for name in RUNS
    ]
    lines.append(
        f"Of the trained runs' R@1 errors, {statistics.mean(shares):.0%} on average pick another "
        "sense of the mention's own lemma."
    )
    harness.write_result(args.output, lines)


if __name__ == "__main__":
    main()

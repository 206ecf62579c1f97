"""The paper's comparison (§6.5, Table 1; Appendix A) on real WordNet data, in under an hour on 2 cores.

Scorers dual, multi-8, som and poly-16 (DESIGN.md §3), each trained with random, hard (eq. 8)
and mixed-50 negatives under the hard-negative NCE loss (eq. 5/11) at an equal budget (same
steps, mentions per step and negatives per mention), plus the untrained model and BM25 as
baselines. Reported: recall@1 and recall@64 of held-out mentions whose lemmas never occur in
training (the WordNet converter's lemma-disjoint split).

Scaled to a 2-core CPU:

- encoder: the packaged all-MiniLM-L6-v2 in both towers (``--layers`` keeps only its first
  layers; with fewer than 6 the [CLS] state carries too little content for dual and multi to
  learn anything in this budget), 24 tokens per mention and entity, 30 steps of 8 mentions;
- catalogue: the ``hnce demo`` subset (``pipeline.demo.write_demo_subset``): every gold, every
  other sense of the golds' lemmas (the ambiguous distractors that make the task hard), then
  random synsets up to ``--entities``;
- hard negatives are drawn exactly over the whole catalogue (DESIGN.md §4, "exactly over the
  whole catalogue when it is small"): entity token states are re-encoded every
  ``--refresh-every`` steps (as the asynchronous refresh would publish them) and scored against
  the current mention encoding with the model's own scorer, then Gumbel-top-K (eq. 8);
- evaluation scores every held-out mention against every catalogue entity exactly, in batches,
  with the model's own scorer. For dual and multi-8 this equals a flat FAISS index search; for
  som it equals an exact token-level rerank of all entities; poly-16 is not indexable (its query
  depends on the entity), so exact scoring over the whole catalogue is the only fair way to
  evaluate it and is what reranking every index candidate would give.

The training loop here is a plain in-process torch loop (AdamW), not the DeepSpeed/Ray trainer:
twelve runs of Ray + DeepSpeed start-up would eat the budget, and the trainer cannot mine hard
negatives for poly, whose scores need the entity-specific query. The samplers and losses are the
library's (``mining.samplers``, ``mining.losses``).

    .venv/bin/python benchmarks/wordnet_comparison.py            # ~30 min on 2 busy cores

writes ``benchmarks/results/wordnet_comparison.md`` and ``benchmarks/results/wordnet_comparison.png``.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass
from pathlib import Path

import bm25s
import numpy as np
import torch
from report import update_benchmarks_md
from torch import Tensor
from tqdm import tqdm

from cluster.tables import EntityCatalogue, Mention, MentionSplit, mention_split_path
from encoders.biencoder import BiEncoder, build_biencoder, minilm_path
from encoders.scorers import ScorerConfig
from mining.losses import build_loss
from mining.samplers import SamplingRequest, build_sampler
from pipeline.data.wordnet import convert_wordnet
from pipeline.demo import write_demo_subset

RESULTS = Path(__file__).resolve().parent / "results"
SCORERS = {
    "dual": ScorerConfig(name="dual", m=1),
    "multi-8": ScorerConfig(name="multi", m=8),
    "som": ScorerConfig(name="som", m=1),
    "poly-16": ScorerConfig(name="poly", m=16),
}
NEGATIVES = {"random": ("random", {}), "hard": ("hard", {}), "mixed-50": ("mixed", {})}
KS = (1, 64)


@dataclass
class Budget:
    steps: int
    batch_size: int
    num_negatives: int
    learning_rate: float
    refresh_every: int
    layers: int
    mention_length: int
    entity_length: int


@dataclass
class Cell:
    name: str
    recall: dict[int, float]
    seconds: float
    final_loss: float | None = None


def prepare_data(work: Path, wordnet_dir: Path, entities: int, train: int, test: int) -> Path:
    """The WordNet Parquet dataset (converted once) and the comparison's subset of it."""
    full = work / "wordnet"
    if not (full / "summary.json").is_file():
        convert_wordnet(full, wordnet_dir, 0)
    subset = work / f"subset-{entities}-{train}-{test}"
    if not (subset / "summary.json").is_file():
        write_demo_subset(full, subset, entities, train, test, "test", seed=0)
    return subset


def build_model(scorer: ScorerConfig, budget: Budget, seed: int) -> BiEncoder:
    """Both towers from MiniLM, cut to its first ``budget.layers`` layers."""
    torch.manual_seed(seed)
    model = build_biencoder(
        minilm_path(),
        scorer,
        mention_length=budget.mention_length,
        entity_length=budget.entity_length,
    )
    for tower in (model.mention_tower, model.entity_tower):
        tower.encoder.layer = tower.encoder.layer[: budget.layers]
        tower.config.num_hidden_layers = budget.layers
    return model


@torch.inference_mode()
def encode_all_entities(
    model: BiEncoder, titles: list[str], texts: list[str], batch_size: int = 128
) -> tuple[Tensor, Tensor]:
    """Entity token states [E, L, d] and masks [E, L] of the whole catalogue (padded to L)."""
    hidden, masks = [], []
    for start in range(0, len(titles), batch_size):
        tokens = model.tokenize_entities(
            titles[start : start + batch_size], texts[start : start + batch_size]
        )
        states, mask = model.encode_entities(tokens["input_ids"], tokens["attention_mask"])
        pad = model.entity_length - states.shape[1]
        hidden.append(torch.nn.functional.pad(states, (0, 0, 0, pad)))
        masks.append(torch.nn.functional.pad(mask, (0, pad)))
    return torch.cat(hidden), torch.cat(masks)


def exact_scores(
    model: BiEncoder,
    mention_hidden: Tensor,
    mention_mask: Tensor,
    entity_hidden: Tensor,
    entity_mask: Tensor,
    chunk: int = 512,
) -> Tensor:
    """s(x, y) of each mention against every entity [B, E], with the model's own scorer."""
    return torch.cat(
        [
            model.scorer.score(
                mention_hidden,
                mention_mask,
                entity_hidden[start : start + chunk],
                entity_mask[start : start + chunk],
            )
            for start in range(0, len(entity_hidden), chunk)
        ],
        dim=1,
    )


@torch.inference_mode()
def evaluate(
    model: BiEncoder, mentions: list[Mention], titles: list[str], texts: list[str]
) -> dict[int, float]:
    """Recall@k of every mention against the whole catalogue, scored exactly."""
    model.eval()
    entity_hidden, entity_mask = encode_all_entities(model, titles, texts)
    hits = np.zeros((len(mentions), len(KS)), dtype=bool)
    for start in range(0, len(mentions), 64):
        batch = mentions[start : start + 64]
        tokens = model.tokenize_mentions(
            [m.context_left for m in batch],
            [m.mention for m in batch],
            [m.context_right for m in batch],
        )
        hidden, mask = model.encode_mentions(tokens["input_ids"], tokens["attention_mask"])
        scores = exact_scores(model, hidden, mask, entity_hidden, entity_mask)
        top = torch.topk(scores, max(KS), dim=1).indices.numpy()
        for row, mention in enumerate(batch):
            golds = set(mention.golds or (mention.gold,))
            ranks = [i for i, e in enumerate(top[row]) if int(e) in golds]
            hits[start + row] = [bool(ranks) and ranks[0] < k for k in KS]
    return {k: float(hits[:, j].mean()) for j, k in enumerate(KS)}


def train(
    model: BiEncoder,
    negatives: str,
    mentions: list[Mention],
    titles: list[str],
    texts: list[str],
    budget: Budget,
    seed: int,
) -> float:
    """``budget.steps`` steps of eq. 11 with K negatives per mention; returns the last loss."""
    name, options = NEGATIVES[negatives]
    sampler = build_sampler(name, **options)
    needs_scores = name != "random"
    loss_fn = build_loss("nce")
    optimizer = torch.optim.AdamW(model.parameters(), lr=budget.learning_rate)
    generator = torch.Generator().manual_seed(seed)
    order = np.random.default_rng(seed).permutation(len(mentions))
    cursor, losses = 0, []
    entity_hidden = entity_mask = None
    for step in range(budget.steps):
        if needs_scores and step % budget.refresh_every == 0:
            model.eval()
            entity_hidden, entity_mask = encode_all_entities(model, titles, texts)
        model.train()
        if cursor + budget.batch_size > len(order):
            order, cursor = np.random.default_rng(seed + step).permutation(len(mentions)), 0
        batch = [mentions[i] for i in order[cursor : cursor + budget.batch_size]]
        cursor += budget.batch_size
        tokens = model.tokenize_mentions(
            [m.context_left for m in batch],
            [m.mention for m in batch],
            [m.context_right for m in batch],
        )
        mention_hidden, mention_mask = model.encode_mentions(
            tokens["input_ids"], tokens["attention_mask"]
        )
        scores = None
        if needs_scores:
            with torch.no_grad():
                scores = exact_scores(
                    model, mention_hidden.detach(), mention_mask, entity_hidden, entity_mask
                )
        gold = torch.tensor([m.gold for m in batch])
        sampled = sampler.sample(
            SamplingRequest(
                gold=gold,
                positives=[set(m.golds or (m.gold,)) for m in batch],
                num_entities=len(titles),
                num_negatives=budget.num_negatives,
                candidate_scores=scores,
                generator=generator,
            )
        )
        cand_ids = torch.cat([gold[:, None], sampled.ids.clamp(min=0)], dim=1)
        flat = cand_ids.reshape(-1).tolist()
        cand_tokens = model.tokenize_entities([titles[i] for i in flat], [texts[i] for i in flat])
        cand_hidden, cand_mask = model.encode_entities(
            cand_tokens["input_ids"], cand_tokens["attention_mask"]
        )
        candidates = cand_ids.shape[1]
        cand_scores = model.scorer.score_candidates(
            mention_hidden,
            mention_mask,
            cand_hidden.reshape(len(batch), candidates, *cand_hidden.shape[1:]),
            cand_mask.reshape(len(batch), candidates, -1),
        )
        loss = loss_fn(cand_scores[:, 0], cand_scores[:, 1:], sampled.valid)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(float(loss.detach()))
    model.eval()
    return float(np.mean(losses[-10:]))


def bm25_recall(mentions: list[Mention], titles: list[str], texts: list[str]) -> dict[int, float]:
    """BM25 over entity text (lemmas + definition), the mention string as the query."""
    corpus = [f"{title} {text}" for title, text in zip(titles, texts, strict=True)]
    retriever = bm25s.BM25()
    retriever.index(bm25s.tokenize(corpus, show_progress=False), show_progress=False)
    found, _ = retriever.retrieve(
        bm25s.tokenize([m.mention for m in mentions], show_progress=False),
        k=max(KS),
        show_progress=False,
    )
    hits = np.zeros((len(mentions), len(KS)), dtype=bool)
    for row, mention in enumerate(mentions):
        golds = set(mention.golds or (mention.gold,))
        ranks = [i for i, e in enumerate(found[row]) if int(e) in golds]
        hits[row] = [bool(ranks) and ranks[0] < k for k in KS]
    return {k: float(hits[:, j].mean()) for j, k in enumerate(KS)}


def write_results(
    cells: list[Cell],
    baselines: list[Cell],
    budget: Budget,
    counts: dict[str, int],
    path: Path,
    seconds: float,
) -> None:
    """The 12-cell table (recall@1 / recall@64) with baselines, as Markdown, and a PNG plot."""
    by_name = {cell.name: cell for cell in cells}
    lines = [
        "# WordNet: scorers × negatives at equal budget (paper §6.5, Table 1; Appendix A)",
        "",
        "Held-out mentions whose lemmas never occur in training, linked against a catalogue of "
        f"{counts['entities']} synsets (every gold, every other sense of the golds' lemmas, "
        f"random synsets); {counts['train']} train mentions, {counts['test']} held-out mentions.",
        f"Encoder: first {budget.layers} layers of all-MiniLM-L6-v2 in both towers; "
        f"{budget.steps} steps × {budget.batch_size} mentions × {budget.num_negatives} "
        f"negatives, lr {budget.learning_rate}, hard negatives exact over the catalogue with "
        f"entity states refreshed every {budget.refresh_every} steps; evaluation exact over the "
        "whole catalogue (poly-16 is not indexable). Command: "
        "`.venv/bin/python benchmarks/wordnet_comparison.py`"
        f" ({seconds / 60:.1f} min on this machine).",
        "",
        "Recall@1 / recall@64:",
        "",
        "| scorer | " + " | ".join(NEGATIVES) + " |",
        "|---|" + "---:|" * len(NEGATIVES),
    ]
    for scorer in SCORERS:
        row = [
            f"{by_name[f'{scorer} {neg}'].recall[1]:.3f} / {by_name[f'{scorer} {neg}'].recall[64]:.3f}"
            for neg in NEGATIVES
        ]
        lines.append(f"| {scorer} | " + " | ".join(row) + " |")
    lines += ["", "Baselines:", "", "| baseline | R@1 | R@64 |", "|---|---:|---:|"]
    for cell in baselines:
        lines.append(f"| {cell.name} | {cell.recall[1]:.3f} | {cell.recall[64]:.3f} |")
    lines += ["", "Training seconds and final loss (mean of the last 10 steps):", ""]
    lines += ["| run | seconds | final loss |", "|---|---:|---:|"]
    for cell in cells:
        lines.append(f"| {cell.name} | {cell.seconds:.0f} | {cell.final_loss:.3f} |")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    (path.with_suffix(".json")).write_text(
        json.dumps(
            {
                "budget": budget.__dict__,
                "counts": counts,
                "cells": [c.__dict__ for c in cells],
                "baselines": [c.__dict__ for c in baselines],
            },
            indent=2,
        )
        + "\n"
    )
    plot(cells, baselines, path.with_suffix(".png"))
    update_benchmarks_md()


def plot(cells: list[Cell], baselines: list[Cell], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_name = {cell.name: cell for cell in cells}
    figure, axes = plt.subplots(1, 2, figsize=(11, 4))
    width = 0.25
    x = np.arange(len(SCORERS))
    for axis, k in zip(axes, KS, strict=True):
        for offset, negatives in enumerate(NEGATIVES):
            values = [by_name[f"{scorer} {negatives}"].recall[k] for scorer in SCORERS]
            axis.bar(x + (offset - 1) * width, values, width, label=negatives)
        for style, cell in zip(("--", ":"), baselines, strict=False):
            axis.axhline(cell.recall[k], color="grey", linestyle=style, label=cell.name)
        axis.set_xticks(x, list(SCORERS))
        axis.set_title(f"recall@{k}, held-out WordNet lemmas")
        axis.set_ylim(0, 1)
    axes[0].legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--work-dir", type=Path, default=Path("runs/wordnet-comparison"))
    parser.add_argument("--wordnet-dir", type=Path, default=Path("/usr/share/wordnet"))
    parser.add_argument("--entities", type=int, default=1000)
    parser.add_argument("--train-mentions", type=int, default=2000)
    parser.add_argument("--test-mentions", type=int, default=300)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--negatives", type=int, default=4)
    parser.add_argument("--learning-rate", type=float, default=1e-4)
    parser.add_argument("--refresh-every", type=int, default=10)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--length", type=int, default=24, help="mention and entity tokens")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=RESULTS / "wordnet_comparison.md")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    budget = Budget(
        steps=args.steps,
        batch_size=args.batch_size,
        num_negatives=args.negatives,
        learning_rate=args.learning_rate,
        refresh_every=args.refresh_every,
        layers=args.layers,
        mention_length=args.length,
        entity_length=args.length,
    )
    data = prepare_data(
        args.work_dir, args.wordnet_dir, args.entities, args.train_mentions, args.test_mentions
    )
    catalogue = EntityCatalogue.open(data)
    titles, texts = catalogue.titles().to_pylist(), catalogue.texts().to_pylist()
    train_mentions = MentionSplit.open(mention_split_path(data, "train")).read_all()
    test_mentions = MentionSplit.open(mention_split_path(data, "test")).read_all()
    counts = {"entities": len(titles), "train": len(train_mentions), "test": len(test_mentions)}
    print(f"data: {counts}")

    baselines = [
        Cell(
            f"untrained (MiniLM-L{args.layers}, dual)",
            evaluate(build_model(SCORERS["dual"], budget, args.seed), test_mentions, titles, texts),
            0.0,
        ),
        Cell("BM25 (mention string)", bm25_recall(test_mentions, titles, texts), 0.0),
    ]
    for cell in baselines:
        print(f"{cell.name}: R@1 {cell.recall[1]:.3f} R@64 {cell.recall[64]:.3f}", flush=True)
    cells = []
    runs = [(scorer, negatives) for scorer in SCORERS for negatives in NEGATIVES]
    for scorer, negatives in tqdm(runs, desc="runs", unit="run"):
        run_started = time.perf_counter()
        model = build_model(SCORERS[scorer], budget, args.seed)
        loss = train(model, negatives, train_mentions, titles, texts, budget, args.seed)
        recall = evaluate(model, test_mentions, titles, texts)
        cell = Cell(f"{scorer} {negatives}", recall, time.perf_counter() - run_started, loss)
        cells.append(cell)
        print(
            f"{cell.name}: R@1 {recall[1]:.3f} R@64 {recall[64]:.3f} "
            f"loss {loss:.3f} ({cell.seconds:.0f}s)",
            flush=True,
        )
    write_results(cells, baselines, budget, counts, args.out, time.perf_counter() - started)
    print(f"written {args.out} and {args.out.with_suffix('.png')}")


if __name__ == "__main__":
    main()

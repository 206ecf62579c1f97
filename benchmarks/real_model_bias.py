"""Gradient bias of NCE negatives on a real retriever as it trains (Zhang & Stratos (2021), Theorem 3.1).

The synthetic experiment of §6.4 (``hnce bias``) measures ‖E[∇J_NCE] − ∇J_CE‖ on a toy model.
This measures it on the real thing: all-MiniLM-L6-v2 trained by ``hnce train`` on WordNet
(mixed-50 negatives, asynchronous refresh), at every checkpoint, over a catalogue small enough
for the exact cross-entropy gradient (eq. 2: a softmax over every entity). For a batch of training
mentions the model's scores against the whole catalogue are the logits, and
``hnce.mining.bias.gradient_bias`` takes the norm over *all* parameters of both towers of the
difference between the Monte Carlo expectation of the NCE gradient (eq. 5) and the exact CE
gradient, for negatives drawn

- ``random``: uniformly;
- ``hard``: ∝ exp(s) without replacement over the whole catalogue (eq. 8, the current model);
- ``mixed-50``: half hard, half random (Appendix A);
- ``shared``: mixed-50 drawn per mention, then every mention of the batch scored against every
  mention's negatives and golds except its own positives (``negatives.share: batch``).

Theorem 3.1: the bias vanishes when the negative distribution matches the model; hard negatives
approach it as the model improves, random ones do not.

    .venv/bin/python -m benchmarks.real_model_bias

writes ``benchmarks/results/real_model_bias.md`` and ``.png``.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from benchmarks import harness
from benchmarks.training_runs import checkpoint_export
from benchmarks.wordnet_runs import (
    every_checkpoint_kept,
    prepare_dataset,
    recipe,
    wordnet_arguments,
)
from hnce.cluster.stores.run_events import read_events
from hnce.cluster.stores.tables import mention_split_path
from hnce.cluster.stores.tables_read import EntityCatalogue, MentionSplit
from hnce.encoders.biencoder import BiEncoder, load_biencoder
from hnce.events import RunEvent
from hnce.mining.bias import default_samplers, gradient_bias
from hnce.mining.samplers import NegativeSampler
from hnce.mining.samplers.base import SampledNegatives, SamplingRequest
from hnce.pipeline.recipe_models import untrained_export
from hnce.pipeline.train.trainer import run_training
from hnce.progress import quiet


@dataclass
class SharedNegatives:
    """Shared negatives as the trainer's ``share: batch`` builds them: each group of
    ``batch_size`` consecutive mentions (one micro-batch of one draw) pools every mention's drawn
    negatives and golds; a mention's negatives are the pool minus its own positives."""

    base: NegativeSampler
    batch_size: int

    def sample(self, request: SamplingRequest) -> SampledNegatives:
        drawn = self.base.sample(request)
        rows = len(request.gold)
        pools = torch.cat([request.gold[:, None], drawn.ids], dim=1)
        pool_valid = torch.cat([torch.ones(rows, 1, dtype=torch.bool), drawn.valid], dim=1)
        width = self.batch_size * pools.shape[1]
        ids = torch.full((rows, width), -1, dtype=torch.long)
        valid = torch.zeros((rows, width), dtype=torch.bool)
        for start in range(0, rows, self.batch_size):
            group = slice(start, min(start + self.batch_size, rows))
            members = pools[group][pool_valid[group]].unique()
            for row in range(group.start, group.stop):
                keep = members[~torch.isin(members, torch.tensor(sorted(request.positives[row])))]
                ids[row, : len(keep)] = keep
                valid[row, : len(keep)] = True
        return SampledNegatives(ids, valid, None)


class CatalogueLogits(nn.Module):
    """Scores of a batch of mentions against every catalogue entity: the logits of eq. 2."""

    def __init__(self, model: BiEncoder, entity_tokens: dict[str, Tensor]) -> None:
        super().__init__()
        self.model = model
        self.entity_tokens = entity_tokens

    def forward(self, mention_tokens: dict[str, Tensor]) -> Tensor:
        return self.model(mention_tokens, self.entity_tokens)


def measure(export: Path, data: Path, args: argparse.Namespace) -> dict[str, float]:
    """Bias norms of every sampler for the model exported in ``export``."""
    model = load_biencoder(export).train()  # dropout as in training
    catalogue = EntityCatalogue.open(data)
    entities = model.tokenize_entities(
        catalogue.titles().to_pylist(), catalogue.texts().to_pylist()
    )
    mentions = MentionSplit.open(mention_split_path(data, "train")).read_all()[: args.mentions]
    tokens = model.tokenize_mentions(
        [m.context_left for m in mentions],
        [m.mention for m in mentions],
        [m.context_right for m in mentions],
    )
    labels = torch.tensor([m.gold for m in mentions])
    samplers = default_samplers(0.5)
    samplers["mixed-50"] = samplers.pop("mixed")
    samplers["shared"] = SharedNegatives(samplers["mixed-50"], args.batch_size)
    torch.manual_seed(0)
    estimate = gradient_bias(
        CatalogueLogits(model, entities),
        tokens,
        labels,
        samplers,
        num_negatives=args.negatives,
        draws=args.draws,
        generator=torch.Generator().manual_seed(0),
    )
    return {"ce_loss": estimate.ce_loss, "ce_gradient": estimate.ce_gradient_norm} | {
        f"bias {name}": value for name, value in estimate.bias_norm.items()
    }


def parse_args() -> argparse.Namespace:
    """The command line options."""
    parser = wordnet_arguments(
        __doc__, "real_model_bias", Path("runs/real-model-bias"), 500, test_mentions=100
    )
    parser.add_argument("--steps", type=int, default=60, help="training steps")
    parser.add_argument("--checkpoint-every", type=int, default=10)
    parser.add_argument("--negatives", type=int, default=8, help="K per mention")
    parser.add_argument("--draws", type=int, default=10, help="Monte Carlo draws of E[∇NCE]")
    parser.add_argument("--mentions", type=int, default=32, help="mentions per measurement")
    parser.add_argument("--batch-size", type=int, default=8, help="micro-batch of 'shared'")
    return harness.parse(parser)


def trained_exports(args: argparse.Namespace) -> tuple[Path, dict[int, Path]]:
    """The dataset and the export of every checkpoint by step (0: the untrained model), training
    first unless the run under ``work_dir`` has already ended."""
    data = prepare_dataset(args.work_dir, args.entities, args.train_mentions, args.test_mentions)
    run_dir = args.work_dir / "run"
    config = recipe(
        run_dir,
        data,
        *every_checkpoint_kept(args.steps, args.checkpoint_every),
        "negatives.sampler=mixed",
    )
    if not read_events(run_dir, RunEvent.END):
        run_training(config)
    exports = {0: untrained_export(config)} | {
        int(e["step"]): checkpoint_export(run_dir, int(e["step"]))
        for e in read_events(run_dir, RunEvent.CHECKPOINT)
    }
    return data, exports


def measured_rows(
    exports: dict[int, Path], data: Path, args: argparse.Namespace
) -> dict[str, dict[str, float]]:
    """Measurements by step, kept in ``work_dir/state.json``: a step already there is not
    measured again (each kept as (name, value) pairs: the table's columns keep their order)."""
    state = harness.StageState(args.work_dir / "state.json").load()
    for step, export in exports.items():
        if not state.done(str(step)):
            measures = state.once(str(step), lambda e=export: list(measure(e, data, args).items()))
            print(f"step {step}: {dict(measures)}", flush=True)
    return {step: dict(measures) for step, measures in state.results().items()}


def plot_bias(
    rows: dict[str, dict[str, float]], steps: list[int], names: list[str], png: Path
) -> None:
    """Each sampler's bias norm against the training step (log scale), saved as ``png``."""
    with harness.plot(png, figsize=(6, 4)) as (_, axis):
        for name in names:
            axis.plot(steps, [rows[str(s)][name] for s in steps], marker="o", label=name[5:])
        axis.set_xlabel("training step (hnce train, mixed-50, async refresh)")
        axis.set_ylabel("‖E[∇NCE] − ∇CE‖ over all parameters")
        axis.set_yscale("log")
        axis.legend()
        axis.set_title("Gradient bias on a real retriever (WordNet, MiniLM)")


def report_lines(
    args: argparse.Namespace,
    rows: dict[str, dict[str, float]],
    steps: list[int],
    names: list[str],
    png: Path,
    seconds: float,
) -> list[str]:
    """The result file's markdown lines: the setting, one table row per step, the figure."""
    header = ["step", "CE loss", "‖∇CE‖", *(n[5:] for n in names)]
    lines = [
        "# Gradient bias on a real retriever as it trains (Zhang & Stratos (2021), Theorem 3.1)",
        "",
        f"all-MiniLM-L6-v2 trained by `hnce train` on WordNet (mixed-50, asynchronous refresh, "
        f"{args.steps} steps × 8 mentions); at each checkpoint, {args.mentions} training "
        f"mentions scored against all {args.entities} catalogue entities (exact CE, eq. 2), "
        f"E[∇NCE] from {args.draws} draws of K = {args.negatives} negatives, norm over all "
        f"parameters of both towers. `shared`: mixed-50 pooled over micro-batches of "
        f"{args.batch_size} (`negatives.share: batch`). Command: "
        f"`.venv/bin/python -m benchmarks.real_model_bias` "
        f"({seconds / 60:.0f} min for the steps not already measured).",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---:|" * len(header),
    ]
    for step in steps:
        row = rows[str(step)]
        values = [row["ce_loss"], row["ce_gradient"], *(row[n] for n in names)]
        lines.append(f"| {step} | " + " | ".join(f"{v:.4f}" for v in values) + " |")
    lines += ["", f"![bias against steps]({png.name})"]
    return lines


@quiet()  # no progress bars from hnce in this process
def main() -> None:
    args = parse_args()
    timer = harness.Timer()
    data, exports = trained_exports(args)
    rows = measured_rows(exports, data, args)
    steps = sorted(int(s) for s in rows)
    names = [k for k in rows[str(steps[0])] if k.startswith("bias ")]
    png = args.output.with_suffix(".png")
    plot_bias(rows, steps, names, png)
    harness.write_result(args.output, report_lines(args, rows, steps, names, png, timer.elapsed()))


if __name__ == "__main__":
    main()

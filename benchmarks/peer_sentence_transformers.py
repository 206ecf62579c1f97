"""Against the peer: sentence-transformers (``mine_hard_negatives`` once + MultipleNegativesRankingLoss)
vs ``hnce train`` (mixed-50 on the asynchronous refresh, shared negatives), same data, model,
budget and cores.

Both start from the packaged all-MiniLM-L6-v2 (local path, nothing downloaded) on the demo's
WordNet subset (``hnce.pipeline.demo.demo_dataset``: configs/demo.yaml's lemma-disjoint train /
held-out split and catalogue). hnce trains as the demo recipe does (60 steps × 8 mentions, K = 8,
1 trainer core + 1 refresh core). The peer trains on the very mentions hnce trained on (read from
hnce's step events), 60 steps × 8, each with 8 negatives mined once by ``mine_hard_negatives``
over the same catalogue, on 2 torch threads. Both see the same token sequences: the peer's texts
are hnce's BLINK-formatted token ids decoded, with the markers registered in its tokenizer.

Evaluation is one code path for every model (:func:`exact_recall`): hnce's ``BiEncoder`` embeds
the held-out mentions and the whole catalogue, scores are exact, recall from
``hnce.pipeline.evaluate``. The peer's saved model loads as a ``BiEncoder`` with its declared (mean)
pooling and its vectors are L2-normalised, as its Normalize module and cosine loss use them. The
hnce final checkpoint is also evaluated through the product's path (``evaluate_export``: encoder
actors + FAISS) as a check that the exact path measures the same thing. ``--cosine`` also trains
hnce with ``model.normalize: true``, the peer's temperature (0.05, its scale 20) and negatives
version 0 mined with the starting model (``negatives.initial: model``) on the same mentions.
Finally one hnce training step is profiled (torch.profiler, in-process, 1 thread as in the run).
Each method's curve is kept in ``<work>/curves.json`` and not trained again, so an
interrupted run resumes method by method (``--work`` a kept directory).

    .venv/bin/pip install -c constraints.txt -e '.[bench]'
    .venv/bin/python benchmarks/peer_sentence_transformers.py
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import ray
import torch
import torch.distributed as dist
from report import write_result
from wordnet_runs import checkpoint_export

from hnce.cluster.stores.tables import Mention, mention_split_path
from hnce.cluster.stores.tables_read import EntityCatalogue, MentionSplit
from hnce.encoders.biencoder import BiEncoder, build_biencoder, load_biencoder, minilm_path
from hnce.encoders.formatting import register_markers
from hnce.pipeline.config import Config, load_config
from hnce.pipeline.demo import demo_dataset
from hnce.pipeline.evaluate import evaluate_export
from hnce.pipeline.metrics import hits_at, summarise
from hnce.pipeline.train.events import read_events
from hnce.pipeline.train.task import TrainingTask
from hnce.pipeline.train.trainer import run_training
from hnce.pipeline.train.worker import WorkerRun

if TYPE_CHECKING:
    from datasets import Dataset
    from sentence_transformers import SentenceTransformer, SentenceTransformerTrainingArguments
    from transformers import TrainerCallback

ROOT = Path(__file__).resolve().parents[1]
KS = (1, 8, 64)
ENCODE_BATCH = 256


@dataclass
class Curve:
    """Recall of one method at a few points of its training: (wall seconds, step, R@k)."""

    name: str
    points: list[tuple[float, int, dict[int, float]]] = field(default_factory=list)

    @property
    def final(self) -> dict[int, float]:
        return self.points[-1][2]

    def seconds_to_reach(self, recall_at_1: float) -> float | None:
        """Wall seconds at the first measured point whose R@1 reaches ``recall_at_1``."""
        return next((s for s, _, r in self.points if r[1] >= recall_at_1), None)


@dataclass
class Trained:
    """One method's finished run: its curve, wall seconds (``total`` and, for the peer,
    ``mining``), the mention ids it trained on in order, and the product-path check."""

    curve: Curve
    seconds: dict[str, float]
    trained: list[str] = field(default_factory=list)
    product: dict[int, float] | None = None


class CurveCache:
    """``curves.json`` in the work directory: every method finished so far, by key."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.entries = json.loads(path.read_text()) if path.is_file() else {}

    def get(self, key: str) -> Trained | None:
        raw = self.entries.get(key)
        if raw is None:
            return None
        points = [(s, step, {int(k): v for k, v in r.items()}) for s, step, r in raw["points"]]
        product = raw.get("product")
        return Trained(
            Curve(raw["name"], points),
            raw["seconds"],
            raw.get("trained", []),
            None if product is None else {int(k): v for k, v in product.items()},
        )

    def put(self, key: str, done: Trained) -> Trained:
        self.entries[key] = {
            "name": done.curve.name,
            "points": done.curve.points,
            "seconds": done.seconds,
            "trained": done.trained,
            "product": done.product,
        }
        self.path.write_text(json.dumps(self.entries, indent=1) + "\n")
        return done


@dataclass
class HeldOut:
    """The held-out mentions and the catalogue every model is evaluated on."""

    mentions: list[Mention]
    titles: list[str | None]
    texts: list[str]


def exact_recall(model: BiEncoder, held_out: HeldOut, normalise: bool) -> dict[int, float]:
    """R@k of ``model`` over the whole catalogue, scored exactly (dual: one vector a side)."""
    return recall_of(*embed(model, held_out), held_out, normalise)


def embed(model: BiEncoder, held_out: HeldOut) -> tuple[torch.Tensor, torch.Tensor]:
    """Query vectors [M, d] of the held-out mentions and index vectors [E, d] of the catalogue."""
    model.eval()
    with torch.inference_mode():
        entities = []
        for start in range(0, len(held_out.texts), ENCODE_BATCH):
            tokens = model.tokenize_entities(
                held_out.titles[start : start + ENCODE_BATCH],
                held_out.texts[start : start + ENCODE_BATCH],
            )
            entities.append(model.entity_index_vectors(**tokens)[0])
        mentions = held_out.mentions
        tokens = model.tokenize_mentions(
            [m.context_left for m in mentions],
            [m.mention for m in mentions],
            [m.context_right for m in mentions],
        )
        queries = model.mention_query_vectors(**tokens)[:, 0].float()
    return queries, torch.cat(entities)


def recall_of(
    queries: torch.Tensor, catalogue: torch.Tensor, held_out: HeldOut, normalise: bool
) -> dict[int, float]:
    """R@k of exact inner-product (or, ``normalise``d, cosine) search of every mention."""
    mentions = held_out.mentions
    with torch.inference_mode():
        if normalise:
            queries = torch.nn.functional.normalize(queries, dim=-1)
            catalogue = torch.nn.functional.normalize(catalogue, dim=-1)
        candidates = (queries @ catalogue.T).topk(max(KS), dim=1).indices.numpy()
    golds = [m.golds for m in mentions]
    hits = hits_at(candidates, golds, KS)
    report = summarise("", hits, [m.domain for m in mentions], KS, len(held_out.texts))
    return {k: report.recall[k] for k in KS}


def train_hnce(
    config: Config, checkpoints: Sequence[int], label: str = "hnce"
) -> tuple[Curve, list[str], list[str], float]:
    """``hnce train`` as the demo's mixed-50 run: the curve over its checkpoints (wall seconds
    from the call to each checkpoint's publication), their exports, the mention ids it trained
    on in order, its seconds."""
    started = time.time()
    run_training(config, progress=False)
    seconds = time.time() - started
    published = {e["step"]: e["time"] - started for e in read_events(config.run_dir, "checkpoint")}
    trained = [m for e in read_events(config.run_dir, "step") for m in e["mentions"]]
    model_dirs = {s: checkpoint_export(config.run_dir, s) for s in checkpoints}
    switches = read_events(config.run_dir, "negatives")
    curve = Curve(f"{label} (mixed-50, async refresh: {len(switches)} index versions used)")
    curve.points = [(published[s], s, {}) for s in checkpoints]
    return curve, [str(d) for d in model_dirs.values()], trained, seconds


def peer_texts(model: BiEncoder, mentions: Sequence[Mention], catalogue: HeldOut) -> tuple:
    """The strings the peer trains on: hnce's formatted token ids decoded (markers kept)."""

    def decode(ids: torch.Tensor) -> list[str]:
        return [
            model.tokenizer.decode(row[1:], skip_special_tokens=False)
            .replace("[SEP]", "")
            .replace("[PAD]", "")
            .strip()
            for row in ids.tolist()
        ]

    anchors = decode(
        model.tokenize_mentions(
            [m.context_left for m in mentions],
            [m.mention for m in mentions],
            [m.context_right for m in mentions],
        )["input_ids"]
    )
    corpus = decode(model.tokenize_entities(catalogue.titles, catalogue.texts)["input_ids"])
    return anchors, corpus


def train_peer(
    anchors: list[str],
    positives: list[str],
    corpus: list[str],
    config: Config,
    output: Path,
    checkpoints: Sequence[int],
) -> tuple[Curve, dict[str, float]]:
    """mine_hard_negatives once, then MultipleNegativesRankingLoss for the same steps and batch;
    the model saved at each checkpoint step with its wall seconds since the start."""
    from sentence_transformers import SentenceTransformer, SentenceTransformerTrainer
    from sentence_transformers.losses import MultipleNegativesRankingLoss

    started = time.perf_counter()
    peer = SentenceTransformer(str(minilm_path()), device="cpu")
    peer.max_seq_length = config.model.mention_length
    register_markers(peer.tokenizer)
    mined = mine_peer_negatives(peer, anchors, positives, corpus, config.negatives.num_negatives)
    mined_at = time.perf_counter() - started
    curve = Curve("sentence-transformers (mined once, MNRL)")
    trainer = SentenceTransformerTrainer(
        model=peer,
        args=peer_training_arguments(config, output),
        train_dataset=mined,
        loss=MultipleNegativesRankingLoss(peer),
        callbacks=[save_peer_at(checkpoints, peer, output, curve, started)],
    )
    trainer.train()
    return curve, {"mine_hard_negatives": mined_at, "total": time.perf_counter() - started}


def mine_peer_negatives(
    peer: SentenceTransformer,
    anchors: list[str],
    positives: list[str],
    corpus: list[str],
    num_negatives: int,
) -> Dataset:
    """The peer's training tuples: each (anchor, positive) with the ``num_negatives`` top
    candidates of ``corpus`` by the starting model, mined once by ``mine_hard_negatives``."""
    from datasets import Dataset
    from sentence_transformers.util import mine_hard_negatives

    pairs = Dataset.from_dict({"anchor": anchors, "positive": positives})
    return mine_hard_negatives(
        pairs,
        peer,
        corpus=corpus,
        num_negatives=num_negatives,
        sampling_strategy="top",
        output_format="n-tuple",
        batch_size=128,
        verbose=False,
    )


def peer_training_arguments(config: Config, output: Path) -> SentenceTransformerTrainingArguments:
    """The peer's trainer settings: the recipe's steps, batch, learning rate, warm-up, gradient
    clipping and seed, on the CPU, no-duplicates batches, no trainer checkpoints."""
    from sentence_transformers import SentenceTransformerTrainingArguments
    from sentence_transformers.training_args import BatchSamplers

    training = config.training
    return SentenceTransformerTrainingArguments(
        output_dir=str(output / "trainer"),
        max_steps=training.steps,
        per_device_train_batch_size=training.batch_size,
        learning_rate=training.learning_rate,
        warmup_steps=training.warmup_steps,
        lr_scheduler_type="linear",
        max_grad_norm=training.max_grad_norm,
        batch_sampler=BatchSamplers.NO_DUPLICATES,
        save_strategy="no",
        logging_steps=10,
        report_to="none",
        use_cpu=True,
        seed=config.run.seed,
        dataloader_num_workers=0,
    )


def save_peer_at(
    checkpoints: Sequence[int],
    peer: SentenceTransformer,
    output: Path,
    curve: Curve,
    started: float,
) -> TrainerCallback:
    """A trainer callback that saves ``peer`` at each checkpoint step (:func:`peer_checkpoint`)
    and adds the step to ``curve`` with its wall seconds since ``started``."""
    from transformers import TrainerCallback

    class SaveAt(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step in checkpoints:
                seconds = time.perf_counter() - started
                peer.save(str(peer_checkpoint(output, state.global_step)))
                curve.points.append((seconds, state.global_step, {}))

    return SaveAt()


def peer_checkpoint(output: Path, step: int) -> Path:
    """Where the peer's model of checkpoint ``step`` is saved."""
    return output / f"step-{step}"


def profile_hnce_step(config: Config, steps: int = 3) -> tuple[str, dict[str, float]]:
    """torch.profiler over ``steps`` training steps of the hnce worker loop, in this process
    (a gloo group of one; 1 thread as the run's worker), after 2 warm-up steps; returns the
    op table and the mean seconds of batch assembly vs forward + backward + optimizer step."""
    from hnce.pipeline.train.step import train_micro_batch

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = str(probe.getsockname()[1])
    os.environ.update(
        {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1"}
        | {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}
    )
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        run = WorkerRun.build(
            config, TrainingTask.retriever(config), torch.device("cpu"), 1, lambda *_: None
        )
        run.engine.train()
        timings: dict[str, list[float]] = {"batch assembly": [], "train_micro_batch": []}

        def step(index: int) -> None:
            mark = time.perf_counter()
            with torch.profiler.record_function("batch assembly"):
                batch = run.micro_batch(index).to(run.device)
            timings["batch assembly"].append(time.perf_counter() - mark)
            mark = time.perf_counter()
            with torch.profiler.record_function("train_micro_batch"):
                train_micro_batch(run.engine, batch, run.loss)
            timings["train_micro_batch"].append(time.perf_counter() - mark)

        for index in range(2):
            step(index)
        for values in timings.values():
            values.clear()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
            for index in range(2, 2 + steps):
                step(index)
        table = profile.key_averages().table(sort_by="cpu_time_total", row_limit=18)
        return table, {name: float(np.mean(values)) for name, values in timings.items()}
    finally:
        dist.destroy_process_group()


def evaluate_curve(
    curve: Curve, model_dirs: Sequence[str], load: Callable[[str], BiEncoder], held_out: HeldOut
) -> None:
    """Fill ``curve``'s recall at each of its points from the saved models."""
    normalise = curve.name.startswith("sentence")
    for index, directory in enumerate(model_dirs):
        seconds, step, _ = curve.points[index]
        curve.points[index] = (seconds, step, exact_recall(load(directory), held_out, normalise))


def recall_cells(recall: dict[int, float]) -> str:
    return " | ".join(f"{recall[k]:.3f}" for k in KS)


def reach(curve: Curve, other: Curve) -> str:
    target = other.final[1]
    seconds = curve.seconds_to_reach(target)
    if seconds is None:
        return f"not reached (final R@1 {curve.final[1]:.3f} < {target:.3f})"
    return f"{seconds:.0f} s (R@1 ≥ {target:.3f})"


def findings(runs: Sequence[Trained], peer: Trained) -> list[str]:
    """Plain statements of who wins what, from the measured figures."""
    lines = []
    theirs_seconds = peer.seconds["total"]
    for run in runs:
        name = run.curve.name.split(" (")[0]
        for k in KS:
            ours, theirs = run.curve.final[k], peer.curve.final[k]
            winner = name if ours > theirs else "sentence-transformers" if theirs > ours else "tie"
            lines.append(f"- R@{k}: {name} {ours:.3f} vs peer {theirs:.3f}: **{winner}**.")
        faster = name if run.seconds["total"] < theirs_seconds else "sentence-transformers"
        lines.append(
            f"- Wall-clock to the end of training: {name} {run.seconds['total']:.0f} s vs peer "
            f"{theirs_seconds:.0f} s (of which mining {peer.seconds['mine_hard_negatives']:.0f} "
            f"s): **{faster}**."
        )
    for run in runs:
        parts = run.seconds
        lines.append(
            f"- Where {run.curve.name.split(' (')[0]}'s {parts['total']:.0f} s went: "
            f"{parts['before first step']:.0f} s before its first step (Ray, Ray Train and "
            f"DeepSpeed start-up, model load, negatives version 0), {parts['steps']:.0f} s in "
            f"its steps ({parts['per step']:.2f} s a step on 1 thread, the refresh on the other "
            f"core), {parts['rest']:.0f} s checkpoints, polls and shutdown."
        )
    mining, steps = peer.seconds["mine_hard_negatives"], peer.curve.points[-1][1]
    lines.append(
        f"- Where the peer's {theirs_seconds:.0f} s went: {mining:.0f} s loading and mining, "
        f"{(theirs_seconds - mining) / steps:.2f} s a step on 2 threads."
    )
    return lines


def write_results(
    out: Path,
    counts: dict[str, int],
    untrained: dict[str, dict[int, float]],
    runs: Sequence[Trained],
    peer: Trained,
    total_seconds: float,
    profile: tuple[str, dict[str, float]],
) -> None:
    """The markdown result file (how it was measured, final recall, recall during training, the
    product-path check, findings, the step profile); BENCHMARKS.md rebuilt, the file printed."""
    lines = [
        "# Against the peer: sentence-transformers vs `hnce train` (WordNet demo subset)",
        "",
        how_measured(counts, total_seconds),
        "",
        *final_recall_table(runs, peer, untrained),
        "",
        *recall_during_training(runs, peer),
        "",
        *product_path_check(runs[0]),
        "Findings:",
        "",
        *findings(runs, peer),
        "",
        *step_profile(*profile),
    ]
    write_result(out, lines)


def how_measured(counts: dict[str, int], total_seconds: float) -> str:
    """The paragraph on the machine, the data, both methods' settings and the evaluation."""
    return (
        f"Measured by `benchmarks/peer_sentence_transformers.py` ({total_seconds / 60:.1f} min "
        f"for the methods not already in its work directory's curves.json; "
        f"{platform.machine()}, {os.cpu_count()} cores shared with other jobs). Data: the "
        f"demo's subset (configs/demo.yaml): "
        f"{counts['eval_mentions']} held-out mentions whose lemmas training never saw, "
        f"{counts['entities']} synsets; both start from all-MiniLM-L6-v2 (mean pooling, as it "
        f"declares) and train 60 steps × 8 mentions, 8 negatives each, lr 5e-5, 6 warm-up steps. "
        f"hnce: mixed-50 on the asynchronous refresh, 1 trainer core + 1 refresh core, "
        f"`negatives.share: batch` (every mention against every candidate of its step); the "
        f"cosine row adds `model.normalize: true`, temperature 0.05 and `negatives.initial: "
        f"model` (hard negatives from step 1, as the peer's). Peer: "
        f"`mine_hard_negatives` (top 8 by cosine over the catalogue) once, then "
        f"MultipleNegativesRankingLoss (in-batch + mined negatives, cosine × 20, no-duplicates "
        f"batches) on the same 480 mentions, 2 torch threads. Evaluation: one exact path for "
        f"every model (hnce's towers embed, exact scores over the whole catalogue; the peer's "
        f"vectors L2-normalised as its Normalize module and cosine loss use them)."
    )


def final_recall_table(
    runs: Sequence[Trained], peer: Trained, untrained: dict[str, dict[int, float]]
) -> list[str]:
    """Each method's final recall, wall seconds and time to reach the other's final R@1, then
    the untrained model under either scoring."""
    rows = [
        f"| {run.curve.name} | {recall_cells(run.curve.final)} | {run.seconds['total']:.0f} | "
        f"{reach(run.curve, peer.curve)} |"
        for run in runs
    ]
    rows += [
        f"| {peer.curve.name} | {recall_cells(peer.curve.final)} | {peer.seconds['total']:.0f} | "
        f"{reach(peer.curve, runs[0].curve)}, against the first row |"
    ]
    return [
        "| method | R@1 | R@8 | R@64 | wall s | time to reach the other's final R@1 |",
        "|---|---:|---:|---:|---:|---|",
        *rows,
        f"| untrained MiniLM, mean pooling, dot product (hnce's scoring) | "
        f"{recall_cells(untrained['dot'])} | | |",
        f"| untrained MiniLM, mean pooling, cosine (the peer's scoring) | "
        f"{recall_cells(untrained['cosine'])} | | |",
    ]


def recall_during_training(runs: Sequence[Trained], peer: Trained) -> list[str]:
    """The table of every method's recall at each of its checkpoints, with its wall seconds."""
    return [
        "Recall during training (wall seconds from each method's start: hnce from the "
        "`run_training` call, Ray and DeepSpeed start-up included; the peer from loading the "
        "model, mining included):",
        "",
        "| method | step | seconds | R@1 | R@8 | R@64 |",
        "|---|---:|---:|---:|---:|---:|",
        *(
            f"| {run.curve.name} | {step} | {secs:.0f} | {recall_cells(recall)} |"
            for run in [*runs, peer]
            for secs, step, recall in run.curve.points
        ),
    ]


def product_path_check(run: Trained) -> list[str]:
    """``run``'s final recall through ``evaluate_export`` against the exact path's, with the
    blank line after it; nothing when the product path was not measured."""
    if run.product is None:
        return []
    return [
        f"Check of the evaluation path: hnce's final export through the product's "
        f"`evaluate_export` (encoder actors + FAISS flat index): {recall_cells(run.product)} "
        f"(R@1 / R@8 / R@64), against {recall_cells(run.curve.final)} by the exact "
        f"path.",
        "",
    ]


def step_profile(table: str, phases: dict[str, float]) -> list[str]:
    """The profiled hnce step: seconds of batch assembly vs the rest, and the operator table."""
    return [
        f"Profile of one hnce training step (torch.profiler, in-process worker loop, 1 thread as "
        f"in the run; random negatives before any refresh, same batch shape): batch assembly "
        f"(Parquet look-ups of the candidates, tokenization, negatives drawn) "
        f"{phases['batch assembly']:.2f} s, forward + backward + optimizer step "
        f"{phases['train_micro_batch']:.2f} s per step. Top operators by total CPU time:",
        "",
        "```",
        table.strip(),
        "```",
    ]


def held_out_set(config: Config) -> HeldOut:
    root = Path(config.data.root)
    catalogue = EntityCatalogue.open(root)
    mentions = MentionSplit.open(mention_split_path(root, config.data.eval_split)).read_all()
    return HeldOut(mentions, catalogue.titles().to_pylist(), catalogue.texts().to_pylist())


# The peer's own strengths given to hnce: cosine at its temperature, and hard negatives from the
# first step (version 0 mined with the starting model, as mine_hard_negatives does) before the
# asynchronous refresh takes over.
COSINE = ("model.normalize=true", "loss.options={temperature: 0.05}", "negatives.initial=model")


def parse_args() -> argparse.Namespace:
    """The command line: checkpoint steps, the optional extra measures, work directory, recipe
    overrides and the result file."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoints", default="30,60")
    parser.add_argument(
        "--check-product",
        action="store_true",
        help="also evaluate hnce's final export through evaluate_export (actors + FAISS)",
    )
    parser.add_argument(
        "--cosine",
        action="store_true",
        help="also train hnce with model.normalize, the peer's temperature 0.05 and "
        "negatives version 0 mined with the starting model",
    )
    parser.add_argument("--work", type=Path, default=None, help="default: a temporary directory")
    parser.add_argument("--set", action="append", default=[], help="recipe overrides (smoke runs)")
    parser.add_argument(
        "--out", type=Path, default=ROOT / "benchmarks/results/peer_sentence_transformers.md"
    )
    return parser.parse_args()


def shared_recipe(work: Path, checkpoints: Sequence[int], overrides: Sequence[str]) -> list[str]:
    """configs/demo.yaml's overrides every method shares: the run under ``work``, trained up to
    the last checkpoint, every checkpoint kept, shared negatives, then ``overrides``."""
    return [
        f"run.dir={work}",
        f"training.steps={checkpoints[-1]}",
        # the demo's checkpoint_every stays: it paces the refresh (a later first checkpoint
        # means a later first index version, i.e. fewer hard negatives)
        "training.keep_checkpoints=10",
        "training.log_every=1",
        "negatives.share=batch",  # every mention scored against every candidate of the step
        *overrides,
    ]


def check_checkpoints(checkpoints: Sequence[int], every: int) -> None:
    """Exit unless every step of ``--checkpoints`` is a multiple of ``every`` and the run keeps
    them all (10 checkpoints)."""
    if any(step % every for step in checkpoints) or checkpoints[-1] // every > 10:
        raise SystemExit(
            f"--checkpoints: multiples of checkpoint_every ({every}), up to {10 * every}"
        )


def dual_encoder(path: Path, config: Config) -> BiEncoder:
    """The model at ``path`` as a dual ``BiEncoder`` with the recipe's mention and entity lengths."""
    return build_biencoder(
        path,
        "dual",
        mention_length=config.model.mention_length,
        entity_length=config.model.entity_length,
    )


def recall_untrained(model: BiEncoder, held_out: HeldOut) -> dict[str, dict[int, float]]:
    """R@k of the untrained ``model`` scored by dot product (hnce's) and cosine (the peer's)."""
    vectors = embed(model, held_out)
    return {
        "dot": recall_of(*vectors, held_out, False),
        "cosine": recall_of(*vectors, held_out, True),
    }


@dataclass
class Setup:
    """What every method's run shares: the work directory and its curve cache, the recipe
    overrides, the demo config on its subset, the checkpoint steps and the held-out set."""

    work: Path
    cache: CurveCache
    recipe: list[str]
    config: Config
    checkpoints: list[int]
    held_out: HeldOut

    def method_config(self, name: str, *overrides: str) -> Config:
        """configs/demo.yaml with the shared recipe, run in ``<work>/<name>`` on the subset."""
        return load_config(
            ROOT / "configs/demo.yaml",
            [
                *self.recipe,
                f"run.dir={self.work / name}",
                f"data.root={self.config.data.root}",
                *overrides,
            ],
        )


def hnce_runs(setup: Setup, args: argparse.Namespace) -> list[Trained]:
    """hnce, and with ``--cosine`` its cosine variant: each from the cache or trained (then
    cached), with where its wall-clock went; they must have trained on the same mentions."""
    variants = {"hnce": ("hnce", ())}
    if args.cosine:
        variants["hnce-cosine"] = ("hnce, cosine τ 0.05, version 0 from the model", COSINE)
    runs = []
    for key, (label, overrides) in variants.items():
        done = setup.cache.get(key)
        if done is None:
            config = setup.method_config(key, *overrides)
            done = setup.cache.put(
                key, run_hnce(config, setup.checkpoints, label, args, setup.held_out)
            )
        done.seconds |= wall_clock_parts(setup.work / key, done.seconds["total"])
        print(key, done.seconds, done.curve.points, flush=True)
        runs.append(done)
    if any(run.trained != runs[0].trained for run in runs):
        raise SystemExit("the hnce runs trained on different mentions: not comparable")
    return runs


def peer_run(setup: Setup, trained: Sequence[str], untrained: BiEncoder) -> Trained:
    """The peer from the cache, or trained on hnce's ``trained`` mention ids (its texts
    formatted by the ``untrained`` model's tokenizer), evaluated and cached."""
    peer = setup.cache.get("peer")
    if peer is None:
        mentions = training_mentions(setup.config, trained)
        anchors, corpus = peer_texts(untrained, mentions, setup.held_out)
        positives = [corpus[m.gold] for m in mentions]
        output = setup.work / "peer"
        curve, seconds = train_peer(
            anchors, positives, corpus, setup.config, output, setup.checkpoints
        )
        evaluate_curve(
            curve,
            [str(peer_checkpoint(output, s)) for s in setup.checkpoints],
            lambda d: dual_encoder(Path(d), setup.config),
            setup.held_out,
        )
        peer = setup.cache.put("peer", Trained(curve, seconds))
    print("peer", peer.seconds, peer.curve.points, flush=True)
    return peer


def training_mentions(config: Config, mention_ids: Sequence[str]) -> list[Mention]:
    """The training split's mentions of ``mention_ids``, in their order."""
    by_id = {
        m.mention_id: m
        for m in MentionSplit.open(
            mention_split_path(Path(config.data.root), config.data.train_split)
        ).read_all()
    }
    return [by_id[mention_id] for mention_id in mention_ids]


def write_raw(
    path: Path, untrained: dict[str, dict[int, float]], runs: Sequence[Trained], peer: Trained
) -> None:
    """The measured figures as JSON: untrained recall, each hnce run and the peer."""
    raw = {
        "untrained": untrained,
        "runs": {run.curve.name: run.__dict__ | {"curve": run.curve.points} for run in runs},
        "peer": peer.__dict__ | {"curve": peer.curve.points},
    }
    path.write_text(json.dumps(raw, indent=2) + "\n")


def main() -> None:
    """Measure every method (cached ones from ``<work>/curves.json``), then write the results."""
    args = parse_args()
    checkpoints = [int(step) for step in args.checkpoints.split(",")]
    torch.set_num_threads(2)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="hnce-peer-") as scratch:
        work = args.work or Path(scratch)
        recipe = shared_recipe(work, checkpoints, args.set)
        config, counts = demo_dataset(load_config(ROOT / "configs/demo.yaml", recipe))
        check_checkpoints(checkpoints, config.training.checkpoint_every)
        held_out = held_out_set(config)
        untrained = dual_encoder(minilm_path(), config)
        untrained_recall = recall_untrained(untrained, held_out)
        print("untrained", untrained_recall, flush=True)
        cache = CurveCache(work / "curves.json")
        setup = Setup(work, cache, recipe, config, checkpoints, held_out)
        runs = hnce_runs(setup, args)
        peer = peer_run(setup, runs[0].trained, untrained)
        profile = profile_hnce_step(setup.method_config("profile"))
    total = time.perf_counter() - started
    write_raw(args.out.with_suffix(".json"), untrained_recall, runs, peer)
    write_results(args.out, counts, untrained_recall, runs, peer, total, profile)


def wall_clock_parts(run_dir: Path, total: float) -> dict[str, float]:
    """Where an hnce run's wall-clock went, from its event log: before the first step (Ray,
    Ray Train and DeepSpeed start-up, model load, negatives version 0), inside the steps, and
    the rest (checkpoints, negatives polls, shutdown)."""
    steps = read_events(run_dir, "step")
    inside = sum(float(e["seconds"]) for e in steps)
    first_step_start = float(steps[0]["time"]) - float(steps[0]["seconds"])
    start = float(read_events(run_dir, "start")[0]["time"])
    end = float(read_events(run_dir, "end")[-1]["time"])
    before = total - (end - start) + (first_step_start - start)
    return {
        "before first step": before,
        "steps": inside,
        "per step": inside / len(steps),
        "rest": total - before - inside,
    }


def run_hnce(
    config: Config,
    checkpoints: Sequence[int],
    label: str,
    args: argparse.Namespace,
    held_out: HeldOut,
) -> Trained:
    """One ``hnce train`` run, its final export checked through the product's path when
    ``--check-product`` asks, then its curve by the exact path."""
    curve, model_dirs, trained, seconds = train_hnce(config, checkpoints, label)
    product = None
    if args.check_product:
        product = evaluate_export(config, Path(model_dirs[-1]), progress=False).recall
        product = {k: product[k] for k in KS}
    ray.shutdown()
    evaluate_curve(curve, model_dirs, load_biencoder, held_out)
    return Trained(curve, {"total": seconds}, trained, product)


if __name__ == "__main__":
    main()

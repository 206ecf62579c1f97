"""The peer's side of the comparison: sentence-transformers' ``mine_hard_negatives`` once over
the catalogue, then MultipleNegativesRankingLoss for the same steps and batch on the very
mentions hnce trained on, the model saved at each checkpoint step and evaluated by the same
exact path as hnce's.

Example::

    peer = peer_run(setup, hnce.trained, untrained)     # from the state file, or trained
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from benchmarks import harness
from benchmarks.peer.curves import Curve, Trained
from benchmarks.peer.evaluation import HeldOut, dual_encoder, evaluate_curve, training_mentions
from benchmarks.peer.hnce_training import Setup
from hnce.cluster.stores.tables import Mention
from hnce.encoders.biencoder import BiEncoder, minilm_path
from hnce.encoders.formatting import register_markers
from hnce.pipeline.config import Config

if TYPE_CHECKING:
    from datasets import Dataset
    from sentence_transformers import SentenceTransformer, SentenceTransformerTrainingArguments
    from transformers import TrainerCallback


#: what the ``bench`` extra installs for the peer (sentence-transformers' trainer needs both)
PEER_MODULES = ("sentence_transformers", "datasets", "accelerate")


def require_bench_extra() -> None:
    """Exit before any run when the peer cannot train: without the ``bench`` extra the peer's
    first import would fail only after the hnce runs before it had finished."""
    missing = [name for name in PEER_MODULES if importlib.util.find_spec(name) is None]
    if missing:
        raise SystemExit(
            f"the peer needs {', '.join(missing)}: install the bench extra first "
            "(.venv/bin/pip install -c constraints.txt -e '.[bench]')"
        )


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

    timer = harness.Timer()
    peer = SentenceTransformer(str(minilm_path()), device="cpu")
    peer.max_seq_length = config.model.mention_length
    register_markers(peer.tokenizer)
    mined = mine_peer_negatives(peer, anchors, positives, corpus, config.negatives.num_negatives)
    mined_at = timer.elapsed()
    curve = Curve("sentence-transformers (mined once, MNRL)")
    trainer = SentenceTransformerTrainer(
        model=peer,
        args=peer_training_arguments(config, output),
        train_dataset=mined,
        loss=MultipleNegativesRankingLoss(peer),
        callbacks=[save_peer_at(checkpoints, peer, output, curve, timer)],
    )
    trainer.train()
    return curve, {"mine_hard_negatives": mined_at, "total": timer.elapsed()}


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
    timer: harness.Timer,
) -> TrainerCallback:
    """A trainer callback that saves ``peer`` at each checkpoint step (:func:`peer_checkpoint`)
    and adds the step to ``curve`` with its wall seconds on ``timer``."""
    from transformers import TrainerCallback

    class SaveAt(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step in checkpoints:
                seconds = timer.elapsed()
                peer.save(str(peer_checkpoint(output, state.global_step)))
                curve.points.append((seconds, state.global_step, {}))

    return SaveAt()


def peer_checkpoint(output: Path, step: int) -> Path:
    """Where the peer's model of checkpoint ``step`` is saved."""
    return output / f"step-{step}"


def peer_run(setup: Setup, trained: Sequence[str], untrained: BiEncoder) -> Trained:
    """The peer from the state file, or trained on hnce's ``trained`` mention ids (its texts
    formatted by the ``untrained`` model's tokenizer), evaluated and kept."""

    def train() -> dict:
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
        return Trained(curve, seconds).to_json()

    peer = Trained.from_json(setup.state.once("peer", train))
    print("peer", peer.seconds, peer.curve.points, flush=True)
    return peer

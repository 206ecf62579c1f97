"""What each Ray Train worker runs: DeepSpeed training on refreshed negatives (paper §6.3).

Each optimizer step takes ``gradient_accumulation`` micro-batches; each micro-batch encodes
the B mentions, their golds and K negatives per mention with the current model and minimises
the configured loss (hard-negative NCE, eq. 5/11, by default). Negatives come from the sampler
of the config over the newest refreshed negatives version (random before the first refresh).
Every R steps a checkpoint is published; every C steps the newest negatives version is picked
up without waiting. A restarted worker group resumes from the newest complete checkpoint and
replays the same data order (:mod:`pipeline.train.data_order`).
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import deepspeed
import numpy as np
import ray.train
import torch
import torch.distributed as dist
from torch import Tensor, nn

from cluster.checkpoints import (
    DEEPSPEED_DIR,
    DEEPSPEED_TAG,
    EXPORT_DIR,
    checkpoint_dir,
    mark_complete,
    newest_checkpoint,
    prune_checkpoints,
    verify_checkpoint,
)
from cluster.tables import EntityCatalogue, Mention, MentionSplit, mention_split_path
from encoders.biencoder import BiEncoder, export_biencoder
from mining.false_negatives import FalseNegativeFilter
from mining.losses import build_loss
from mining.samplers import SamplingRequest, build_sampler
from pipeline.config import Config, config_from_dict
from pipeline.train.data_order import MentionOrder
from pipeline.train.deepspeed_config import build_deepspeed_config
from pipeline.train.events import EventLog
from pipeline.train.model import build_model
from pipeline.train.negatives import RefreshedNegatives
from pipeline.train.refresh_health import RefreshHealth

POINTER_FILE = "hnce_checkpoint.json"


class CandidateScoring(nn.Module):
    """DeepSpeed's engine calls ``forward``: scores [B, 1+K] of each mention against its gold
    (column 0) and its K negatives (``BiEncoder.score_with_candidates``)."""

    def __init__(self, biencoder: BiEncoder) -> None:
        super().__init__()
        self.biencoder = biencoder

    def forward(
        self, mention_batch: Mapping[str, Tensor], candidate_batch: Mapping[str, Tensor]
    ) -> Tensor:
        return self.biencoder.score_with_candidates(mention_batch, candidate_batch)


def load_train_mentions(config: Config) -> list[Mention]:
    """The training split (first ``data.max_train_mentions`` when set)."""
    split = MentionSplit.open(mention_split_path(Path(config.data.root), config.data.train_split))
    mentions = split.read_all()
    limit = config.data.max_train_mentions
    return mentions[:limit] if limit > 0 else mentions


def training_entities(catalogue: EntityCatalogue, mentions: Sequence[Mention]) -> np.ndarray:
    """Entity ids negatives are drawn from: the entities of the training mentions' domains.

    Zeshel-style data trains on some domains and tests on others; negatives from the test
    domains would let the model separate domains instead of entities (paper §6.3: "sampled
    uniformly at random from all entities in training data"). Without domains: every entity.
    """
    domains = np.asarray(catalogue.domain_of().to_numpy(zero_copy_only=False))
    training_domains = sorted({m.domain for m in mentions})
    return np.flatnonzero(np.isin(domains, training_domains)).astype(np.int64)


class NegativeDrawer:
    """K negatives per mention: the configured sampler over the current negatives version, the
    random sampler before the first refresh. Known positives never come back as negatives.

    Samplers work in a local id space 0..M-1 over :func:`training_entities`; candidates of
    the refreshed index outside it are masked out, and drawn ids are mapped back.
    """

    def __init__(
        self, config: Config, catalogue: EntityCatalogue, mentions: Sequence[Mention]
    ) -> None:
        negatives = config.negatives
        self.entity_ids = torch.from_numpy(training_entities(catalogue, mentions))
        self.to_local = torch.full((len(catalogue),), -1, dtype=torch.long)
        self.to_local[self.entity_ids] = torch.arange(len(self.entity_ids))
        self.num_negatives = negatives.num_negatives
        self.random = build_sampler("random")
        options: dict[str, Any] = {}
        if negatives.sampler == "mixed":
            options = {
                "hard_fraction": negatives.mixed.hard_fraction,
                "temperature": negatives.hard.temperature,
            }
        elif negatives.sampler in ("hard", "greedy"):
            options = {"temperature": negatives.hard.temperature}
        elif negatives.sampler == "ohem":
            options = {"pool_size": negatives.ohem.pool_size}
        self.sampler = build_sampler(negatives.sampler, **options)
        self.needs_candidates = negatives.source == "index"
        self.filter = FalseNegativeFilter() if negatives.filter_false_negatives else None
        if self.filter is not None:
            for mention in mentions:
                for gold in mention.golds or (mention.gold,):
                    self.filter.add(mention.mention_id, int(gold))

    def _local(self, ids: Tensor) -> Tensor:
        return torch.where(ids >= 0, self.to_local[ids.clamp(min=0)], -1)

    def draw(
        self,
        mentions: Sequence[Mention],
        refreshed: RefreshedNegatives,
        generator: torch.Generator,
    ) -> tuple[Tensor, Tensor, Tensor | None]:
        """(negative entity ids [B, K], valid [B, K], log_q [B, K] or None)."""
        gold = self._local(torch.tensor([m.gold for m in mentions], dtype=torch.long))
        positives = [
            {int(self.to_local[g]) for g in (m.golds or (m.gold,))} - {-1} for m in mentions
        ]
        candidate_ids = candidate_scores = None
        sampler = self.random
        if self.needs_candidates and refreshed.current is not None:
            global_ids, candidate_scores = refreshed.current.lookup(
                [m.mention_id for m in mentions]
            )
            candidate_ids = self._local(global_ids)
            outside = candidate_ids < 0
            if self.filter is not None:
                outside |= self.filter.mask([m.mention_id for m in mentions], global_ids)
            candidate_scores = candidate_scores.masked_fill(outside, float("-inf"))
            sampler = self.sampler
        elif not self.needs_candidates:
            sampler = self.sampler
        sampled = sampler.sample(
            SamplingRequest(
                gold=gold,
                positives=positives,
                num_entities=len(self.entity_ids),
                num_negatives=self.num_negatives,
                candidate_ids=candidate_ids,
                candidate_scores=candidate_scores,
                generator=generator,
            )
        )
        ids = self.entity_ids[sampled.ids.clamp(min=0, max=len(self.entity_ids) - 1)]
        return ids, sampled.valid, sampled.log_q


def _micro_batch(
    model: BiEncoder,
    catalogue: EntityCatalogue,
    mentions: Sequence[Mention],
    negative_ids: Tensor,
) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """Tokenised mentions [B, L] and candidates [B*(1+K), L'] (gold first, row-major)."""
    gold = torch.tensor([m.gold for m in mentions], dtype=torch.long)
    candidate_ids = torch.cat([gold[:, None], negative_ids.clamp(min=0)], dim=1)
    entities = catalogue.get_many(candidate_ids.reshape(-1).tolist())
    mention_batch = model.tokenize_mentions(
        [m.context_left for m in mentions],
        [m.mention for m in mentions],
        [m.context_right for m in mentions],
    )
    candidate_batch = model.tokenize_entities(
        [e.title for e in entities], [e.text for e in entities]
    )
    return mention_batch, candidate_batch


def _resume_step(run_dir: Path) -> tuple[int, Path] | None:
    """Newest checkpoint to resume from: Ray Train's reported one, else the newest on disk."""
    reported = ray.train.get_checkpoint()
    if reported is not None:
        with reported.as_directory() as directory:
            pointer = json.loads((Path(directory) / POINTER_FILE).read_text())
        step = int(pointer["step"])
        path = checkpoint_dir(run_dir, step)
        if path.is_dir():
            return step, path
    return newest_checkpoint(run_dir)


def _publish(
    engine: deepspeed.DeepSpeedEngine,
    config: Config,
    step: int,
    rank: int,
    refreshed: RefreshedNegatives,
    log: EventLog | None,
    metrics: dict[str, Any],
) -> None:
    """Write ``step-<S>/`` (DeepSpeed state on all ranks, export + COMPLETE on rank 0) and report
    a pointer to it to Ray Train, so a restarted worker group resumes from here."""
    run_dir = config.run_dir
    directory = checkpoint_dir(run_dir, step)
    engine.save_checkpoint(str(directory / DEEPSPEED_DIR), tag=DEEPSPEED_TAG)
    biencoder = engine.module.biencoder
    if config.training.zero_stage == 3:
        with deepspeed.zero.GatheredParameters(list(biencoder.parameters())):
            if rank == 0:
                export_biencoder(biencoder, directory / EXPORT_DIR)
    elif rank == 0:
        export_biencoder(biencoder, directory / EXPORT_DIR)
    if dist.is_initialized():
        dist.barrier()
    if rank == 0:
        mark_complete(
            directory,
            {"step": step, "seed": config.run.seed, "negatives_version": refreshed.version},
        )
        prune_checkpoints(run_dir, config.training.keep_checkpoints)
        assert log is not None
        log.write("checkpoint", step=step, path=str(directory))
    with tempfile.TemporaryDirectory(prefix="hnce-pointer-") as pointer_dir:
        checkpoint = None
        if rank == 0:
            (Path(pointer_dir) / POINTER_FILE).write_text(json.dumps({"step": step}))
            checkpoint = ray.train.Checkpoint.from_directory(pointer_dir)
        ray.train.report({**metrics, "step": step}, checkpoint=checkpoint)


def train_loop_per_worker(loop_config: dict[str, Any]) -> None:
    """Ray Train entry point; ``loop_config["config"]`` is ``Config.to_dict()``."""
    config = config_from_dict(loop_config["config"])
    training = config.training
    context = ray.train.get_context()
    rank, world_size = context.get_world_rank(), context.get_world_size()
    torch.set_num_threads(max(1, int(training.cpus_per_worker)))
    run_dir = config.run_dir
    pids = run_dir / "workers"
    pids.mkdir(parents=True, exist_ok=True)
    (pids / f"rank-{rank}.pid").write_text(str(os.getpid()))
    log = EventLog(run_dir) if rank == 0 else None

    on_gpu = torch.cuda.is_available()
    deepspeed.init_distributed(dist_backend="nccl" if on_gpu else "gloo")
    catalogue = EntityCatalogue.open(Path(config.data.root))
    mentions = load_train_mentions(config)
    model = build_model(config)
    module = CandidateScoring(model)
    engine, _, _, _ = deepspeed.initialize(
        model=module,
        model_parameters=[p for p in module.parameters() if p.requires_grad],
        config=build_deepspeed_config(training, on_gpu),
    )
    device = engine.device

    start_step = 0
    resume = _resume_step(run_dir)
    if resume is not None:
        start_step, path = resume
        verify_checkpoint(path)
        engine.load_checkpoint(str(path / DEEPSPEED_DIR), tag=DEEPSPEED_TAG)
        if log is not None:
            log.write("resume", step=start_step, path=str(path))
    elif log is not None:
        log.write("start", step=0, world_size=world_size, mentions=len(mentions))

    order = MentionOrder(len(mentions), training.batch_size, world_size, config.run.seed)
    drawer = NegativeDrawer(config, catalogue, mentions)
    loss_fn = build_loss(config.loss.name, **config.loss.options)
    refreshed = RefreshedNegatives(run_dir / "negatives", config.data.train_split)
    health = RefreshHealth(run_dir, config.refresh.max_consecutive_failures, rank)
    engine.train()
    last_loss = float("nan")
    for step in range(start_step, training.steps):
        check = step % training.negatives_check_every == 0 or step == start_step
        if check and refreshed.poll() and log is not None:
            log.write(
                "negatives",
                step=step,
                version=refreshed.version,
                checkpoint_step=refreshed.current.checkpoint_step,
                lag=refreshed.lag(step),
            )
        if check and health.should_stop(step, log, device):
            return
        started = time.perf_counter()
        losses = []
        for micro in range(training.gradient_accumulation):
            micro_step = step * training.gradient_accumulation + micro
            batch = [mentions[i] for i in order.batch(micro_step, rank)]
            generator = torch.Generator().manual_seed(
                (config.run.seed * 1_000_003 + micro_step) * 1009 + rank
            )
            negative_ids, valid, log_q = drawer.draw(batch, refreshed, generator)
            mention_batch, candidate_batch = _micro_batch(model, catalogue, batch, negative_ids)
            mention_batch = {k: v.to(device) for k, v in mention_batch.items()}
            candidate_batch = {k: v.to(device) for k, v in candidate_batch.items()}
            scores = engine(mention_batch, candidate_batch).float()
            loss = loss_fn(
                scores[:, 0],
                scores[:, 1:],
                valid.to(device),
                None if log_q is None else log_q.to(device),
            )
            engine.backward(loss)
            engine.step()
            losses.append(float(loss.detach()))
        last_loss = sum(losses) / len(losses)
        done = step + 1
        if log is not None and (done % training.log_every == 0 or done == training.steps):
            log.write(
                "step",
                step=done,
                loss=last_loss,
                lr=float(engine.get_lr()[0]),
                seconds=time.perf_counter() - started,
                negatives_version=refreshed.version,
                lag=refreshed.lag(step),
            )
        if done % training.checkpoint_every == 0 or done == training.steps:
            metrics = {"loss": last_loss, "negatives_version": refreshed.version}
            _publish(engine, config, done, rank, refreshed, log, metrics)
    if log is not None:
        log.write("end", step=training.steps, loss=last_loss, negatives_version=refreshed.version)

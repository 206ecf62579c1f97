"""Shared negatives (``negatives.share``): in-batch masks that never make a known positive a
negative, the loss over the enlarged candidate set (eq. 5/11), cross-worker negatives
(``global``) in a real two-process gloo group compared with a single-process computation, and
(slow) both share modes trained by two workers' DeepSpeed loops in such a group."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from training_helpers import TWO_WORKERS, synthetic_config, write_syllable_bert

from hnce.cluster.stores.run_events import read_events
from hnce.cluster.stores.tables import Mention
from hnce.encoders.biencoder import BiEncoder, build_biencoder
from hnce.events import RunEvent
from hnce.mining.losses import NCELoss, build_loss
from hnce.mining.samplers import SampledNegatives
from hnce.pipeline.config import Config, ConfigError, config_from_dict
from hnce.pipeline.train.batch import ContrastiveBatch, ShareMode, assemble_batch
from hnce.pipeline.train.distributed import Collectives
from hnce.pipeline.train.step import ContrastiveScoring, contrastive_loss
from hnce.pipeline.train.task import TrainingTask
from hnce.pipeline.train.worker import WorkerRun


class NoTokens:
    def batch(self, rows: np.ndarray) -> dict[str, torch.Tensor]:
        return {"input_ids": torch.zeros(len(rows), 1, dtype=torch.long)}


def _batch(
    mentions: list[Mention],
    negatives: SampledNegatives,
    share: ShareMode,
    with_aliases: bool = True,
) -> ContrastiveBatch:
    positives = [set(m.golds) if with_aliases else set() for m in mentions]
    return assemble_batch(
        mentions, np.arange(len(mentions)), NoTokens(), negatives, NoTokens(), positives, share
    )


# m0's alias (20) is m1's gold; m2 has m0's gold (10). Each draws one or two negatives.
MENTIONS = [
    Mention("m0", "", "x", "", 10, "", (20,)),
    Mention("m1", "", "x", "", 20),
    Mention("m2", "", "x", "", 10),
]
NEGATIVES = SampledNegatives(
    ids=torch.tensor([[30, -1], [40, 10], [50, 30]]),
    valid=torch.tensor([[True, False], [True, True], [True, True]]),
    log_q=torch.full((3, 2), -3.0),
)


def test_a_mentions_other_positives_are_never_its_negatives_under_batch() -> None:
    batch = _batch(MENTIONS, NEGATIVES, "batch")
    column = {int(e): c for c, e in enumerate(batch.entity_ids)}
    assert batch.entity_ids.tolist() == [10, 20, 30, 40, 50]
    assert batch.gold.tolist() == [column[10], column[20], column[10]]
    assert not batch.valid[0, column[20]]  # m0's alias, though it is m1's gold column
    assert not batch.valid[2, column[10]]  # m2's gold, though it is m0's column too
    assert batch.valid[1, column[10]]  # m0's gold is only m1's negative
    # Without false-negative filtering only the gold is a known positive: the alias is valid.
    unfiltered = _batch(MENTIONS, NEGATIVES, "batch", with_aliases=False)
    assert unfiltered.valid[0, column[20]]


def test_batch_valid_mask_is_every_column_but_the_positives_and_the_loss_is_nce_over_it() -> None:
    batch = _batch(MENTIONS, NEGATIVES, "batch")
    expected = torch.tensor(
        [
            [False, False, True, True, True],
            [True, False, True, True, True],
            [False, True, True, True, True],
        ]
    )
    assert torch.equal(batch.valid, expected)
    own = _batch(MENTIONS, NEGATIVES, "none")
    assert own.valid.sum().item() == 5 and (own.valid <= batch.valid).all()

    scores = torch.randn(3, 5, generator=torch.Generator().manual_seed(0))
    per_mention = []
    for row in range(3):
        columns = [int(batch.gold[row]), *expected[row].nonzero().flatten().tolist()]
        logits = scores[row, columns]
        per_mention.append(torch.logsumexp(logits, 0) - logits[0])
    torch.testing.assert_close(
        contrastive_loss(scores, batch, NCELoss()), torch.stack(per_mention).mean()
    )
    # log q (eq. 10) only on a mention's own draws; borrowed columns carry 0 (no correction).
    assert batch.log_q is not None
    own_draws = torch.zeros_like(batch.valid)
    own_draws[0, 2] = own_draws[1, 3] = own_draws[1, 0] = own_draws[2, 4] = own_draws[2, 2] = True
    assert torch.equal(batch.log_q != 0, own_draws)
    assert batch.log_q[own_draws].eq(-3.0).all()
    contrastive_loss(scores, batch, build_loss("sampled-softmax"))  # shapes agree


def test_global_share_is_refused_for_a_scorer_that_cannot_be_split(
    small_dataset: Path, syllable_bert: Path
) -> None:
    with pytest.raises(ConfigError, match=r"negatives\.share.*'global'.*poly"):
        synthetic_config(
            Path("unused"),
            small_dataset,
            syllable_bert,
            "negatives.share=global",
            "model.scorer.name=poly",
            "model.scorer.m=4",
            "negatives.source=none",
            "negatives.sampler=random",
            "refresh.enabled=false",
        )
    batch_share = synthetic_config(
        Path("unused"), small_dataset, syllable_bert, "negatives.share=global"
    )
    assert batch_share.negatives.share == "global"  # dual: its entity side can be gathered


# --------------------------------------------------------------------------------------------
# global: two gloo processes


def _rank_batch(rank: int, vocab: int) -> ContrastiveBatch:
    """Rank 0: 2 mentions, candidates 1..4 of 6 tokens; rank 1: 2 mentions, candidates 3, 5, 6 of
    9 tokens (entity 3 is on both ranks; 5 is an alias of rank 0's first mention)."""
    generator = torch.Generator().manual_seed(100 + rank)
    entity_ids = [[1, 2, 3, 4], [3, 5, 6]][rank]
    length = [6, 9][rank]

    def tokens(rows: int, width: int) -> dict[str, torch.Tensor]:
        ids = torch.randint(10, vocab, (rows, width), generator=generator)
        mask = torch.ones_like(ids)
        mask[0, width - 2 :] = 0
        return {"input_ids": ids, "attention_mask": mask}

    golds = [[1, 2], [5, 6]][rank]
    mentions = [
        Mention(f"r{rank}m{i}", "", "x", "", g, "", (5,) if (rank, i) == (0, 0) else ())
        for i, g in enumerate(golds)
    ]
    others = [e for e in entity_ids if e not in golds]
    negatives = SampledNegatives(
        ids=torch.tensor([others, others]), valid=torch.ones(2, len(others), dtype=torch.bool)
    )
    batch = _batch(mentions, negatives, "global")
    assert batch.entity_ids.tolist() == entity_ids
    batch.mentions = tokens(2, 7)
    batch.candidates = tokens(len(entity_ids), length)
    return batch


def _model(model_dir: Path, scorer: str) -> BiEncoder:
    return build_biencoder(model_dir, scorer, mention_length=12, entity_length=12)


def _global_rank(rank: int, model_dir: Path, scorer: str, out: Path) -> None:
    dist.init_process_group(
        "gloo", init_method=f"file://{out / 'rendezvous'}", rank=rank, world_size=2
    )
    torch.set_num_threads(1)
    model = _model(model_dir, scorer)
    batch = _rank_batch(rank, len(model.tokenizer))
    collectives = Collectives(torch.device("cpu"))
    scoring = ContrastiveScoring(model, chunk_size=2, gather=collectives)
    scores = scoring(batch.mentions, batch.candidates, batch.scored_pairs)
    wide = batch.across_workers(*collectives.all_gather_rows(batch.entity_ids))
    loss = contrastive_loss(scores, wide, NCELoss())
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    torch.save({"loss": loss.detach(), "valid": wide.valid, "grads": grads}, out / f"{rank}.pt")
    dist.destroy_process_group()


def _reference(
    model_dir: Path, scorer: str, detach_other: bool
) -> tuple[torch.Tensor, dict[str, torch.Tensor], torch.Tensor]:
    """Rank 0's loss over both ranks' candidates in one process (rank 1's as constants when
    ``detach_other``), its gradients, and the valid mask written out by hand."""
    model = _model(model_dir, scorer)
    local, other = (_rank_batch(rank, len(model.tokenizer)) for rank in (0, 1))
    mention_vectors, mention_kept = model.mention_side(local.mentions)
    sides = [model.candidate_side(local.candidates), model.candidate_side(other.candidates)]
    if detach_other:
        sides[1] = tuple(t.detach() for t in sides[1])
    width = max(vectors.shape[1] for vectors, _ in sides)
    vectors = torch.cat(
        [torch.nn.functional.pad(v, (0, 0, 0, width - v.shape[1])) for v, _ in sides]
    )
    kept = torch.cat([torch.nn.functional.pad(k, (0, width - k.shape[1])) for _, k in sides])
    scores = model.scorer.score_reduced(mention_vectors, mention_kept, vectors, kept)
    # Columns: 1 2 3 4 | 3 5 6. Mention 0 (gold 1, alias 5), mention 1 (gold 2); the second 3
    # repeats a local entity.
    valid = torch.tensor(
        [
            [False, True, True, True, False, False, True],
            [True, False, True, True, False, True, True],
        ]
    )
    positive = scores[torch.arange(2), local.gold]
    loss = NCELoss()(positive, scores, valid)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return loss.detach(), grads, valid


@pytest.mark.slow
@pytest.mark.parametrize("scorer", ["dual", "som"])
def test_global_share_scores_the_other_workers_candidates_with_local_gradients(
    scorer: str, tmp_path: Path
) -> None:
    """Rank 0's loss equals one process's NCE over both ranks' candidates (som: different token
    counts per rank), with gradients through rank 0's candidates only."""
    model_dir = write_syllable_bert(tmp_path / "bert", dropout=0.0)
    mp.spawn(_global_rank, args=(model_dir, scorer, tmp_path), nprocs=2, join=True)
    rank0 = torch.load(tmp_path / "0.pt")
    loss, grads, valid = _reference(model_dir, scorer, detach_other=True)
    assert torch.equal(rank0["valid"], valid)
    torch.testing.assert_close(rank0["loss"], loss)
    assert grads.keys() == rank0["grads"].keys()
    for name, grad in grads.items():
        torch.testing.assert_close(rank0["grads"][name], grad, msg=name)

    # Sensitive to both halves: rank 1's candidates change rank 0's loss, and letting gradients
    # flow through them (not what a worker can do) would change rank 0's gradients.
    model = _model(model_dir, scorer)
    local = _rank_batch(0, len(model.tokenizer))
    alone = contrastive_loss(model.score_matrix(local.mentions, local.candidates), local, NCELoss())
    assert not torch.isclose(alone, rank0["loss"])
    _, through_other, _ = _reference(model_dir, scorer, detach_other=False)
    name = "entity_tower.embeddings.word_embeddings.weight"
    assert not torch.allclose(through_other[name], rank0["grads"][name])


# --------------------------------------------------------------------------------------------
# Trained: two workers' DeepSpeed loops in a two-process gloo group


def _train_rank(rank: int, configs: list[dict], rendezvous: Path) -> None:
    """Rank ``rank`` of two, as Ray Train starts a worker (its environment and gloo group):
    the worker's loop of each config in turn, in one group."""
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", LOCAL_WORLD_SIZE="2")
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=2)
    for tree in configs:
        config = config_from_dict(tree)
        task = TrainingTask.retriever(config)
        WorkerRun.build(config, task, torch.device("cpu"), 2, lambda *_: None).train()
    dist.destroy_process_group()


@pytest.mark.slow
def test_shared_negatives_train_two_workers_and_widen_the_first_steps_normaliser(
    tmp_path: Path, small_dataset: Path, syllable_bert: Path
) -> None:
    """``batch`` and ``global`` from the recipe, 2 workers (ZeRO-1) of the worker's loop as Ray
    Train runs it, 3 steps each: the first step sees the same scores in both (same seeds, same
    candidates encoded), so its loss grows with the other worker's candidates added to the
    normaliser. (That ``batch`` widens ``none``'s normaliser is checked without workers above,
    which saves a third training run here.)"""
    configs: dict[str, Config] = {
        share: synthetic_config(
            tmp_path / share,
            small_dataset,
            syllable_bert,
            *TWO_WORKERS,  # global shares the other worker's candidates
            f"negatives.share={share}",
            "negatives.num_negatives=2",
            "training.steps=3",
            "training.batch_size=4",
            "training.checkpoint_every=3",
        )
        for share in ("batch", "global")
    }
    trees = [config.to_dict() for config in configs.values()]
    mp.spawn(_train_rank, args=(trees, tmp_path / "rendezvous"), nprocs=2, join=True)
    first_loss = {}
    for share, config in configs.items():
        steps = read_events(config.run_dir, RunEvent.STEP)
        assert [e["step"] for e in steps] == [1, 2, 3]
        assert [e["step"] for e in read_events(config.run_dir, RunEvent.END)] == [3]
        first_loss[share] = steps[0]["loss"]
    assert first_loss["batch"] < first_loss["global"], first_loss

"""The training step's parts without Ray: the micro-batch (unique candidates, masks, token rows),
the loss over it (exactly eq. 11 for the classic per-mention case), the negative drawer (domain
restriction, local ids, known positives), a worker's micro-batches (no engine) and optimizer
step (no DeepSpeed), and the worker's device and collective rules (``pytest -k device``: every
tensor handed to a collective is on the device its backend needs)."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
from store_helpers import mined_split
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_map
from training_helpers import REFRESHED, config_for, synthetic_config

from hnce.cluster.stores.negatives_store import MinedSplit, NegativesStore
from hnce.cluster.stores.tables import Entity, Mention, mention_split_path
from hnce.cluster.stores.tables_read import EntityCatalogue, MentionSplit, catalogue_fingerprint
from hnce.cluster.stores.tables_write import write_dataset
from hnce.cluster.stores.tokens import MentionTokens, TokenStore
from hnce.cluster.stores.versioned_dir import StoreError
from hnce.encoders.biencoder import build_biencoder
from hnce.mining.losses import NCELoss, build_loss
from hnce.mining.samplers import SampledNegatives
from hnce.pipeline import devices
from hnce.pipeline.recipe_models import build_trainable
from hnce.pipeline.train import distributed
from hnce.pipeline.train.batch import ContrastiveBatch, assemble_batch
from hnce.pipeline.train.checkpointing import agreed_resume_step
from hnce.pipeline.train.distributed import Collectives
from hnce.pipeline.train.negatives import (
    FixedNegatives,
    NegativeDrawer,
    RefreshedNegatives,
    TrainingData,
    load_training_data,
    training_entities,
)
from hnce.pipeline.train.one_process import single_process_group
from hnce.pipeline.train.step import contrastive_loss, train_micro_batch, train_step
from hnce.pipeline.train.task import TrainingTask


def split_mentions(small_dataset: Path, split: str = "train") -> list[Mention]:
    """Mentions of one split; the synthetic data puts each split in its own world (domain)."""
    return MentionSplit.open(mention_split_path(small_dataset, split)).read_all()


def publish_candidates(root: Path, mentions: list[Mention], cands: np.ndarray) -> Path:
    """A negatives version whose scores rank the candidates in the order given."""
    scores = -np.arange(cands.shape[1], dtype=np.float32)[None].repeat(len(mentions), 0)
    scores[cands < 0] = -np.inf  # padding, as a mined split stores it
    mined = MinedSplit(
        [m.mention_id for m in mentions], cands, scores, np.full(len(mentions), -1, np.int32)
    )
    return NegativesStore(root).publish(
        1, {"train": mined}, checkpoint_step=0, top_n=3, num_entities=int(cands.max()) + 1
    )


# --------------------------------------------------------------------------------------------
# The micro-batch and the loss


def test_a_block_diagonal_batch_gives_exactly_the_per_mention_nce_loss() -> None:
    """Eq. 11 per mention over its gold and own K negatives, whatever ids other mentions share."""
    golds = torch.tensor([10, 20, 30])
    negatives = SampledNegatives(
        ids=torch.tensor([[20, 40, -1], [10, 40, 50], [60, 70, 20]]),
        valid=torch.tensor([[True, True, False], [True, True, True], [True, True, True]]),
        log_q=torch.full((3, 3), -2.0),
    )
    table = torch.randn(80, 5, generator=torch.Generator().manual_seed(0))
    mention_vectors = torch.randn(3, 5, generator=torch.Generator().manual_seed(1))

    unique = torch.unique(torch.cat([golds, negatives.ids[negatives.valid]]))
    assert unique.tolist() == [10, 20, 30, 40, 50, 60, 70]  # each entity encoded once
    batch = _batch_without_tokens(golds, negatives)
    assert torch.equal(batch.entity_ids, unique)
    assert batch.gold.tolist() == [0, 1, 2]
    assert batch.valid.sum(dim=1).tolist() == [2, 3, 3]
    assert not batch.valid[torch.arange(3), batch.gold].any()
    scores = mention_vectors @ table[batch.entity_ids].T
    loss = contrastive_loss(scores, batch, NCELoss())

    per_mention = []
    for row in range(3):
        columns = [int(golds[row]), *negatives.ids[row][negatives.valid[row]].tolist()]
        logits = mention_vectors[row] @ table[columns].T
        per_mention.append(torch.logsumexp(logits, 0) - logits[0])
    torch.testing.assert_close(loss, torch.stack(per_mention).mean())
    sampled_softmax = contrastive_loss(scores, batch, build_loss("sampled-softmax"))
    assert sampled_softmax.item() > loss.item()  # −log q = 2 raises every negative's logit
    assert batch.log_q is not None and batch.log_q[~batch.valid].eq(0).all()


def _batch_without_tokens(golds: torch.Tensor, negatives: SampledNegatives) -> ContrastiveBatch:
    class NoTokens:
        def batch(self, rows: np.ndarray) -> dict[str, torch.Tensor]:
            return {"input_ids": torch.zeros(len(rows), 1, dtype=torch.long)}

    mentions = [Mention(f"m{i}", "", "x", "", int(g)) for i, g in enumerate(golds)]
    return assemble_batch(mentions, np.arange(len(mentions)), NoTokens(), negatives, NoTokens())


def test_batch_tokens_come_from_the_stores_row_by_row(
    small_dataset: Path, syllable_bert: Path
) -> None:
    model = build_biencoder(syllable_bert, "dual", mention_length=24, entity_length=24)
    store = TokenStore.ensure(small_dataset, model.tokenizer, model.entity_length)
    mentions = split_mentions(small_dataset)[:4]
    tokens = MentionTokens.tokenize(model, split_mentions(small_dataset))
    negatives = SampledNegatives(
        ids=torch.tensor([[5, 6], [7, 5], [8, -1], [9, 10]]),
        valid=torch.tensor([[True, True], [True, True], [True, False], [True, True]]),
    )
    batch = assemble_batch(mentions, np.arange(4), tokens, negatives, store)

    expected_mentions = model.tokenize_mentions(
        [m.context_left for m in mentions],
        [m.mention for m in mentions],
        [m.context_right for m in mentions],
    )
    for key in ("input_ids", "attention_mask"):
        assert torch.equal(batch.mentions[key], expected_mentions[key])
    catalogue = EntityCatalogue.open(small_dataset)
    entities = catalogue.get_many(batch.entity_ids.tolist())
    expected = model.tokenize_entities([e.title for e in entities], [e.text for e in entities])
    for key in ("input_ids", "attention_mask"):
        assert torch.equal(batch.candidates[key], expected[key])


# --------------------------------------------------------------------------------------------
# The negative drawer


def test_retriever_negatives_stay_in_the_training_domains_as_catalogue_ids(
    small_dataset: Path, syllable_bert: Path
) -> None:
    config = config_for(
        small_dataset,
        syllable_bert,
        "negatives.sampler=random",
        "negatives.source=none",
        "refresh.enabled=false",
        "negatives.num_negatives=20",
        "refresh.top_n=20",
    )
    catalogue = EntityCatalogue.open(small_dataset)
    domains = np.asarray(catalogue.domain_of().to_numpy(zero_copy_only=False))
    mentions = split_mentions(small_dataset, "test")  # the last world: local ids differ from global
    allowed = training_entities(catalogue, mentions)
    assert set(domains[allowed]) == {mentions[0].domain} and allowed.min() == 60
    drawer = NegativeDrawer.for_retriever(config, catalogue, mentions)
    drawn = drawer.draw(mentions[:16], NoCandidates(), _generator())
    ids = drawn.ids[drawn.valid]
    assert drawn.valid.all() and len(ids) == 16 * 20
    assert set(domains[ids.numpy()]) <= {m.domain for m in mentions}
    assert ids.min().item() >= allowed.min()  # catalogue ids, not local ones


def test_index_candidates_outside_the_domains_and_known_positives_are_never_drawn(
    small_dataset: Path, syllable_bert: Path, tmp_path: Path
) -> None:
    catalogue = EntityCatalogue.open(small_dataset)
    domains = np.asarray(catalogue.domain_of().to_numpy(zero_copy_only=False))
    mentions = split_mentions(small_dataset, "test")[:2]  # the last world
    same = np.flatnonzero(domains == domains[-1])
    other_domain = int(np.flatnonzero(domains != domains[-1])[0])
    alias = int(next(e for e in same if e not in {m.gold for m in mentions}))
    plain = [int(e) for e in same if e not in {m.gold for m in mentions} | {alias}][:2]
    with_alias = [
        Mention(
            m.mention_id, m.context_left, m.mention, m.context_right, m.gold, m.domain, (alias,)
        )
        for m in mentions
    ]
    # Greedy order: out of the domain, then the alias, then a plain negative.
    cands = np.array([[other_domain, alias, plain[0]], [other_domain, alias, plain[1]]])
    source = FixedNegatives(publish_candidates(tmp_path, mentions, cands) / "train.parquet")

    def first_negative(filter_false_negatives: bool) -> list[int]:
        config = config_for(
            small_dataset,
            syllable_bert,
            *REFRESHED,
            "negatives.sampler=greedy",
            "negatives.num_negatives=1",
            f"negatives.filter_false_negatives={str(filter_false_negatives).lower()}",
        )
        drawer = NegativeDrawer.for_retriever(config, catalogue, with_alias)
        return drawer.draw(with_alias, source, _generator()).ids[:, 0].tolist()

    assert first_negative(True) == plain  # the alias is a known positive
    assert first_negative(False) == [alias, alias]  # unfiltered, only the gold is excluded


def test_retriever_draws_random_until_the_first_refresh(
    small_dataset: Path, syllable_bert: Path, tmp_path: Path
) -> None:
    config = config_for(small_dataset, syllable_bert, *REFRESHED, "negatives.sampler=hard")
    catalogue = EntityCatalogue.open(small_dataset)
    mentions = split_mentions(small_dataset)[:3]
    drawer = NegativeDrawer.for_retriever(config, catalogue, mentions)
    with single_process_group():
        source = RefreshedNegatives(tmp_path / "negatives", "train", Collectives(_cpu()))
        before = drawer.draw(mentions, source, _generator())
        assert before.valid.all() and before.log_q is not None  # uniform log_q of `random`
        cands = np.array([[m.gold, m.gold + 1, m.gold + 2] for m in mentions])
        publish_candidates(tmp_path / "negatives", mentions, cands)
        assert source.poll() and source.version == 1
        after = drawer.draw(mentions, source, _generator())
    assert all(
        set(row[valid].tolist()) <= {m.gold + 1, m.gold + 2}
        for row, valid, m in zip(after.ids, after.valid, mentions, strict=True)
    )


def test_reranker_negatives_are_the_retrievers_top_non_positive_candidates(
    small_dataset: Path, syllable_bert: Path, tmp_path: Path
) -> None:
    catalogue = EntityCatalogue.open(small_dataset)
    gold, alias = 3, 7
    mentions = [Mention("a", "l", "m", "r", gold, "", (alias,)), Mention("b", "l", "m", "r", 1)]
    cands = np.array([[alias, 5, gold], [1, 2, -1]])
    source = FixedNegatives(publish_candidates(tmp_path, mentions, cands) / "train.parquet")
    config = config_for(small_dataset, syllable_bert, "rerank.num_candidates=4")
    drawn = NegativeDrawer.for_reranker(config, len(catalogue), mentions).draw(
        mentions, source, _generator()
    )
    assert drawn.ids.tolist() == [[5, -1, -1], [2, -1, -1]]
    assert drawn.valid.tolist() == [[True, False, False], [True, False, False]]


class NoCandidates:
    """The candidate source of ``negatives.source: none``: never a version."""

    current = None


def _generator() -> torch.Generator:
    return torch.Generator().manual_seed(0)


def _cpu() -> torch.device:
    return torch.device("cpu")


# --------------------------------------------------------------------------------------------
# A worker's micro-batches (the negatives part, no engine) and its optimizer step (no DeepSpeed)


def test_a_workers_micro_batch_is_a_function_of_seed_micro_step_and_rank_alone(
    small_dataset: Path, syllable_bert: Path, tmp_path: Path
) -> None:
    """The same (seed, micro-step, rank) draws the same micro-batch whatever was drawn before (a
    resumed run's first), and leaves torch's global seed where the step's dropout reads it;
    the other rank draws other mentions of the same global batch."""
    data = _training_data(small_dataset, syllable_bert, tmp_path)
    first = data.micro_batch(3)
    dropout = torch.rand(4)
    data.micro_batch(0)
    again = data.micro_batch(3)
    assert torch.equal(torch.rand(4), dropout)
    assert again.mention_ids == first.mention_ids
    for name in ("entity_ids", "gold", "valid"):
        assert torch.equal(getattr(again, name), getattr(first, name)), name
    assert torch.equal(again.candidates["input_ids"], first.candidates["input_ids"])
    other_rank = dataclasses.replace(data, rank=1).micro_batch(3)
    assert len(other_rank.mention_ids) == len(first.mention_ids) == 2
    assert not set(other_rank.mention_ids) & set(first.mention_ids)


def test_a_steps_micro_batches_are_drawn_one_at_a_time_after_the_loss_columns_saw_the_last(
    small_dataset: Path, syllable_bert: Path, tmp_path: Path
) -> None:
    """Optimizer step 1 of two micro-batches each: micro-steps 2 and 3, each drawn (and given
    its loss columns) only once the one before was trained and entered the columns; the
    columns end the step after the last."""
    data = _training_data(small_dataset, syllable_bert, tmp_path)
    calls: list[str] = []
    data.loss_columns = RecordedColumns(calls)
    trained = []
    for batch in data.micro_batches(1, _cpu()):
        calls.append("train")
        trained.append(batch.mention_ids)
    assert calls == ["columns", "train", "observe", "columns", "train", "observe", "after step"]
    data.loss_columns = None
    assert trained == [data.micro_batch(2).mention_ids, data.micro_batch(3).mention_ids]


def test_one_optimizer_step_trains_its_micro_batches_in_order_and_averages_their_losses() -> None:
    """The step without DeepSpeed or a worker: each micro-batch is forwarded, backpropagated and
    stepped before the next is taken, and the step's loss is the mean of theirs."""
    golds = torch.tensor([0, 1])
    batches = [
        _batch_without_tokens(golds, SampledNegatives(ids=ids, valid=torch.ones(2, 2, dtype=bool)))
        for ids in (torch.tensor([[2, 3], [2, 4]]), torch.tensor([[3, 5], [4, 5]]))
    ]
    engine, reference = PlainEngine(), PlainEngine()
    taken = []

    def drawn() -> Iterator[ContrastiveBatch]:
        for batch in batches:
            taken.append(engine.steps)
            yield batch

    loss, mention_ids = train_step(engine, drawn(), NCELoss())
    assert taken == [0, 1]
    losses = [train_micro_batch(reference, batch, NCELoss()) for batch in batches]
    assert loss == pytest.approx(sum(losses) / 2) and losses[0] != losses[1]
    assert mention_ids == ["m0", "m1", "m0", "m1"]
    assert torch.equal(engine.module.weights, reference.module.weights)


def _training_data(dataset: Path, model_dir: Path, run_dir: Path) -> TrainingData:
    """This rank's (0 of 2) training data for the retriever on random negatives, two
    micro-batches of two mentions per step; no process group, no engine."""
    config = synthetic_config(
        run_dir,
        dataset,
        model_dir,
        "training.batch_size=2",
        "training.gradient_accumulation=2",
    )
    model = build_trainable(config, "retriever")
    task = TrainingTask.retriever(config)
    data, skipped = load_training_data(config, task, model, Collectives(_cpu()), 2, _cpu())
    assert skipped == 0 and data.accumulation == 2 and data.rank == 0
    return data


class RecordedColumns:
    """Loss columns that add none and record when they are asked for and shown candidates."""

    memory_bytes = 0

    def __init__(self, calls: list[str]) -> None:
        self.calls = calls

    def columns(
        self, gold: torch.Tensor, positives: list[set[int]]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        self.calls.append("columns")
        return torch.zeros(len(positives), 0, 1), torch.zeros(len(positives), 0, dtype=bool)

    def observe(self, entity_ids: torch.Tensor, *tokens: torch.Tensor) -> None:
        self.calls.append("observe")

    def after_step(self) -> None:
        self.calls.append("after step")


class PlainScores(torch.nn.Module):
    """Scores [B, C] read off one weight matrix, whatever the tokens: a model for the step."""

    gather = None

    def __init__(self) -> None:
        super().__init__()
        self.weights = torch.nn.Parameter(torch.randn(4, 8, generator=_generator()))

    def forward(self, mentions: dict, candidates: dict, *_: object) -> torch.Tensor:
        return self.weights[: len(mentions["input_ids"]), : len(candidates["input_ids"])]


class PlainEngine:
    """What the step asks of a DeepSpeed engine, over plain SGD: call, backward, step."""

    def __init__(self) -> None:
        self.module = PlainScores()
        self.optimizer = torch.optim.SGD(self.module.parameters(), lr=0.5)
        self.steps = 0

    def __call__(self, *inputs: object) -> torch.Tensor:
        return self.module(*inputs)

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def step(self) -> None:
        self.optimizer.step()
        self.optimizer.zero_grad()
        self.steps += 1


# --------------------------------------------------------------------------------------------
# Devices and collectives (pytest -k device)


class FakeCuda(torch.Tensor):
    """A CPU tensor that reports the device cuda:0: what a CUDA tensor looks like to a
    collective, simulated on a machine without a GPU."""

    elem: torch.Tensor

    @staticmethod
    def __new__(cls, elem: torch.Tensor) -> FakeCuda:
        return torch.Tensor._make_wrapper_subclass(
            cls, elem.shape, dtype=elem.dtype, device=torch.device("cuda", 0)
        )

    def __init__(self, elem: torch.Tensor) -> None:
        self.elem = elem

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        def unwrap(value: object) -> object:
            return value.elem if isinstance(value, FakeCuda) else value

        out = func(*tree_map(unwrap, args), **tree_map(unwrap, kwargs or {}))
        if func is torch.ops.aten._local_scalar_dense.default:
            return out
        return tree_map(lambda v: FakeCuda(v) if isinstance(v, torch.Tensor) else v, out)


class FakeCudaDevice(TorchFunctionMode):
    """Tensors created on, or moved to, a CUDA device become :class:`FakeCuda` tensors."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        device = kwargs.get("device")
        if device is not None and torch.device(device).type == "cuda":
            kwargs["device"] = "cpu"
            return FakeCuda(func(*args, **kwargs))
        targets = [a for a in args[1:] if isinstance(a, str | torch.device)]
        if func is torch.Tensor.to and targets and torch.device(targets[0]).type == "cuda":
            source = args[0]
            return source if isinstance(source, FakeCuda) else FakeCuda(source)
        return func(*args, **kwargs)


@contextlib.contextmanager
def backend_rule(monkeypatch: pytest.MonkeyPatch, backend: str) -> Iterator[list[str]]:
    """Run in a one-rank gloo group under ``backend``'s device rule: NCCL takes only CUDA
    tensors and barriers naming their device, gloo only CPU tensors. Collectives assert the
    rule, then run on gloo; under ``nccl`` CUDA tensors are simulated (:class:`FakeCuda`)."""
    required = "cuda" if backend == "nccl" else "cpu"
    calls: list[str] = []
    real_broadcast, real_barrier, real_all_gather = dist.broadcast, dist.barrier, dist.all_gather

    def broadcast(tensor: torch.Tensor, src: int = 0, **options: object) -> object:
        assert tensor.device.type == required, f"broadcast of a {tensor.device} tensor on {backend}"
        calls.append("broadcast")
        return real_broadcast(getattr(tensor, "elem", tensor), src, **options)

    def all_gather(outputs: list[torch.Tensor], tensor: torch.Tensor, **options: object) -> object:
        devices = {t.device.type for t in [*outputs, tensor]}
        assert devices == {required}, f"all_gather of {devices} tensors on {backend}"
        calls.append("all_gather")
        return real_all_gather(
            [getattr(t, "elem", t) for t in outputs], getattr(tensor, "elem", tensor), **options
        )

    def barrier(device_ids: list[int] | None = None, **options: object) -> object:
        assert (device_ids is not None) == (backend == "nccl"), f"barrier {device_ids} on {backend}"
        calls.append("barrier")
        return real_barrier(**options)

    with single_process_group():
        monkeypatch.setattr(dist, "broadcast", broadcast)
        monkeypatch.setattr(dist, "barrier", barrier)
        monkeypatch.setattr(dist, "all_gather", all_gather)
        monkeypatch.setattr(dist, "get_backend", lambda group=None: backend)
        mode = FakeCudaDevice() if backend == "nccl" else contextlib.nullcontext()
        with mode:
            yield calls


@pytest.mark.parametrize("backend", ["gloo", "nccl"])
def test_device_collectives_follow_the_backend_rule(
    backend: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The worker's real collective helpers (negatives poll, resume agreement, candidate gather of
    ``negatives.share: global``, barrier) hand every collective a tensor on the backend's
    device: a CPU tensor broadcast over NCCL fails."""
    device = torch.device("cuda", 0) if backend == "nccl" else torch.device("cpu")
    mentions = [Mention("a", "", "m", "", 1)]
    NegativesStore(tmp_path / "negatives").publish(
        4,
        {"train": MinedSplit(["a"], np.array([[2]]), np.zeros((1, 1), np.float32), np.array([-1]))},
        checkpoint_step=0,
        top_n=1,
        num_entities=3,
    )
    with backend_rule(monkeypatch, backend) as calls:
        collectives = Collectives(device)
        assert collectives.device.type == device.type
        negatives = RefreshedNegatives(tmp_path / "negatives", "train", collectives)
        assert negatives.poll() and negatives.version == 4 and len(mentions) == 1
        assert agreed_resume_step(tmp_path / "run", collectives, reported=None) is None
        kept = torch.tensor([[True, False]], device=device)
        gathered, offset = collectives.all_gather_rows(kept)
        assert offset == 0 and torch.equal(gathered, kept)
        assert gathered.device.type == device.type and gathered.dtype == torch.bool
        collectives.barrier()
    assert calls == ["broadcast", "broadcast", "all_gather", "all_gather", "barrier"]


def test_device_batch_moves_every_tensor_to_the_worker_device() -> None:
    golds = torch.tensor([1, 2])
    negatives = SampledNegatives(
        ids=torch.tensor([[3], [1]]), valid=torch.ones(2, 1, dtype=torch.bool), log_q=None
    )
    batch = _batch_without_tokens(golds, negatives)
    batch.log_q = torch.zeros(batch.valid.shape)
    with FakeCudaDevice():
        moved = batch.to(torch.device("cuda", 0))
        tensors = [moved.entity_ids, moved.gold, moved.valid, moved.log_q]
        tensors += [*moved.mentions.values(), *moved.candidates.values()]
        assert all(t.device.type == "cuda" for t in tensors)


def test_device_nccl_needs_a_cuda_device_and_a_missing_gpu_is_an_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with backend_rule(monkeypatch, "nccl"), pytest.raises(RuntimeError, match="CUDA device"):
        Collectives(torch.device("cpu"))
    monkeypatch.setattr(distributed.ray.train.torch, "get_device", lambda: torch.device("cpu"))
    with pytest.raises(RuntimeError, match=r"cluster\.use_gpu is true"):
        distributed.worker_device(use_gpu=True)
    assert distributed.worker_device(use_gpu=False) == torch.device("cpu")


def test_device_of_a_commands_own_models_follows_the_recipe_never_what_is_visible(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The linker's and the reranker job's models: the CPU unless the recipe asks for GPUs,
    even where CUDA is visible; GPUs asked for and missing are an error."""
    monkeypatch.setattr(devices.torch.cuda, "is_available", lambda: True)
    assert devices.local_device(use_gpu=False) == torch.device("cpu")
    assert devices.local_device(use_gpu=True) == torch.device("cuda")
    monkeypatch.setattr(devices.torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match=r"cluster\.use_gpu is true"):
        devices.local_device(use_gpu=True)


def test_negatives_mined_over_another_catalogue_are_refused(tmp_path: Path) -> None:
    """A negatives version records the catalogue it indexes: converting the data again under
    a run makes its candidate ids name other entities, so the trainer refuses it."""
    data = tmp_path / "data"
    write_dataset(data, [Entity(i, f"k{i}", f"t{i}", "x") for i in range(10)])
    mined_over = catalogue_fingerprint(data)
    negatives = NegativesStore(tmp_path / "negatives")
    negatives.publish(1, {"train": mined_split()}, 4, 3, 10, catalogue=mined_over)
    source = RefreshedNegatives(tmp_path / "negatives", "train", Collectives(_cpu()), data)
    assert source.poll() and source.version == 1
    write_dataset(data, [Entity(i, f"k{i}", f"other {i}", "y") for i in range(10)], overwrite=True)
    resumed = RefreshedNegatives(tmp_path / "negatives", "train", Collectives(_cpu()), data)
    refused = rf"mined over catalogue {mined_over[:16]}…, but .*data now holds catalogue"
    with pytest.raises(StoreError, match=refused):
        resumed.poll()
    with pytest.raises(StoreError, match=refused):
        FixedNegatives(tmp_path / "negatives" / "v1" / "train.parquet", data)

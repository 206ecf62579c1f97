"""The worker's DeepSpeed side in this process (one-rank gloo group, no Ray): the DeepSpeed config
as the engine applies it, gradient accumulation, the export after ZeRO-2/3, a resume that repeats
the uninterrupted run exactly (from the newest checkpoint when the older ones keep only their
export), and a crafted checkpoint that must not run code on resume."""

from __future__ import annotations

import builtins
import json
import math
from pathlib import Path

import deepspeed
import numpy as np
import pytest
import torch
from deepspeed.comm import comm as deepspeed_comm
from deepspeed.ops.op_builder.builder import OpBuilder
from torch.utils.file_baton import FileBaton
from training_helpers import synthetic_config, write_syllable_bert

from hnce.cluster.stores.checkpoints import (
    DEEPSPEED_DIR,
    DEEPSPEED_TAG,
    EXPORT_DIR,
    STATE_FILE,
    checkpoint_dir,
    complete_checkpoints,
    mark_complete,
    verify_checkpoint,
)
from hnce.cluster.stores.negatives_store import MinedSplit, NegativesStore
from hnce.cluster.stores.run_events import read_events
from hnce.cluster.stores.tables import mention_split_path
from hnce.cluster.stores.tables_read import EntityCatalogue, MentionSplit
from hnce.encoders.biencoder import BiEncoder, export_biencoder, load_biencoder
from hnce.events import RunEvent
from hnce.mining.losses import NCELoss
from hnce.mining.samplers import SampledNegatives
from hnce.pipeline.config import Config, ConfigError, TrainingSettings
from hnce.pipeline.recipe_models import build_model, build_trainable
from hnce.pipeline.train.batch import ContrastiveBatch, assemble_batch
from hnce.pipeline.train.checkpointing import UnsafeCheckpointError
from hnce.pipeline.train.deepspeed_config import build_deepspeed_config
from hnce.pipeline.train.one_process import single_process_group
from hnce.pipeline.train.step import contrastive_loss, start_engine, train_micro_batch
from hnce.pipeline.train.task import TrainingTask
from hnce.pipeline.train.worker import WorkerRun

pytestmark = pytest.mark.slow

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def still_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same tiny BERT without dropout: equal computations give equal numbers."""
    return write_syllable_bert(tmp_path_factory.mktemp("bert-still"), dropout=0.0)


@pytest.fixture(autouse=True, scope="module")
def process_group() -> None:
    """One group for the module: DeepSpeed keeps its groups for the life of the process."""
    with single_process_group():
        yield


def recipe(run_dir: Path, small_dataset: Path, syllable_bert: Path, *overrides: str) -> Config:
    return synthetic_config(
        run_dir,
        small_dataset,
        syllable_bert,
        "training.batch_size=4",
        "training.log_every=1",
        *overrides,
    )


def train(
    config: Config,
    report: object = None,
    task: TrainingTask | None = None,
    reported_step: int | None = None,
) -> WorkerRun:
    """Build this rank's worker run (the retriever task unless given; ``reported_step``: Ray
    Train's pointer to resume from) and train it to the end."""
    task = task or TrainingTask.retriever(config)
    run = WorkerRun.build(config, task, CPU, 1, report or (lambda *_: None), reported_step)
    run.train()
    return run


def reranker_task(config: Config) -> TrainingTask:
    """The reranker task over a retriever's top-8 (random same-world entities, gold included)."""
    root = Path(config.data.root)
    mentions = MentionSplit.open(mention_split_path(root, "train")).read_all()
    rng = np.random.default_rng(0)
    cands = np.stack([rng.permutation(30)[:8] for _ in mentions])
    cands[:, 0] = [m.gold for m in mentions]
    scores = -np.arange(8, dtype=np.float32)[None].repeat(len(mentions), 0)
    mined = MinedSplit([m.mention_id for m in mentions], cands, scores, np.zeros(len(mentions)))
    store = NegativesStore(config.run_dir / "retriever-negatives")
    num_entities = len(EntityCatalogue.open(Path(config.data.root)))
    version = store.publish(1, {"train": mined}, 0, top_n=8, num_entities=num_entities)
    return TrainingTask.reranker(config, version / "train.parquet")


def test_deepspeed_config_drives_the_engine(still_model_dir: Path, small_dataset: Path) -> None:
    """Warm-up then linear decay, ZeRO stage and gradient accumulation as the engine applies
    them; bf16 on a CPU is refused before DeepSpeed starts."""
    settings = TrainingSettings(
        steps=8, warmup_steps=4, learning_rate=1e-3, gradient_accumulation=2, zero_stage=2
    )
    config = recipe(Path("unused"), small_dataset, still_model_dir)
    engine = start_engine(build_model(config), settings, CPU)
    assert engine.zero_optimization_stage() == 2 and not engine.bfloat16_enabled()
    batch = _micro_batches(config, [[0, 1, 2, 3]])[0]
    rates, changed = [], []
    for _ in range(settings.steps):
        for _micro in range(settings.gradient_accumulation):
            before = _parameters(engine.module)
            train_micro_batch(engine, batch, NCELoss())
            changed.append(not torch.equal(before, _parameters(engine.module)))
        rates.append(float(engine.get_lr()[0]))
    # The optimizer runs once per two micro-batches. DeepSpeed's linear warm-up starts from 0:
    # the first two optimizer steps run at lr 0 and leave the weights as they were.
    assert changed == [False] * 4 + [False, True] * (settings.steps - 2)
    expected = [0.0, 2.5e-4, 5e-4, 7.5e-4, 1e-3, 7.5e-4, 5e-4, 2.5e-4]
    assert rates == pytest.approx(expected), rates
    with pytest.raises(ValueError, match="bf16 support"):
        build_deepspeed_config(TrainingSettings(precision="bf16"), CPU)


def test_a_lock_left_by_a_killed_worker_does_not_stop_the_next_engine(
    still_model_dir: Path, small_dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker killed while DeepSpeed JIT-loaded its shared-memory op left torch's lock file
    behind, and every later engine on the machine waited on it for ever (a CI run hung so).
    Here a new communication backend starts, as in a fresh worker, with the op compatible and
    not yet loaded and such a lock in the extensions folder; waiting on the lock fails at once."""
    lock = tmp_path / "torch-extensions" / "deepspeed_shm_comm" / "lock"
    lock.parent.mkdir(parents=True)
    lock.touch()
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(lock.parent.parent))

    def wait_for_ever(baton: FileBaton) -> None:
        raise AssertionError(f"waited on {baton.lock_file_path}")

    monkeypatch.setattr(FileBaton, "wait", wait_for_ever)
    monkeypatch.setattr(OpBuilder, "_loaded_ops", {})
    compatible = {**deepspeed.ops.__compatible_ops__, "deepspeed_shm_comm": True}
    monkeypatch.setattr(deepspeed.ops, "__compatible_ops__", compatible)
    monkeypatch.setattr(deepspeed_comm, "cdb", None)
    config = recipe(Path("unused"), small_dataset, still_model_dir)
    engine = start_engine(build_model(config), TrainingSettings(steps=2), CPU)
    assert deepspeed_comm.cdb.shm_comm_op is None and engine.global_steps == 0
    assert lock.exists()


def test_a_cpu_worker_flushes_subnormal_floats(
    still_model_dir: Path, small_dataset: Path, tmp_path: Path
) -> None:
    """Gradients of a well-separated batch underflow into subnormal floats, on which a CPU is
    many times slower; a CPU worker flushes them to zero from its start."""
    torch.set_flush_denormal(False)
    tiny = torch.tensor([1e-30])
    assert (tiny * 1e-10).item() > 0.0  # 1e-40: subnormal in fp32, kept
    config = recipe(tmp_path / "run", small_dataset, still_model_dir, "training.steps=1")
    WorkerRun.build(config, TrainingTask.retriever(config), CPU, 1, lambda *_: None)
    assert (tiny * 1e-10).item() == 0.0


def test_deepspeed_trains_the_projection_with_the_towers(
    still_model_dir: Path, small_dataset: Path
) -> None:
    """``model.projection_size``: DeepSpeed's optimizer moves both projections (ColBERT's token
    projection is trained with the towers), and sum-of-max scores the projected width."""
    config = recipe(
        Path("unused"),
        small_dataset,
        still_model_dir,
        "model.projection_size=8",
        "model.scorer.name=som",
    )
    settings = TrainingSettings(steps=2, warmup_steps=0, learning_rate=1e-3)
    engine = start_engine(build_model(config), settings, CPU)
    model = engine.module.model
    projections = [model.mention_projection, model.entity_projection]
    before = [p.additional_linear.weight.detach().clone() for p in projections]
    batch = _micro_batches(config, [[0, 1, 2, 3]])[0]
    train_micro_batch(engine, batch, NCELoss())
    for projection, weight in zip(projections, before, strict=True):
        assert projection.additional_linear.weight.shape == (8, 32)
        assert not torch.equal(projection.additional_linear.weight, weight)


@pytest.mark.parametrize("zero_stage", [0, 1])
def test_a_lone_worker_skips_only_the_averaging_that_changes_nothing(
    still_model_dir: Path, small_dataset: Path, zero_stage: int
) -> None:
    """One rank with torch's own optimizer (ZeRO 0) has no gradient to average, so the engine
    skips DeepSpeed's averaging pass, and its weights after three steps are exactly those of
    the same engine averaging. Under ZeRO 1 the averaging also hands the gradients to DeepSpeed's
    optimizer, so it stays: skipping it there would leave the weights untrained, and the two
    would differ. The optimizer is torch's fused Adam (one kernel, not a loop over tensors)."""
    config = recipe(Path("unused"), small_dataset, still_model_dir)
    settings = TrainingSettings(steps=3, warmup_steps=0, learning_rate=1e-3, zero_stage=zero_stage)
    batch = _micro_batches(config, [[0, 1, 2, 3]])[0]
    weights = []
    for averaging in (None, True):
        engine = start_engine(build_model(config), settings, CPU)
        if averaging is None:
            assert engine.enable_backward_allreduce == (zero_stage != 0)
        else:
            engine.enable_backward_allreduce = averaging
        before = _parameters(engine.module)
        for _ in range(settings.steps):
            train_micro_batch(engine, batch, NCELoss())
        weights.append(_parameters(engine.module))
        assert not torch.equal(weights[-1], before)
    assert torch.equal(weights[0], weights[1])
    if zero_stage == 0:
        assert engine.optimizer.defaults["fused"] is True


def test_gradient_accumulation_equals_one_step_over_the_concatenated_batch(
    still_model_dir: Path, small_dataset: Path
) -> None:
    """Two micro-batches of 4 accumulate, at the optimizer step, exactly the gradient of one
    micro-batch of the same 8 mentions with the same negatives (the mean of eq. 11 over 8).

    Gradients, not weights, are compared: Adam turns the float noise of a gradient that is zero
    in exact arithmetic (e.g. the last LayerNorm bias, which shifts every candidate's score
    alike) into steps of size lr."""
    config = recipe(Path("unused"), small_dataset, still_model_dir)
    first, second, both = _micro_batches(config, [[0, 1, 2, 3], [4, 5, 6, 7], list(range(8))])
    accumulated = start_engine(
        build_model(config), TrainingSettings(batch_size=4, gradient_accumulation=2), CPU
    )
    train_micro_batch(accumulated, first, NCELoss())  # not a boundary: no optimizer step
    _backward(accumulated, second)
    single = start_engine(build_model(config), TrainingSettings(batch_size=8), CPU)
    _backward(single, both)
    expected = _gradients(single.module)
    scale = float(expected.abs().max())
    assert scale > 1e-2
    torch.testing.assert_close(
        _gradients(accumulated.module), expected, rtol=1e-4, atol=1e-4 * scale
    )


def _backward(engine: object, batch: ContrastiveBatch) -> None:
    """The step's forward, loss and backward without the optimizer step."""
    scores = engine(batch.mentions, batch.candidates, batch.scored_pairs).float()
    engine.backward(contrastive_loss(scores, batch, NCELoss()))


def _gradients(module: torch.nn.Module) -> torch.Tensor:
    return torch.cat(
        [
            (p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
            for p in module.parameters()
        ]
    )


def test_the_recipes_memory_switches_reach_the_towers(
    still_model_dir: Path, small_dataset: Path
) -> None:
    """``model.activation_checkpointing`` turns it on in both towers, and
    ``training.candidate_chunk_size`` makes the step encode the candidates chunk by chunk, each
    chunk again in the backward pass."""
    config = recipe(
        Path("unused"),
        small_dataset,
        still_model_dir,
        "model.activation_checkpointing=true",
        "training.candidate_chunk_size=5",
    )
    model = build_trainable(config, "retriever")
    assert model.mention_tower.is_activation_checkpointing
    assert model.entity_tower.is_activation_checkpointing
    engine = start_engine(model, config.training, CPU)
    runs = []
    model.entity_tower.embeddings.register_forward_hook(lambda *_: runs.append(1))
    batch = _micro_batches(config, [[0, 1, 2, 3]])[0]
    _backward(engine, batch)
    assert len(batch.entity_ids) > 5
    assert len(runs) == 2 * math.ceil(len(batch.entity_ids) / 5)


@pytest.mark.parametrize("stage", [2, 3])
def test_export_after_zero_stage_equals_the_trained_weights(
    stage: int, still_model_dir: Path, small_dataset: Path, tmp_path: Path
) -> None:
    """The checkpoint export under ZeRO-2/3 holds the weights the engine trained (under ZeRO-3
    partitioned across ranks, gathered for the export), poly-encoder codes included."""
    config = recipe(
        tmp_path,
        small_dataset,
        still_model_dir,
        "model.scorer.name=poly",
        "model.scorer.m=4",
        "training.steps=3",
        f"training.zero_stage={stage}",
    )
    run = train(config)
    codes = run.model.scorer.codes
    assert (codes.numel() == 0) == (stage == 3)  # ZeRO-3 keeps only this rank's partition
    with deepspeed.zero.GatheredParameters(list(run.model.parameters())):
        trained = {name: value.clone() for name, value in run.model.state_dict().items()}
    exported = load_biencoder(checkpoint_dir(config.run_dir, 3) / EXPORT_DIR).state_dict()
    initial = build_model(config).state_dict()
    assert exported.keys() == trained.keys()
    for name, value in trained.items():
        assert torch.equal(exported[name], value), name
    moved = [name for name, value in initial.items() if not torch.equal(exported[name], value)]
    assert "scorer.codes" in moved and len(moved) > len(initial) // 2


@pytest.mark.parametrize("stage", [0, 1])
def test_shared_towers_train_checkpoint_and_resume_as_one_module(
    stage: int, still_model_dir: Path, small_dataset: Path, tmp_path: Path
) -> None:
    """``model.shared_towers``: DeepSpeed trains the one tower (and projection), the checkpoint's
    export holds the trained weights and reloads as one module, and a longer run resumes from
    the checkpoint with the two sides still one."""
    overrides = (
        "model.shared_towers=true",
        "model.projection_size=8",
        f"training.zero_stage={stage}",
    )
    config = recipe(tmp_path, small_dataset, still_model_dir, *overrides, "training.steps=3")
    run = train(config)
    model = run.model
    assert model.entity_tower is model.mention_tower
    trained = {name: value.clone() for name, value in model.state_dict().items()}
    exported = load_biencoder(checkpoint_dir(config.run_dir, 3) / EXPORT_DIR)
    assert exported.entity_tower is exported.mention_tower
    assert exported.entity_projection is exported.mention_projection
    initial = build_model(config).state_dict()
    for name, value in exported.state_dict().items():
        assert torch.equal(value, trained[name]), name
    assert not torch.equal(
        initial["mention_projection.additional_linear.weight"],
        trained["mention_projection.additional_linear.weight"],
    )
    longer = recipe(tmp_path, small_dataset, still_model_dir, *overrides, "training.steps=5")
    resumed = train(longer)
    assert resumed.start_step == 3
    assert resumed.model.entity_tower is resumed.model.mention_tower
    final = load_biencoder(checkpoint_dir(config.run_dir, 5) / EXPORT_DIR).state_dict()
    assert not torch.equal(
        final["entity_tower.embeddings.word_embeddings.weight"],
        trained["entity_tower.embeddings.word_embeddings.weight"],
    )


def test_shared_towers_follow_the_recipe_or_the_export(
    still_model_dir: Path, small_dataset: Path, tmp_path: Path
) -> None:
    """Unset, a fresh model has two towers and an export keeps its own; a recipe that asks
    otherwise of an export (e.g. BLINK's two towers, imported) or asks ZeRO-3 is refused."""

    def model_for(path: Path, *overrides: str) -> BiEncoder:
        return build_model(recipe(tmp_path, small_dataset, path, *overrides))

    assert not model_for(still_model_dir).shared_towers
    export_biencoder(model_for(still_model_dir, "model.shared_towers=true"), tmp_path / "one")
    export_biencoder(model_for(still_model_dir), tmp_path / "two")
    assert model_for(tmp_path / "one").shared_towers
    with pytest.raises(ConfigError, match=r"model\.shared_towers.*shared_towers False"):
        model_for(tmp_path / "two", "model.shared_towers=true")
    with pytest.raises(ConfigError, match=r"model\.shared_towers.*zero_stage 3"):
        recipe(
            tmp_path,
            small_dataset,
            still_model_dir,
            "model.shared_towers=true",
            "training.zero_stage=3",
        )


@pytest.mark.parametrize("kind", ["retriever", "reranker"])
def test_resume_repeats_the_uninterrupted_run_exactly(
    kind: str, syllable_bert: Path, small_dataset: Path, tmp_path: Path
) -> None:
    """A run that dies after its step-4 checkpoint and is started again trains steps 5-6 on the
    same mentions, negatives and dropout as a run that never stopped: the same losses, bit for
    bit, and the same mention ids. Both tasks go through the same worker loop.

    The broken run keeps the DeepSpeed state of its newest checkpoint only
    (``keep_deepspeed_state: newest``): publishing step-4 dropped step-2's, and the worker died
    before reporting step-4, so Ray Train's pointer names step-2, which can no longer be resumed
    from: the restart resumes from step-4. Every checkpoint still verifies."""
    overrides = (
        "training.steps=6",
        "training.checkpoint_every=2",
        f"rerank.model={syllable_bert}",
        "rerank.num_candidates=4",
        "rerank.training.steps=6",
        "rerank.training.batch_size=4",
    )
    slim = ("training.keep_deepspeed_state=newest",)

    def task_of(config: Config) -> TrainingTask:
        return TrainingTask.retriever(config) if kind == "retriever" else reranker_task(config)

    whole = recipe(tmp_path / "whole", small_dataset, syllable_bert, *overrides)
    whole_task = task_of(whole)
    train(whole, task=whole_task)
    broken = recipe(tmp_path / "broken", small_dataset, syllable_bert, *overrides, *slim)
    broken_task = task_of(broken)

    def crash_after_second_checkpoint(step: int, loss: float, rank: int) -> None:
        if step == 4:
            raise RuntimeError(f"worker lost after checkpoint {step}")

    with pytest.raises(RuntimeError, match="after checkpoint 4"):
        train(broken, crash_after_second_checkpoint, broken_task)
    resumed = train(broken, task=broken_task, reported_step=2)
    assert resumed.start_step == 4
    assert [e["step"] for e in read_events(broken_task.run_dir, RunEvent.RESUME)] == [4]

    def after_resume(run_dir: Path) -> list[tuple[int, float, list[str]]]:
        steps = read_events(run_dir, RunEvent.STEP)[-2:]
        return [(e["step"], e["loss"], e["mentions"]) for e in steps]

    assert after_resume(broken_task.run_dir) == after_resume(whole_task.run_dir)
    assert [s for s, _, _ in after_resume(whole_task.run_dir)] == [5, 6]

    def with_state(run_dir: Path) -> list[int]:
        """The steps whose checkpoint keeps its DeepSpeed state, every one verified."""
        kept = complete_checkpoints(run_dir)
        return [step for step, path in kept if not verify_checkpoint(path).dropped]

    assert with_state(whole_task.run_dir) == [2, 4, 6]
    assert with_state(broken_task.run_dir) == [6]
    assert not (checkpoint_dir(broken_task.run_dir, 4) / DEEPSPEED_DIR).exists()


class WritesMarker:
    """A pickle that, when loaded without ``weights_only``, creates ``path`` (stands for any
    code an attacker would run)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[object, tuple[str, str]]:
        return builtins.open, (str(self.path), "w")


def test_resume_refuses_a_crafted_state_file_and_runs_none_of_it(
    syllable_bert: Path, small_dataset: Path, tmp_path: Path
) -> None:
    config = recipe(tmp_path / "run", small_dataset, syllable_bert, "training.steps=2")
    train(config)
    directory = checkpoint_dir(config.run_dir, 2)
    states = directory / DEEPSPEED_DIR / DEEPSPEED_TAG / "mp_rank_00_model_states.pt"
    marker = tmp_path / "code-ran"
    torch.save({"module": WritesMarker(marker)}, states)
    torch.load(states, weights_only=False)  # the pickle is live: loading it runs code
    assert marker.is_file()
    marker.unlink()
    # The attacker controls the run directory, so the manifest is re-signed to match.
    state = json.loads((directory / STATE_FILE).read_text())
    mark_complete(directory, state)

    longer = recipe(tmp_path / "run", small_dataset, syllable_bert, "training.steps=4")
    with pytest.raises(UnsafeCheckpointError, match=r"mp_rank_00_model_states\.pt: refusing"):
        WorkerRun.build(longer, TrainingTask.retriever(longer), CPU, 1, lambda *_: None)
    assert not marker.exists()


def _parameters(module: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1).clone() for p in module.parameters()])


def _micro_batches(config: Config, rows: list[list[int]]) -> list[ContrastiveBatch]:
    """Micro-batches of training mentions by row, each mention with the same two negatives
    whatever batch it is in; tokens from the run's stores."""
    from hnce.cluster.stores.tokens import MentionTokens, TokenStore

    mentions = MentionSplit.open(mention_split_path(Path(config.data.root), "train")).read_all()
    model = build_model(config)
    store = TokenStore.ensure(Path(config.data.root), model.tokenizer, model.entity_length)
    tokens = MentionTokens.tokenize(model, mentions)
    batches = []
    for chosen in rows:
        picked = [mentions[i] for i in chosen]
        ids = torch.tensor([[(m.gold + 1) % 30, (m.gold + 2) % 30] for m in picked])
        negatives = SampledNegatives(ids=ids, valid=torch.ones_like(ids, dtype=torch.bool))
        batches.append(assemble_batch(picked, np.asarray(chosen), tokens, negatives, store))
    return batches

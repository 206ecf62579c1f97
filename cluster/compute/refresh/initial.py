"""The initial negatives of a run: what it trains on before the first refresh.

``hnce train`` prepares them as ``negatives.initial`` says (:func:`prepare_initial_negatives`):
BM25's candidates (``lexical``, :mod:`hnce.cluster.stores.bm25_store`) or the starting model's
(``model``: the recipe's untrained model); ``finetune-blink`` always from the imported BLINK
checkpoint. They are published as version 0 of the run's stores (``<run>/index/v0``,
``<run>/negatives/v0``, checkpoint step 0): the stores number every version, and the first is
the initial one. The starting model's index is built like every index
(:mod:`hnce.cluster.compute.index_build`) by the encoder actors. With BLINK's precomputed entity
encodings (``all_entities_large.t7``, a [5903527, 1024] float32 tensor, 24 GB) it needs no
encoding at all: each actor memory-maps the file (``torch.load(mmap=True, weights_only=True)``)
and copies its shard's rows into FAISS, so no process holds more than one shard of it. Row i of
the tensor is BLINK's entity i, which is ``entity_id`` i of a catalogue converted from BLINK's
``entity.jsonl`` (docs/input-formats.md). The train mentions are then mined against that index
by the same actors (top-N), so the trainer draws hard negatives from its first step.

``hnce train`` prepares them while Ray Train starts its controller and workers
(:class:`InitialNegativesBeside`). The encoder actors share the CPUs Ray has free less those the
trainer's workers ask for, plus the threads the waiting trainer lends them under
``training.cores: handover``, and the workers hold their first step until the initial negatives
are published (an ``initial_negatives_wait`` event). A failure is logged the moment it happens
and written to the run's event log as an ``initial_negatives`` event with its error; the workers
read it there and stand down without training, and the driver raises the error. The other way
round, a trainer that fails first abandons them (:meth:`InitialNegativesBeside.abandon`): the
encoding stops within a batch, its finished shards recorded for the next launch to resume, and
the encoder actors are released before the driver raises the trainer's error.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from hnce.cluster.compute.actors import StopRequested
from hnce.cluster.compute.encoder_pool import EncoderPool
from hnce.cluster.compute.entity_encoding import read_encodings
from hnce.cluster.compute.index_build import (
    IndexedModel,
    build_parameters,
    index_entities,
    start_pool,
)
from hnce.cluster.compute.miner import mine_split
from hnce.cluster.compute.refresh.plan import RefreshPlan
from hnce.cluster.compute.refresh.policy import EventSink
from hnce.cluster.compute.retrieval import locked_evaluation_store, version_key
from hnce.cluster.stores.bm25_store import publish_lexical_negatives
from hnce.cluster.stores.index_store import IndexBuilder, IndexVersion
from hnce.cluster.stores.run_events import read_events
from hnce.cluster.stores.tables import mention_split_path
from hnce.cluster.stores.tables_read import EntityCatalogue, MentionSplit, catalogue_fingerprint
from hnce.cluster.stores.tokens import TokenStore
from hnce.errors import InputError
from hnce.events import RunEvent

logger = logging.getLogger(__name__)

INITIAL_VERSION = 0
INITIAL_STEP = 0
#: how long :meth:`InitialNegativesBeside.abandon` waits for the build to stop and its actors to go
ABANDON_SECONDS = 120.0


def check_encodings(path: Path, model: IndexedModel, num_entities: int) -> None:
    """BLINK's ``.t7`` fits the model and the catalogue: one vector per entity (a dual scorer:
    they are BLINK's [CLS] vectors, while multi-m and sum-of-max index several per entity), one
    row per catalogue entity, the model's dimension."""
    scorer = model.description.scorer.name
    if scorer != "dual" or model.vectors_per_entity != 1:
        raise InputError(
            f"{path}: precomputed BLINK encodings hold one vector per entity; the {scorer} "
            f"scorer needs its own (omit the encodings to encode them)"
        )
    encodings = read_encodings(path)
    if len(encodings) != num_entities:
        raise InputError(
            f"{path}: {len(encodings)} encodings but the catalogue has {num_entities} entities; "
            "the catalogue must be BLINK's entity.jsonl converted without rejects"
        )
    dim = model.description.output_size
    if encodings.shape[1] != dim:
        raise InputError(
            f"{path}: encodings of dim {encodings.shape[1]}, the model's entity vectors have "
            f"dim {dim}"
        )


@dataclass(frozen=True)
class TrainerBeside:
    """The trainer that starts while the initial negatives are prepared: the CPUs and GPUs its workers will
    ask for (left to it), the torch threads it lends the encoder actors while it waits for them,
    and the share of a GPU each encoder actor takes beside it
    (:mod:`hnce.cluster.compute.gpu_sharing`)."""

    cpus: float = 0.0
    lent_threads: int = 0
    gpus: float = 0.0
    encoder_gpus: float = 1.0


#: initial negatives with nothing beside them (``hnce refresh --initial``, ``hnce finetune-blink``)
NO_TRAINER = TrainerBeside()


@dataclass(frozen=True)
class InitialIndex:
    """The starting model's index (version 0) as prepared, and whether its catalogue was encoded
    by this preparation (not kept from an earlier start, taken over from an evaluation, or read
    from encodings): only then do its seconds say what a pass over the catalogue costs
    (:func:`hnce.cluster.compute.refresh.timing.initial_negatives_seconds`)."""

    index: IndexVersion
    encoded: bool


def initial_from_model(
    plan: RefreshPlan,
    model: IndexedModel,
    train_split: str,
    encodings: Path | None = None,
    trainer: TrainerBeside = NO_TRAINER,
    stopping: Callable[[], bool] | None = None,
) -> InitialIndex | None:
    """The initial negatives of the imported `model`: its index and the train split mined
    against it (both kept when the run already has them); None when a resumed run's retention
    has already removed version 0. Its encoder
    actors share the CPUs Ray has free less those of the `trainer` starting beside them, and run
    the threads it lends them on top. Once `stopping()` is true the build stops within a batch
    (StopRequested, as :func:`~hnce.cluster.compute.index_build.index_entities`)."""
    store, negatives = plan.index_store, plan.negatives_store
    versions = store.versions()
    if versions and INITIAL_VERSION not in versions:
        return None
    model = dataclasses.replace(model, checkpoint=INITIAL_STEP)
    if encodings is not None:
        check_encodings(encodings, model, len(EntityCatalogue.open(plan.data_dir)))
    elif not versions and take_over_evaluated(plan, model) is not None:
        versions = [INITIAL_VERSION]
    encode = plan.data_dir if encodings is None and not versions else None
    settings = dataclasses.replace(
        plan.pool_settings(alone=True),
        reserved_cpus=trainer.cpus,
        lent_threads=trainer.lent_threads,
        reserved_gpus=trainer.gpus,
        gpus_per_actor=trainer.encoder_gpus,
    )
    pool, tokens = start_pool(model, settings, encode, {})
    with pool:
        if versions:
            version = store.open(INITIAL_VERSION)
        else:
            version = _build_initial_index(plan, pool, model, tokens, encodings, stopping)
        if negatives.current_version() is None:
            held = pool.hold(version, plan.index.depth)
            split = MentionSplit.open(mention_split_path(plan.data_dir, train_split))
            mined = mine_split(pool, held, split, plan.refresh.top_n, description="mining initial")
            negatives.publish(
                INITIAL_VERSION,
                {train_split: mined},
                INITIAL_STEP,
                plan.refresh.top_n,
                version.num_entities,
                catalogue=version.manifest.catalogue,
            )
    return InitialIndex(version, encoded=encode is not None)


def take_over_evaluated(plan: RefreshPlan, model: IndexedModel) -> IndexVersion | None:
    """Index version 0 taken over from the run's evaluation store, where an evaluation of the
    starting model (``hnce eval --checkpoint untrained``, the demo's untrained row) has already
    built its version of this catalogue with these index parameters: its files are linked into
    ``<run>/index/v0``, nothing is encoded again. None when there is no such version."""
    with locked_evaluation_store(plan) as store:
        found = store.find(*version_key(plan, model))
        if found is None:
            return None
        parameters = build_parameters(
            model,
            found.manifest.catalogue,
            found.num_entities,
            plan.index,
            plan.refresh.shard_size,
        )
        return IndexBuilder(plan.index_store, INITIAL_VERSION, parameters).take_over(found)


def _build_initial_index(
    plan: RefreshPlan,
    pool: EncoderPool,
    model: IndexedModel,
    tokens: TokenStore | None,
    encodings: Path | None,
    stopping: Callable[[], bool] | None,
) -> IndexVersion:
    """The initial index (version 0), from `encodings` or from `tokens`."""
    if tokens is not None:
        catalogue, num_entities = tokens.manifest["catalogue"], len(tokens)
    else:
        catalogue = catalogue_fingerprint(plan.data_dir)
        num_entities = len(EntityCatalogue.open(plan.data_dir))
    shard_size = plan.refresh.shard_size
    parameters = build_parameters(model, catalogue, num_entities, plan.index, shard_size, encodings)
    builder = IndexBuilder(plan.index_store, INITIAL_VERSION, parameters)
    return index_entities(
        pool, builder, plan.index, shard_size, encodings, stopping=stopping
    ).version


@dataclass(frozen=True)
class InitialRequest:
    """Where a run's initial negatives come from (``negatives.initial`` as the task resolves it:
    ``lexical``, ``model`` or ``random``, none) and what that source reads: the train split (BM25
    scores it with its constants, :data:`hnce.mining.samplers.lexical.BM25_K1`) and the starting
    model, exported when asked (``model``: the recipe's untrained model)."""

    source: str
    train_split: str
    starting_model: Callable[[], Path] | None = None


def prepare_initial_negatives(
    plan: RefreshPlan,
    request: InitialRequest,
    trainer: TrainerBeside = NO_TRAINER,
    stopping: Callable[[], bool] | None = None,
) -> bool:
    """The initial negatives ``request`` asks for: nothing for random, BM25's top-N for lexical,
    the starting model's top-N (its index built by the encoder actors) for model. A run that has
    them keeps them. True when the catalogue was encoded for them here (:class:`InitialIndex`).

    ``trainer``: the trainer that starts beside the encoder actors (:data:`NO_TRAINER`: none);
    ``stopping``: once true, the model's build stops within a batch (StopRequested)."""
    if request.source == "lexical":
        publish_lexical_negatives(
            plan.negatives_store,
            plan.data_dir,
            request.train_split,
            plan.refresh.top_n,
        )
    elif request.source == "model":
        assert request.starting_model is not None, "initial negatives of a model need the model"
        starting_model = IndexedModel.from_export(request.starting_model())
        prepared = initial_from_model(
            plan, starting_model, request.train_split, trainer=trainer, stopping=stopping
        )
        return prepared is not None and prepared.encoded
    return False


class InitialNegativesBeside:
    """The initial negatives prepared in a driver thread while Ray Train starts the workers
    (module docs), their ``initial_negatives`` event written to ``log``.
    :meth:`raise_if_failed` after the workers have stood down raises its error; :meth:`abandon`
    stops it when the trainer has failed first."""

    def __init__(
        self, plan: RefreshPlan, request: InitialRequest, trainer: TrainerBeside, log: EventSink
    ) -> None:
        self.log = log
        self.error: BaseException | None = None
        self._abandoned = threading.Event()
        self.thread = threading.Thread(
            target=self._prepare,
            args=(plan, request, trainer),
            name="initial-negatives",
            daemon=True,
        )

    def start(self) -> InitialNegativesBeside:
        self.thread.start()
        return self

    def _prepare(self, plan: RefreshPlan, request: InitialRequest, trainer: TrainerBeside) -> None:
        started = time.perf_counter()
        source = request.source
        try:
            encoded = prepare_initial_negatives(plan, request, trainer, self._abandoned.is_set)
        except StopRequested:
            logger.info("initial negatives (%s) abandoned: the trainer failed", source)
            return
        except BaseException as error:  # raised in the driver's thread by raise_if_failed
            self.error = error
            logger.error("initial negatives (%s) failed: %s", source, error)
            self.log.write(
                RunEvent.INITIAL_NEGATIVES,
                initial=source,
                seconds=time.perf_counter() - started,
                error=f"{type(error).__name__}: {error}",
            )
            return
        seconds = time.perf_counter() - started
        logger.info("initial negatives (%s) ready in %.1fs", source, seconds)
        self.log.write(RunEvent.INITIAL_NEGATIVES, initial=source, seconds=seconds, encoded=encoded)

    def abandon(self) -> None:
        """Stop preparing the initial negatives (the trainer failed): the build stops within a
        batch and its encoder actors are released; waits up to :data:`ABANDON_SECONDS`."""
        self._abandoned.set()
        self.thread.join(ABANDON_SECONDS)
        if self.thread.is_alive():
            logger.warning(
                "initial negatives still running %.0fs after they were abandoned", ABANDON_SECONDS
            )

    def raise_if_failed(self) -> None:
        """Wait for the thread and raise what it raised, if anything."""
        self.thread.join()
        if self.error is not None:
            raise self.error


def initial_negatives_error(run_dir: Path, since: float) -> str | None:
    """The error of the initial negatives prepared beside the workers by the driver that started
    at ``since`` (an ``initial_negatives`` event of this launch), None while it is not known to
    have failed."""
    for event in read_events(run_dir, RunEvent.INITIAL_NEGATIVES):
        if event["time"] >= since and event.get("error"):
            return str(event["error"])
    return None

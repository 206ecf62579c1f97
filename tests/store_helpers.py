"""Small, real store versions for tests: training checkpoints, an index version of given vectors,
a negatives split, and a dataset of random words."""

from __future__ import annotations

import dataclasses
import json
import random
import shutil
import string
from pathlib import Path
from typing import Any

import numpy as np

from hnce.cluster.stores.checkpoints import (
    DEEPSPEED_DIR,
    EXPORT_DIR,
    REFRESH_REQUEST,
    REFRESHES_END,
    TRAINING_ENDS_AT,
    checkpoint_dir,
    mark_complete,
)
from hnce.cluster.stores.faiss_index import build_shard_index
from hnce.cluster.stores.index_spec import IndexSpec
from hnce.cluster.stores.index_store import BuildParameters, IndexStore, IndexVersion
from hnce.cluster.stores.negatives_store import MinedSplit
from hnce.cluster.stores.tables import Entity, Mention
from hnce.cluster.stores.tables_write import write_dataset

#: what a placeholder export's ``weights.bin`` holds (tests that tamper with it write other bytes)
PLACEHOLDER_WEIGHTS = b"w" * 64
#: the one DeepSpeed state file a checkpoint gets with ``deepspeed_state=True``
DEEPSPEED_STATE_FILE = "mp_rank_00_model_states.pt"


def write_checkpoint(
    run_dir: Path,
    step: int,
    export: Path | None = None,
    *,
    deepspeed_state: bool = False,
    complete: bool = True,
    refresh: bool | None = None,
    ends_refreshes: bool = False,
    ends_at: float | None = None,
) -> Path:
    """Write checkpoint ``step`` of the run in ``run_dir``, the way the trainer lays it out, and
    return its ``step-<S>/`` directory.

    The directory and its ``export/`` come from :mod:`hnce.cluster.stores.checkpoints`
    (``checkpoint_dir``, ``EXPORT_DIR``, ``DEEPSPEED_DIR``), and completing it is the package's
    own ``mark_complete`` (``training_state.json`` with ``{"step": step}``, then the ``COMPLETE``
    manifest over every file), so loaders verify it like a trained one.

    - ``export``: a real export directory (``export_biencoder``) copied in as ``export/``, for a
      checkpoint that a refresh or an evaluation loads; without it, ``export/`` holds a
      placeholder ``weights.bin`` (:data:`PLACEHOLDER_WEIGHTS`), enough for code that only
      lists, resolves, verifies or prunes checkpoints.
    - ``deepspeed_state``: also write ``deepspeed/mp_rank_00_model_states.pt`` (placeholder
      bytes), for tests of the manifest over the DeepSpeed state.
    - ``complete=False``: no marker, as a checkpoint still being written or left half-written
      by a crash.
    - ``refresh``: the state's ``refresh`` (whether it asks for a refresh); None: no such key,
      as checkpoints written before it existed.
    - ``ends_refreshes``: the state says no refresh would publish before training ends
      (``refreshes_end``).
    - ``ends_at``: when the state says the trainer expects its last step (``training_ends_at``).
    """
    directory = checkpoint_dir(run_dir, step)
    if export is None:
        (directory / EXPORT_DIR).mkdir(parents=True)
        (directory / EXPORT_DIR / "weights.bin").write_bytes(PLACEHOLDER_WEIGHTS)
    else:
        shutil.copytree(export, directory / EXPORT_DIR)
    if deepspeed_state:
        (directory / DEEPSPEED_DIR).mkdir()
        (directory / DEEPSPEED_DIR / DEEPSPEED_STATE_FILE).write_bytes(b"state")
    if complete:
        state: dict[str, object] = {"step": step}
        if refresh is not None:
            state[REFRESH_REQUEST] = refresh
        if ends_refreshes:
            state[REFRESHES_END] = True
        if ends_at is not None:
            state[TRAINING_ENDS_AT] = ends_at
        mark_complete(directory, state)
    return directory


def index_parameters(checkpoint: int = 1, num_entities: int = 60) -> BuildParameters:
    """Build parameters of a dual, 16-dimensional version of ``num_entities`` entities."""
    return BuildParameters(
        checkpoint=checkpoint,
        checkpoint_path=f"checkpoints/step-{checkpoint}",
        model=f"{checkpoint:064x}",
        catalogue="c" * 64,
        source="encoded",
        scorer={"name": "dual"},
        dim=16,
        vectors_per_entity=1,
        num_entities=num_entities,
        index={**IndexSpec().to_json(), "shard_size": 20},
    )


def publish_index(
    store: IndexStore, checkpoint: int, vectors: np.ndarray, shards: int = 3, **changes: Any
) -> IndexVersion:
    """Publish ``vectors`` (one per entity, [N, 16]) as a version from ``checkpoint``; ``changes``
    replace build parameters (:func:`index_parameters`)."""
    parameters = dataclasses.replace(index_parameters(checkpoint, len(vectors)), **changes)
    builder = store.begin(parameters)
    for number, part in enumerate(np.array_split(np.arange(len(vectors)), shards)):
        entities = (int(part[0]), int(part[-1]) + 1)
        builder.add_shard(number, build_shard_index(vectors[part], IndexSpec()), part, entities)
    return builder.publish(shards)


def edit_manifest(path: Path, edit) -> None:
    """Apply `edit` to the JSON manifest at `path` and write it back (no checksum updated)."""
    manifest = json.loads(path.read_text())
    edit(manifest)
    path.write_text(json.dumps(manifest))


def flip_byte(path: Path, offset: int) -> None:
    """Corrupt ``path`` in place: invert the bits of its byte at ``offset`` (negative: from the
    end), as a disk or a copy might."""
    payload = bytearray(path.read_bytes())
    payload[offset] ^= 0xFF
    path.write_bytes(bytes(payload))


def mined_split() -> MinedSplit:
    """Three mentions' top-3 over 10 entities (one with fewer candidates)."""
    return MinedSplit(
        mention_ids=["a", "b", "c"],
        cands=np.array([[4, 2, 9], [1, -1, -1], [7, 8, 3]]),
        scores=np.array([[3, 2, 1], [5, -np.inf, -np.inf], [1, 0.5, 0]], dtype=np.float32),
        gold_ranks=np.array([1, -1, 0]),
    )


def random_word_dataset(root: Path, num_entities: int = 48, mentions: int = 30) -> Path:
    """A dataset of random lower-case words (seeded): ``num_entities`` entities alternating
    between domains "even" and "odd", and ``mentions`` train mentions, each taking its gold's
    domain."""
    rng = random.Random(0)

    def word() -> str:
        return "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(2, 7)))

    def domain(entity_id: int) -> str:
        return ("even", "odd")[entity_id % 2]

    entities = []
    for entity_id in range(num_entities):
        text = " ".join(word() for _ in range(rng.randint(1, 12)))
        entities.append(Entity(entity_id, f"k{entity_id}", word(), text, domain(entity_id)))
    train = []
    for number in range(mentions):
        gold = rng.randrange(num_entities)
        train.append(
            Mention(f"m{number}", word(), word(), word(), gold, domain(gold), golds=(gold,))
        )
    write_dataset(root, entities, {"train": train})
    return root

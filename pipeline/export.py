"""``hnce export``: a run's checkpoint in formats other tools load, its towers and its index as one
pair.

``sentence-transformers``: each tower of a dual model as a sentence-transformers directory (of a
som model as a MultiVectorEncoder's), ``OUT/mention/`` and ``OUT/entity/``
(:mod:`hnce.encoders.sentence_transformers_export`), and in
``OUT/index/`` the FAISS index version of the *same* checkpoint over the run's catalogue, the one
``hnce eval`` and the linker search (:func:`hnce.cluster.compute.retrieval.evaluation_version`:
found by the model's fingerprint in ``<run>/index/`` or ``<run>/eval-index/``, else built once
into ``<run>/eval-index/``, which starts Ray), with the catalogue's keys in entity_id order
(``index/keys.parquet``), so that its rows name entities without the dataset. ``OUT/export.json``
names the checkpoint step and the model fingerprint the towers and the index share. Why not the
run's live index: ``<run>/index/CURRENT`` is the last *refreshed* checkpoint's, usually older
than the one exported, and a mention tower searched against another checkpoint's entity vectors
ranks entities badly without a word. ``index=False`` (``--no-index``) exports the towers alone.

The checkpoint is chosen in the run (``newest`` or ``step-<S>``), refused at once when its
``scorer.json`` names a model the format cannot carry, then verified against its manifest (which
gives the fingerprint its index is found by) and loaded like every other reader of an export.
The index needs the run's recipe (its catalogue and index parameters): the recipe given, or the
``config.yaml`` that ``hnce train`` wrote into the run directory. ``OUT`` is built in a staging
sibling and published whole by rename: it appears complete or not at all, and an existing ``OUT``
is never written over.

Example::

    export_run(Path("runs/demo"), "newest", "sentence-transformers", Path("models/demo"))
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from hnce.cluster.compute.index_build import IndexedModel
from hnce.cluster.compute.retrieval import evaluation_version
from hnce.cluster.compute.session import init_ray
from hnce.cluster.stores.checkpoints import (
    CHECKPOINTS_DIR,
    EXPORT_DIR,
    checkpoint_step,
    checkpoints_root,
    is_complete,
    newest_checkpoint,
)
from hnce.cluster.stores.files import AtomicPath, atomic_write_text, publish_directory, staging
from hnce.cluster.stores.index_store import IndexVersion
from hnce.cluster.stores.tables import DatasetError
from hnce.cluster.stores.tables_read import EntityCatalogue, catalogue_fingerprint
from hnce.encoders.biencoder import SCORER_FILE, load_biencoder, read_description
from hnce.encoders.sentence_transformers_export import (
    check_exportable,
    export_sentence_transformers,
)
from hnce.errors import InputError
from hnce.pipeline.config import Config, load_config
from hnce.pipeline.run import RUN_RECIPE, refresh_plan, refuse_inside_stores

logger = logging.getLogger(__name__)

SENTENCE_TRANSFORMERS = "sentence-transformers"
FORMATS = (SENTENCE_TRANSFORMERS,)
#: ``OUT/index/``: the index version of the exported checkpoint
INDEX_PART = "index"
#: ``OUT/index/keys.parquet``: column ``key``, row i the key of entity_id i
KEYS_FILE = "keys.parquet"
#: ``OUT/export.json``: the checkpoint step and model fingerprint the towers and index share
PAIR_FILE = "export.json"
_STEP = re.compile(r"^step-\d+$")


def export_run(
    source: Path, checkpoint: str, export_format: str, out: Path, index: bool = True
) -> dict[str, Path]:
    """Export checkpoint ``checkpoint`` (``newest`` | ``step-<S>``) of the run ``source`` (its
    directory, or a recipe naming it in ``run.dir``) as ``export_format`` into ``out``, with its
    index version unless ``index`` is False; returns the published directories by part
    (``mention``, ``entity``, ``index``)."""
    if export_format not in FORMATS:
        raise InputError(f"--format {export_format!r}: expected one of {list(FORMATS)}")
    out = Path(out)
    if out.exists():
        raise InputError(
            f"{out}: already exists; an export is never written over, choose another --out"
        )
    run_dir = run_directory(source)
    refuse_inside_stores(out, run_dir, "--out")
    step, directory = checkpoint_directory(run_dir, checkpoint)
    check_description(directory / EXPORT_DIR)
    config = run_recipe(Path(source), run_dir) if index else None
    model = IndexedModel.from_checkpoint(directory, step)  # verified against COMPLETE
    logger.info(
        "exporting %s (model %s); its towers are read on the CPU", directory, model.fingerprint
    )
    with staging(out) as building:
        written = export_sentence_transformers(load_biencoder(model.export_dir, "cpu"), building)
        version = None
        if config is not None:
            written[INDEX_PART] = building / INDEX_PART
            version = export_index(config, model, written[INDEX_PART])
        write_pair(building / PAIR_FILE, model, version)
        publish_directory(building, out)
    return {name: out / path.name for name, path in written.items()}


def run_directory(source: Path) -> Path:
    """The run directory ``source`` names: itself, or a recipe's ``run.dir``."""
    source = Path(source)
    if source.is_dir():
        return source
    if source.is_file():
        return load_config(source).run_dir
    raise InputError(f"{source}: neither a run directory nor a recipe")


def run_recipe(source: Path, run_dir: Path) -> Config:
    """The recipe of the run in ``run_dir``, which says over which catalogue and with which
    index parameters its index versions are built: the recipe ``source``, or the ``config.yaml``
    that ``hnce train`` wrote into the run directory ``source``; its ``run.dir`` is ``run_dir``
    wherever the run was written."""
    recipe = source if source.is_file() else run_dir / RUN_RECIPE
    if not recipe.is_file():
        raise InputError(
            f"{recipe}: missing; the index exported beside the towers is over the catalogue the "
            f"run's recipe names: give the recipe instead of the run directory, or --no-index "
            f"for the towers alone"
        )
    return load_config(recipe, [f"run.dir={run_dir}"])


def checkpoint_directory(run_dir: Path, checkpoint: str) -> tuple[int, Path]:
    """(step, complete ``step-<S>/`` directory) of ``checkpoint`` (``newest`` | ``step-<S>``)."""
    if checkpoint == "newest":
        newest = newest_checkpoint(run_dir)
        if newest is None:
            raise InputError(f"{checkpoints_root(run_dir)}: no complete checkpoint")
        return newest
    if not _STEP.match(checkpoint):
        raise InputError(f"--checkpoint {checkpoint!r}: expected newest or step-<S>")
    directory = checkpoints_root(run_dir) / checkpoint
    if not is_complete(directory):
        raise InputError(f"{directory}: no complete checkpoint in {CHECKPOINTS_DIR}/")
    return checkpoint_step(directory), directory


def check_description(export_dir: Path) -> None:
    """Refuse, before anything is verified or loaded, a checkpoint whose ``scorer.json`` names a
    model the export cannot carry (:func:`check_exportable`); the loaded model is checked again."""
    description = read_description(export_dir)
    source = str(export_dir / SCORER_FILE)
    check_exportable(
        description.scorer.name, description.projection_size, description.pooling, source
    )


def export_index(config: Config, model: IndexedModel, target: Path) -> IndexVersion:
    """The index version of ``model`` over the recipe's catalogue (found, or built once: Ray
    starts then), copied into ``target`` with the catalogue's keys; the evaluation store stays
    locked until the copy is complete, so its retention cannot remove the version meanwhile."""
    plan = refresh_plan(config)

    def start_ray() -> None:
        logger.info(
            "starting Ray (or joining cluster.address) for the encoder actors that encode the "
            "catalogue with this checkpoint; --no-index exports the towers alone"
        )
        init_ray(config.cluster, config.refresh.num_encoders * config.refresh.encoder_cpus)

    with evaluation_version(plan, model, start_ray) as version:
        logger.info(
            "exporting index v%d of %s (model %s, checkpoint %s)",
            version.version,
            version.path.parent,
            version.manifest.model,
            version.checkpoint,
        )
        version.copy_to(target)
    write_keys(plan.data_dir, version, target / KEYS_FILE)
    return version


def write_keys(data_dir: Path, version: IndexVersion, path: Path) -> None:
    """The catalogue's keys in entity_id order (column ``key``, row i entity i's), so that an
    index row's entity_id names its entity without the dataset; refused when the catalogue is no
    longer the one the version was built over (republished meanwhile)."""
    keys = EntityCatalogue.open(data_dir).keys()
    if catalogue_fingerprint(data_dir) != version.manifest.catalogue:
        raise DatasetError(
            f"{data_dir}: its catalogue changed while index v{version.version} of "
            f"{version.path.parent} was exported; export again"
        )
    with AtomicPath(path) as temporary:  # a write the machine refuses names the file
        pq.write_table(pa.table({"key": keys}), temporary)


def write_pair(path: Path, model: IndexedModel, version: IndexVersion | None) -> None:
    """``export.json``: the checkpoint step and the model fingerprint of the towers, which the
    index's ``manifest.json`` records as its ``model`` (the version was found by it), and the
    catalogue it is over (None without an index)."""
    pair = {
        "checkpoint": model.checkpoint,
        "model": model.fingerprint,
        "catalogue": None if version is None else version.manifest.catalogue,
    }
    atomic_write_text(path, json.dumps(pair, indent=2) + "\n")

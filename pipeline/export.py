"""``hnce export``: a run's trained model in a format other tools load.

``sentence-transformers``: each tower of a dual model as a sentence-transformers directory,
``OUT/mention/`` and ``OUT/entity/`` (:mod:`hnce.encoders.sentence_transformers_export`). The
checkpoint is chosen in the run (``newest`` or ``step-<S>``), refused at once when its
``scorer.json`` names a model the format cannot carry, then verified against its manifest and
loaded like every other reader of an export. ``OUT`` is built in a staging sibling and published
whole by rename: it appears complete or not at all, and an existing ``OUT`` is never written over.

Example::

    export_run(Path("runs/demo"), "newest", "sentence-transformers", Path("models/demo"))
"""

from __future__ import annotations

import re
from pathlib import Path

from hnce.cluster.stores.checkpoints import (
    CHECKPOINTS_DIR,
    EXPORT_DIR,
    checkpoints_root,
    is_complete,
    newest_checkpoint,
    resolve_checkpoint,
)
from hnce.cluster.stores.files import publish_directory, staging
from hnce.encoders.biencoder import SCORER_FILE, load_biencoder, read_description
from hnce.encoders.sentence_transformers_export import (
    check_exportable,
    export_sentence_transformers,
)
from hnce.errors import InputError
from hnce.pipeline.config import load_config
from hnce.pipeline.run import refuse_inside_stores

SENTENCE_TRANSFORMERS = "sentence-transformers"
FORMATS = (SENTENCE_TRANSFORMERS,)
_STEP = re.compile(r"^step-\d+$")


def export_run(source: Path, checkpoint: str, export_format: str, out: Path) -> dict[str, Path]:
    """Export checkpoint ``checkpoint`` (``newest`` | ``step-<S>``) of the run ``source`` (its
    directory, or a recipe naming it in ``run.dir``) as ``export_format`` into ``out``; returns
    the published directories by tower."""
    if export_format not in FORMATS:
        raise InputError(f"--format {export_format!r}: expected one of {list(FORMATS)}")
    out = Path(out)
    if out.exists():
        raise InputError(
            f"{out}: already exists; an export is never written over, choose another --out"
        )
    run_dir = run_directory(source)
    refuse_inside_stores(out, run_dir, "--out")
    directory = checkpoint_directory(run_dir, checkpoint)
    check_description(directory / EXPORT_DIR)
    _, export_dir = resolve_checkpoint(run_dir, str(directory))  # verified against COMPLETE
    model = load_biencoder(export_dir).eval()
    with staging(out) as building:
        written = export_sentence_transformers(model, building)
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


def checkpoint_directory(run_dir: Path, checkpoint: str) -> Path:
    """The complete ``step-<S>/`` directory of ``checkpoint`` (``newest`` | ``step-<S>``)."""
    if checkpoint == "newest":
        newest = newest_checkpoint(run_dir)
        if newest is None:
            raise InputError(f"{checkpoints_root(run_dir)}: no complete checkpoint")
        return newest[1]
    if not _STEP.match(checkpoint):
        raise InputError(f"--checkpoint {checkpoint!r}: expected newest or step-<S>")
    directory = checkpoints_root(run_dir) / checkpoint
    if not is_complete(directory):
        raise InputError(f"{directory}: no complete checkpoint in {CHECKPOINTS_DIR}/")
    return directory


def check_description(export_dir: Path) -> None:
    """Refuse, before anything is verified or loaded, a checkpoint whose ``scorer.json`` names a
    model the export cannot carry (:func:`check_exportable`); the loaded model is checked again."""
    description = read_description(export_dir)
    source = str(export_dir / SCORER_FILE)
    check_exportable(description.scorer.name, description.projection_size, source)

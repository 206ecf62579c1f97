"""KILT-format predictions and entity-linking accuracy against the whole catalogue.

Predictions are what KILT's scorer reads: one line per input id, in input order,
``{"id", "output": [{"answer": title, "provenance": [{"wikipedia_id", "title"}]}]}``. Every line
of every input file gets one, ``test_without_answers`` included, so the inputs are read here
directly instead of from the Parquet splits (which leave out rows a converter rejected), through
the converter's own parser and bad-row policy.

Accuracy (paper §6.8, Table 4) counts every labelled mention: one whose gold is missing from the
catalogue (``gold = MISSING_GOLD``) cannot be predicted and counts as an error; such mentions are
also counted and reported on their own, never dropped silently.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hnce.cluster.compute.index_build import IndexedModel
from hnce.cluster.compute.refresh.plan import RefreshPlan
from hnce.cluster.compute.retrieval import retrieve
from hnce.cluster.stores.files import AtomicPath
from hnce.cluster.stores.tables import Mention, mention_split_path
from hnce.cluster.stores.tables_read import EntityCatalogue, MentionSplit
from hnce.pipeline.data.bad_rows import BadRowPolicy, iter_json_lines
from hnce.pipeline.data.kilt import aida_input, aida_split_name


@dataclass(frozen=True)
class KiltInput:
    """One input line: its id and the mention in context."""

    id: str
    context_left: str
    mention: str
    context_right: str
    labelled: bool  # the line has a non-empty ``output``


def read_kilt_inputs(path: Path, policy: BadRowPolicy | None = None) -> list[KiltInput]:
    """Every line of a KILT AIDA file, read by the converter's parser
    (:func:`hnce.pipeline.data.kilt.aida_input`) under ``policy``: strict by default, so a malformed
    line is an error naming the file and line instead of a missing prediction."""
    policy = policy or BadRowPolicy()
    inputs: list[KiltInput] = []
    for row in iter_json_lines(Path(path), policy):
        found = aida_input(row, policy)
        if found is None:
            continue
        mention_id, (left, mention, right) = found
        outputs = row.record.get("output")
        labelled = isinstance(outputs, list) and any(
            isinstance(o, dict) and (o.get("answer") or o.get("provenance")) for o in outputs
        )
        inputs.append(KiltInput(mention_id, left, mention, right, labelled))
    return inputs


def as_mentions(inputs: Sequence[KiltInput]) -> list[Mention]:
    """Inputs in the mention contract (gold unknown), for the encoders."""
    return [
        Mention(item.id, item.context_left, item.mention, item.context_right, -1) for item in inputs
    ]


def write_kilt_predictions(
    path: Path, inputs: Sequence[KiltInput], predicted: np.ndarray, catalogue: EntityCatalogue
) -> int:
    """One KILT line per input, in input order, naming the top-1 entity; returns lines written.

    ``wikipedia_id`` is the entity's catalogue key (its Wikipedia page id, for a catalogue from
    BLINK's entity.jsonl or the KILT knowledge source).
    """
    if len(predicted) != len(inputs):
        raise ValueError(f"{len(inputs)} inputs but {len(predicted)} predictions")
    entities = catalogue.get_many([max(int(i), 0) for i in predicted])
    with AtomicPath(path) as temporary, temporary.open("w", encoding="utf-8") as handle:
        for item, entity_id, entity in zip(inputs, predicted, entities, strict=True):
            output = []
            if entity_id >= 0:
                provenance = [{"wikipedia_id": entity.key, "title": entity.title}]
                output = [{"answer": entity.title, "provenance": provenance}]
            handle.write(json.dumps({"id": item.id, "output": output}) + "\n")
    return len(inputs)


@dataclass
class LinkingAccuracy:
    """Accuracy of top-1 predictions on one labelled split, against every catalogue entity."""

    split: str
    mentions: int
    missing_gold: int  # gold not in the catalogue: reported, and counted as errors
    correct: int
    recall_at_k: float  # share of mentions with a gold among the top k candidates
    k: int

    @property
    def accuracy(self) -> float:
        """Unnormalized accuracy: correct / all labelled mentions (missing golds are errors)."""
        return self.correct / self.mentions if self.mentions else 0.0

    @property
    def accuracy_in_catalogue(self) -> float:
        """Accuracy over the mentions whose gold is in the catalogue."""
        present = self.mentions - self.missing_gold
        return self.correct / present if present else 0.0

    def to_json(self) -> dict[str, object]:
        return {
            **asdict(self),
            "accuracy": self.accuracy,
            "accuracy_in_catalogue": self.accuracy_in_catalogue,
        }


def linking_accuracy(
    split: str, mentions: Sequence[Mention], candidates_by_id: dict[str, np.ndarray]
) -> LinkingAccuracy:
    """Accuracy of the candidates (best first) found for each labelled mention, by mention id.

    A mention with no candidates (rejected from the predictions' inputs) counts as an error.
    """
    missing = correct = hits = 0
    k = len(next(iter(candidates_by_id.values()))) if candidates_by_id else 0
    for mention in mentions:
        golds = {g for g in (mention.golds or (mention.gold,)) if g >= 0}
        if not golds:
            missing += 1
            continue
        found = candidates_by_id.get(mention.mention_id)
        if found is None:
            continue
        correct += int(found[0] >= 0 and int(found[0]) in golds)
        hits += int(any(int(c) in golds for c in found if c >= 0))
    return LinkingAccuracy(
        split=split,
        mentions=len(mentions),
        missing_gold=missing,
        correct=correct,
        recall_at_k=hits / len(mentions) if mentions else 0.0,
        k=k,
    )


@dataclass
class SplitResult:
    """Predictions of one input file and, when it is labelled, accuracy before and after."""

    file: str
    split: str
    inputs: int
    predictions: str
    index: str  # the index version the predictions were searched in
    before: LinkingAccuracy | None = None
    after: LinkingAccuracy | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "file": self.file,
            "split": self.split,
            "inputs": self.inputs,
            "predictions": self.predictions,
            "index": self.index,
            "before": None if self.before is None else self.before.to_json(),
            "after": None if self.after is None else self.after.to_json(),
        }


def link_files(
    plan: RefreshPlan,
    model: IndexedModel,
    aida: Sequence[Path],
    k: int,
    predictions_dir: Path | None,
) -> list[SplitResult]:
    """Top-``k`` entities of every input of every file under ``model``, in one search through
    the cluster; predictions (top 1) written to ``predictions_dir/<file name>``; accuracy for the
    files with a labelled Parquet split."""
    files = [(Path(path), read_kilt_inputs(Path(path))) for path in aida]
    mentions = [mention for _, inputs in files for mention in as_mentions(inputs)]
    retrieved = retrieve(plan, model, mentions, k)
    catalogue = EntityCatalogue.open(plan.data_dir)
    results, offset = [], 0
    for path, inputs in files:
        found = retrieved.cands[offset : offset + len(inputs)]
        offset += len(inputs)
        written = ""
        if predictions_dir is not None:
            target = predictions_dir / path.name
            write_kilt_predictions(target, inputs, found[:, 0], catalogue)
            written = str(target)
        split = aida_split_name(path)
        accuracy = None
        split_path = mention_split_path(plan.data_dir, split)
        if split != "train" and split_path.is_file():
            labelled = MentionSplit.open(split_path).read_all()
            by_id = {item.id: row for item, row in zip(inputs, found, strict=True)}
            accuracy = linking_accuracy(split, labelled, by_id)
        index = str(retrieved.index_version.path)
        results.append(SplitResult(path.name, split, len(inputs), written, index, after=accuracy))
    return results

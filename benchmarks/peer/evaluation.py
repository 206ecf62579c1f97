"""The one evaluation path of every model: hnce's ``BiEncoder`` embeds the held-out mentions and
the whole catalogue, scores are exact (dot product, or cosine for the peer, whose Normalize
module and loss use L2-normalised vectors), recall from ``hnce.pipeline.metrics``.

Example::

    held_out = held_out_set(config)
    recall = exact_recall(dual_encoder(minilm_path(), config), held_out, normalise=False)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from benchmarks.peer.curves import KS, Curve, Recall
from hnce.cluster.compute.recall import hits_at, summarise
from hnce.cluster.stores.tables import Mention, mention_split_path
from hnce.cluster.stores.tables_read import EntityCatalogue, MentionSplit
from hnce.encoders.biencoder import BiEncoder, build_biencoder
from hnce.pipeline.config import Config

ENCODE_BATCH = 256


@dataclass
class HeldOut:
    """The held-out mentions and the catalogue every model is evaluated on."""

    mentions: list[Mention]
    titles: list[str | None]
    texts: list[str]


def held_out_set(config: Config) -> HeldOut:
    """The recipe's evaluation split and its whole catalogue."""
    root = Path(config.data.root)
    catalogue = EntityCatalogue.open(root)
    mentions = MentionSplit.open(mention_split_path(root, config.data.eval_split)).read_all()
    return HeldOut(mentions, catalogue.titles().to_pylist(), catalogue.texts().to_pylist())


def training_mentions(config: Config, mention_ids: Sequence[str]) -> list[Mention]:
    """The training split's mentions of ``mention_ids``, in their order."""
    split = mention_split_path(Path(config.data.root), config.data.train_split)
    by_id = {m.mention_id: m for m in MentionSplit.open(split).read_all()}
    return [by_id[mention_id] for mention_id in mention_ids]


def dual_encoder(path: Path, config: Config) -> BiEncoder:
    """The model at ``path`` as a dual ``BiEncoder`` with the recipe's mention and entity lengths."""
    return build_biencoder(
        path,
        "dual",
        mention_length=config.model.mention_length,
        entity_length=config.model.entity_length,
    )


def catalogue_vectors(model: BiEncoder, held_out: HeldOut) -> tuple[torch.Tensor, torch.Tensor]:
    """The catalogue's index vectors [V, d] (one an entity for dual, one a kept token for som)
    and each vector's entity id [V]."""
    model.eval()
    vectors, owners = [], []
    with torch.inference_mode():
        for start in range(0, len(held_out.texts), ENCODE_BATCH):
            tokens = model.tokenize_entities(
                held_out.titles[start : start + ENCODE_BATCH],
                held_out.texts[start : start + ENCODE_BATCH],
            )
            batch_vectors, rows = model.entity_index_vectors(**tokens)
            vectors.append(batch_vectors)
            owners.append(rows + start)
    return torch.cat(vectors), torch.cat(owners)


def embed(model: BiEncoder, held_out: HeldOut) -> tuple[torch.Tensor, torch.Tensor]:
    """Query vectors [M, d] of the held-out mentions and index vectors [E, d] of the catalogue."""
    catalogue, _ = catalogue_vectors(model, held_out)
    with torch.inference_mode():
        mentions = held_out.mentions
        tokens = model.tokenize_mentions(
            [m.context_left for m in mentions],
            [m.mention for m in mentions],
            [m.context_right for m in mentions],
        )
        queries = model.mention_query_vectors(**tokens)[:, 0].float()
    return queries, catalogue


def ranked_candidates(
    queries: torch.Tensor, catalogue: torch.Tensor, normalise: bool, depth: int = max(KS)
) -> np.ndarray:
    """Each mention's top ``depth`` entity ids [M, depth] by exact inner product (or,
    ``normalise``d, cosine)."""
    with torch.inference_mode():
        if normalise:
            queries = torch.nn.functional.normalize(queries, dim=-1)
            catalogue = torch.nn.functional.normalize(catalogue, dim=-1)
        return (queries @ catalogue.T).topk(depth, dim=1).indices.numpy()


def recall_of(
    queries: torch.Tensor, catalogue: torch.Tensor, held_out: HeldOut, normalise: bool
) -> Recall:
    """R@k of exact inner-product (or, ``normalise``d, cosine) search of every mention."""
    return recall_of_candidates(ranked_candidates(queries, catalogue, normalise), held_out)


def recall_of_candidates(candidates: np.ndarray, held_out: HeldOut) -> Recall:
    """R@k of each held-out mention's ranked candidate entity ids [M, ≥ max(KS)]."""
    mentions = held_out.mentions
    hits = hits_at(candidates, [m.golds for m in mentions], KS)
    report = summarise("", hits, [m.domain for m in mentions], KS, len(held_out.texts))
    return {k: report.recall[k] for k in KS}


def exact_recall(model: BiEncoder, held_out: HeldOut, normalise: bool) -> Recall:
    """R@k of ``model`` over the whole catalogue, scored exactly (dual: one vector a side)."""
    return recall_of(*embed(model, held_out), held_out, normalise)


def recall_untrained(model: BiEncoder, held_out: HeldOut) -> dict[str, Recall]:
    """R@k of the untrained ``model`` scored by dot product (hnce's) and cosine (the peer's)."""
    vectors = embed(model, held_out)
    return {
        "dot": recall_of(*vectors, held_out, False),
        "cosine": recall_of(*vectors, held_out, True),
    }


def evaluate_curve(
    curve: Curve, model_dirs: Sequence[str], load: Callable[[str], BiEncoder], held_out: HeldOut
) -> None:
    """Fill ``curve``'s recall at each of its points from the saved models."""
    normalise = curve.name.startswith("sentence")
    for index, directory in enumerate(model_dirs):
        seconds, step, _ = curve.points[index]
        curve.points[index] = (seconds, step, exact_recall(load(directory), held_out, normalise))

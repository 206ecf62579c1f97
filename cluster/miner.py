"""Mine top-N candidates for a mention split against an index version (DESIGN.md §4, §5).

The mentions are encoded by the mention tower of the checkpoint the index version was built from
(through the encoder pool), searched top-N, and returned with the rank of the gold for
diagnostics. Nothing is excluded here: the gold, aliases and known positives stay in the list and
the sampler (mining/) filters them with the false-negative filter, which sees every positive.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
from tqdm import tqdm

from cluster.encoder_pool import EncoderPool, encode_mention_queries
from cluster.index_store import IndexVersion
from cluster.negatives_store import MinedSplit
from cluster.sharded_index import ShardedSearcher
from cluster.tables import Mention, MentionSplit
from encoders.biencoder import BiEncoder


def gold_ranks(cands: np.ndarray, gold: np.ndarray) -> np.ndarray:
    """Position of each row's gold in its candidate list, -1 when absent (int32 [M])."""
    hits = cands == gold[:, None]
    return np.where(hits.any(axis=1), hits.argmax(axis=1), -1).astype(np.int32)


def mine_split(
    pool: EncoderPool,
    index_version: IndexVersion,
    split: MentionSplit,
    top_n: int,
    batch_size: int = 256,
    description: str = "mining",
) -> MinedSplit:
    """Top-`top_n` entities of every mention of `split` under `index_version`."""
    mention_ids: list[str] = []
    golds: list[int] = []

    def batches() -> Iterator[tuple[list[str], list[str], list[str]]]:
        for mentions in split.iter_batches(batch_size):
            mention_ids.extend(m.mention_id for m in mentions)
            golds.extend(m.gold for m in mentions)
            yield _columns(mentions)

    cands, scores = [], []
    with tqdm(total=len(split), desc=description, unit="mentions", unit_scale=True) as bar:
        for queries in pool.encode_mentions(batches()):
            batch_cands, batch_scores = index_version.search(queries, top_n)
            cands.append(batch_cands)
            scores.append(batch_scores)
            bar.update(len(queries))
    if not cands:
        empty = np.zeros((0, top_n))
        return MinedSplit([], empty.astype(np.int64), empty.astype(np.float32), np.zeros(0))
    all_cands = np.concatenate(cands)
    return MinedSplit(
        mention_ids=mention_ids,
        cands=all_cands,
        scores=np.concatenate(scores),
        gold_ranks=gold_ranks(all_cands, np.asarray(golds, dtype=np.int64)),
    )


def search_mentions(
    model: BiEncoder,
    searcher: ShardedSearcher,
    mentions: Sequence[Mention],
    k: int,
    batch_size: int = 256,
    progress: bool = True,
    description: str = "search mentions",
) -> tuple[np.ndarray, np.ndarray]:
    """In-process counterpart of :func:`mine_split` for a model already in memory: the top-k
    (entity ids int64 [M, k], scores float32 [M, k]) of each mention under ``searcher``."""
    ids, scores = [], []
    for start in tqdm(
        range(0, len(mentions), batch_size), desc=description, unit="batch", disable=not progress
    ):
        queries = encode_mention_queries(
            model, *_columns(list(mentions[start : start + batch_size]))
        )
        batch_ids, batch_scores = searcher.search(queries, k)
        ids.append(batch_ids)
        scores.append(batch_scores)
    if not ids:
        return np.zeros((0, k), np.int64), np.zeros((0, k), np.float32)
    return np.concatenate(ids), np.concatenate(scores)


def _columns(mentions: list[Mention]) -> tuple[list[str], list[str], list[str]]:
    return (
        [m.context_left for m in mentions],
        [m.mention for m in mentions],
        [m.context_right for m in mentions],
    )

"""Top-N candidates of mentions under an index version held by the encoder actors (docs/math.md, docs/refresh.md).

The mentions are encoded by the mention tower of the model the index version was built from (in
the encoder actors), their query vectors go straight to the shard holders, and the per-holder
top-N lists are merged here (`hnce.cluster.compute.shard_holders`). Nothing is excluded: the gold, aliases and
known positives stay in the list and the sampler (mining/) filters them with the false-negative
filter, which sees every positive.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

import numpy as np
from tqdm import tqdm

from hnce.cluster.compute.encoder_pool import EncoderPool
from hnce.cluster.compute.shard_holders import HeldIndex
from hnce.cluster.stores.negatives_store import MinedSplit
from hnce.cluster.stores.tables import Mention
from hnce.cluster.stores.tables_read import MentionSplit
from hnce.encoders.progress import progress_bar


def gold_ranks(cands: np.ndarray, gold: np.ndarray) -> np.ndarray:
    """Position of each row's gold in its candidate list, -1 when absent (int32 [M]); padding
    (-1) never matches a missing gold."""
    hits = (cands == gold[:, None]) & (cands >= 0)
    return np.where(hits.any(axis=1), hits.argmax(axis=1), -1).astype(np.int32)


def search_mentions(
    pool: EncoderPool,
    held: HeldIndex,
    batches: Iterable[Sequence[Mention]],
    k: int,
    allowed: np.ndarray | None = None,
    bar: tqdm | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Top-k (entity ids int64 [M, k], scores float32 [M, k]) of every mention of `batches`, in
    order; `allowed` restricts the search to those entity ids (a Zeshel world)."""
    ids, scores = [], []
    queries = pool.mention_queries(_columns(batch) for batch in batches)
    for batch_ids, batch_scores in held.search_stream(queries, k, allowed):
        ids.append(batch_ids)
        scores.append(batch_scores)
        if bar is not None:
            bar.update(len(batch_ids))
    if not ids:
        return np.zeros((0, k), np.int64), np.zeros((0, k), np.float32)
    return np.concatenate(ids), np.concatenate(scores)


def mine_split(
    pool: EncoderPool,
    held: HeldIndex,
    split: MentionSplit,
    top_n: int,
    batch_size: int = 256,
    description: str = "mining",
) -> MinedSplit:
    """Top-`top_n` entities of every mention of `split` under the held index version."""
    mention_ids: list[str] = []
    golds: list[int] = []

    def batches() -> Iterator[list[Mention]]:
        for mentions in split.iter_batches(batch_size):
            mention_ids.extend(m.mention_id for m in mentions)
            golds.extend(m.gold for m in mentions)
            yield mentions

    with progress_bar(total=len(split), desc=description, unit="mentions", unit_scale=True) as bar:
        cands, scores = search_mentions(pool, held, batches(), top_n, bar=bar)
    return MinedSplit(
        mention_ids=mention_ids,
        cands=cands,
        scores=scores,
        gold_ranks=gold_ranks(cands, np.asarray(golds, dtype=np.int64)),
    )


def _columns(mentions: Sequence[Mention]) -> tuple[list[str], list[str], list[str]]:
    return (
        [m.context_left for m in mentions],
        [m.mention for m in mentions],
        [m.context_right for m in mentions],
    )

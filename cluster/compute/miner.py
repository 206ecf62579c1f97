"""Top-N candidates of mentions under an index version held by the encoder actors (docs/math.md, docs/refresh.md).

The mentions are encoded by the mention tower of the model the index version was built from (in
the encoder actors), their query vectors go straight to the shard holders, and the per-holder
top-N lists are merged here (`hnce.cluster.compute.shard_holders`). Nothing is excluded: the gold, aliases and
known positives stay in the list and the sampler (mining/) filters them with the false-negative
filter, which sees every positive.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import numpy as np
import pyarrow.compute as pc
from tqdm import tqdm

from hnce.cluster.compute.encoder_pool import EncoderPool
from hnce.cluster.compute.shard_holders import HeldIndex
from hnce.cluster.stores.negatives_store import MinedSplit, gold_ranks
from hnce.cluster.stores.tables import Mention
from hnce.cluster.stores.tables_read import EntityCatalogue, MentionSplit
from hnce.progress import progress_bar

#: Mentions encoded and searched per batch, for evaluation, linking and held-out recall alike:
#: enough to keep the encoder actors busy, and a batch's query vectors stay small beside the
#: index (256 mentions x 32 tokens x 384 dims of sum-of-max: 12 MiB in float32).
SEARCH_BATCH = 256


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


def search_catalogue(
    pool: EncoderPool,
    held: HeldIndex,
    data_dir: Path,
    mentions: Sequence[Mention],
    k: int,
    per_domain: bool = False,
    batch_size: int = SEARCH_BATCH,
) -> tuple[np.ndarray, np.ndarray]:
    """Top-k (entity ids int64 [M, k], -1 where fewer; scores float32 [M, k]) of every mention
    in batches of `batch_size`; `per_domain` searches each mention among its own domain's
    entities of the catalogue in `data_dir` only (a Zeshel world)."""
    cands = np.full((len(mentions), k), -1, dtype=np.int64)
    scores = np.full((len(mentions), k), -np.inf, dtype=np.float32)
    groups: list[tuple[np.ndarray, np.ndarray | None]] = [(np.arange(len(mentions)), None)]
    if per_domain:
        groups = list(_domain_groups(data_dir, mentions))
    with progress_bar(total=len(mentions), desc="retrieve", unit="mentions") as bar:
        for rows, allowed in groups:
            batches = (
                [mentions[row] for row in rows[start : start + batch_size]]
                for start in range(0, len(rows), batch_size)
            )
            if allowed is not None and allowed.size == 0:
                bar.update(len(rows))
                continue
            found, found_scores = search_mentions(pool, held, batches, k, allowed, bar)
            cands[rows], scores[rows] = found, found_scores
    return cands, scores


def _domain_groups(
    data_dir: Path, mentions: Sequence[Mention]
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """(mention rows, entity ids) of each domain the mentions come from."""
    entity_domains = EntityCatalogue.open(data_dir).domain_of()
    mention_domains = np.asarray([mention.domain for mention in mentions])
    for domain in sorted(set(mention_domains.tolist())):
        allowed = pc.equal(entity_domains, domain).to_numpy()
        yield np.flatnonzero(mention_domains == domain), np.flatnonzero(allowed)


def mine_split(
    pool: EncoderPool,
    held: HeldIndex,
    split: MentionSplit,
    top_n: int,
    batch_size: int = SEARCH_BATCH,
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

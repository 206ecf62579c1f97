"""BM25 over the catalogue, built once per dataset, and the lexical negatives version 0.

Layout, under the dataset directory (beside ``tokens/``)::

    lexical/bm25-k1=<k1>-b=<b>-<catalogue fingerprint[:16]>/
        bm25s' index files (params, vocabulary, CSC score matrix)
        manifest.json    k1, b, stopwords, catalogue fingerprint, entities

The index depends on no model or tokenizer (``bm25s`` tokenizes words), only on the catalogue
and BM25's k1 and b, so every run and every worker of a dataset shares it. :func:`ensure_bm25`
builds it the first time it is asked for (under a file lock, into a temporary sibling published
by rename, ``hnce.cluster.stores.files.publish_directory``) and loads it afterwards.

:func:`publish_lexical_negatives` mines the top-N BM25 entities of a split's mentions (the
mention string is the query) and publishes them as negatives version 0 of a run (checkpoint
step 0) through :class:`~hnce.cluster.stores.negatives_store.NegativesStore`: DPR's BM25 negatives, which
the trainer polls like any refreshed version until the first dense refresh publishes v1.

Example::

    bm25 = ensure_bm25(data_root)                  # BM25_K1, BM25_B
    ids, scores = bm25.search(["paris"], k=8)      # catalogue ids, -1 where no term is shared
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
from filelock import FileLock

from hnce.cluster.stores.files import atomic_write_json, publish_directory, staging
from hnce.cluster.stores.negatives_store import MinedSplit, NegativesStore, gold_ranks
from hnce.cluster.stores.tables import mention_split_path
from hnce.cluster.stores.tables_read import EntityCatalogue, MentionSplit, catalogue_fingerprint
from hnce.mining.samplers.lexical import BM25_B, BM25_K1, Bm25Index

logger = logging.getLogger(__name__)

LEXICAL_DIR = "lexical"
STOPWORDS = "en"
LEXICAL_VERSION = 0
LEXICAL_CHECKPOINT = 0
_SEARCH_BATCH = 1024


def bm25_directory(data_root: Path, k1: float, b: float, catalogue: str) -> Path:
    """``<data_root>/lexical/bm25-k1=<k1>-b=<b>-<catalogue[:16]>``."""
    return Path(data_root) / LEXICAL_DIR / f"bm25-k1={k1:g}-b={b:g}-{catalogue[:16]}"


def ensure_bm25(data_root: Path, k1: float = BM25_K1, b: float = BM25_B) -> Bm25Index:
    """The BM25 index of the catalogue of ``data_root`` (titles and texts) for ``k1``, ``b``,
    built on first use; concurrent callers serialise on a file lock."""
    catalogue = catalogue_fingerprint(data_root)
    directory = bm25_directory(data_root, k1, b, catalogue)
    directory.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(directory) + ".lock"):
        if not directory.is_dir():
            _build(directory, data_root, k1, b, catalogue)
    return Bm25Index.load(directory, STOPWORDS)


def _build(directory: Path, data_root: Path, k1: float, b: float, catalogue: str) -> None:
    texts = []
    for batch in EntityCatalogue.open(data_root).iter_batches(columns=["title", "text"]):
        titles, bodies = batch.column("title").to_pylist(), batch.column("text").to_pylist()
        texts += [f"{title} {body}" for title, body in zip(titles, bodies, strict=True)]
    logger.info("BM25 (k1=%g, b=%g) over %d entities into %s", k1, b, len(texts), directory)
    with staging(directory) as building:
        Bm25Index(texts, stopwords=STOPWORDS, k1=k1, b=b).save(building)
        manifest = {"k1": k1, "b": b, "stopwords": STOPWORDS, "catalogue": catalogue}
        atomic_write_json(building / "manifest.json", {**manifest, "entities": len(texts)})
        publish_directory(building, directory)


def mine_lexical(bm25: Bm25Index, split: MentionSplit, top_n: int) -> MinedSplit:
    """The top-``top_n`` BM25 entities of every mention of ``split`` (entities sharing no term
    with the mention are left out of its row)."""
    mention_ids: list[str] = []
    golds: list[int] = []
    cands, scores = [], []
    for mentions in split.iter_batches(_SEARCH_BATCH):
        mention_ids += [m.mention_id for m in mentions]
        golds += [m.gold for m in mentions]
        ids, bm25_scores = bm25.search([m.mention for m in mentions], top_n)
        cands.append(ids)
        scores.append(bm25_scores)
    cand_matrix = np.concatenate(cands) if cands else np.zeros((0, top_n), np.int64)
    score_matrix = np.concatenate(scores) if scores else np.zeros((0, top_n), np.float32)
    return MinedSplit(
        mention_ids=mention_ids,
        cands=cand_matrix,
        scores=score_matrix,
        gold_ranks=gold_ranks(cand_matrix, np.asarray(golds, dtype=np.int64)),
    )


def publish_lexical_negatives(
    store: NegativesStore,
    data_root: Path,
    split: str,
    top_n: int,
    k1: float = BM25_K1,
    b: float = BM25_B,
) -> bool:
    """Publish BM25 negatives of ``split`` as version 0 of ``store`` unless a version exists
    (a resumed run keeps what it has); True when it published."""
    if store.current_version() is not None:
        return False
    bm25 = ensure_bm25(data_root, k1, b)
    mined = mine_lexical(bm25, MentionSplit.open(mention_split_path(data_root, split)), top_n)
    store.publish(
        LEXICAL_VERSION,
        {split: mined},
        LEXICAL_CHECKPOINT,
        top_n,
        bm25.num_entities,
        catalogue=catalogue_fingerprint(data_root),
    )
    return True

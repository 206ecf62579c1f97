"""Lexical negatives: the entities BM25 ranks highest for the mention string (BM25 negatives,
as in DPR and Gillick et al. 2019; docs/math.md, eq. (35)).

:class:`Bm25Index` is BM25 over the catalogue's entity texts, built with the maintained ``bm25s``
library; its :meth:`~Bm25Index.search` gives each mention's candidates, a `hnce.search.Searcher`
of mention strings like every searcher of the catalogue (the catalogue index is
built once per dataset and cached on disk by ``hnce.cluster.stores.bm25_store``). The ``lexical``
sampler takes the K highest-scoring admissible candidates of that list (greedy over the BM25
scores): deterministic, so ``log_q`` is None.

Example::

    index = Bm25Index(["paris france capital", "paris texas city", "london"])
    ids, scores = index.search(["paris"], k=2)            # [[0, 1]] or [[1, 0]], BM25 scores
    GreedySampler().sample(SamplingRequest(gold=torch.tensor([0]), positives=[{0}],
                                           num_entities=3, num_negatives=1,
                                           candidate_ids=torch.from_numpy(ids),
                                           candidate_scores=torch.from_numpy(scores)))  # [[1]]
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

import numpy as np

from hnce.mining.samplers.greedy import GreedySampler
from hnce.mining.samplers.spec import SamplerSpec
from hnce.search import PAD_ID, PAD_SCORE, Searcher, no_results
from hnce.settings import PositiveInt, settings

#: BM25's term-frequency saturation k1 and length normalisation b: Robertson and Zaragoza's usual
#: values (and bm25s' b); no measured figure here moved them.
BM25_K1 = 1.5
BM25_B = 0.75


def _bm25s() -> ModuleType:
    """``bm25s``, imported on first use: importing it runs a JAX op when JAX is installed, which
    must happen after the session has pinned JAX to the CPU (``JAX_PLATFORMS``, set by
    ``hnce.cluster.compute.session``), never at the import of a trainer or a sampler."""
    import bm25s

    return bm25s


class Bm25Index(Searcher[Sequence[str]]):
    """BM25 over one text per entity (``entity_texts[i]`` is entity i, e.g. title + text).

    Args:
        entity_texts: one string per entity id 0..M-1.
        stopwords: bm25s stopword list name ("en") or None.
        k1, b: BM25 parameters.
    """

    def __init__(
        self,
        entity_texts: Sequence[str],
        stopwords: str | None = "en",
        k1: float = BM25_K1,
        b: float = BM25_B,
    ) -> None:
        if len(entity_texts) == 0:
            raise ValueError(f"{__file__}: a BM25 index needs at least one entity text")
        self.num_entities = len(entity_texts)
        self.stopwords = stopwords
        bm25s = _bm25s()
        self.retriever = bm25s.BM25(k1=k1, b=b)
        tokens = bm25s.tokenize(list(entity_texts), stopwords=stopwords, show_progress=False)
        self.retriever.index(tokens, show_progress=False)

    def save(self, directory: Path) -> None:
        """Write the index (``bm25s``' own files) into ``directory``."""
        self.retriever.save(str(directory), show_progress=False)

    @classmethod
    def load(cls, directory: Path, stopwords: str | None = "en") -> Bm25Index:
        """The index :meth:`save` wrote (queries are tokenized with the same ``stopwords``)."""
        index = cls.__new__(cls)
        index.retriever = _bm25s().BM25.load(str(directory))
        index.num_entities = int(index.retriever.scores["num_docs"])
        index.stopwords = stopwords
        return index

    def search(self, queries: Sequence[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        """(entity ids int64 [B, k], BM25 scores float32 [B, k]) of the mention strings
        `queries`, best first (`hnce.search.Searcher`); id -1 and score ``-inf`` where an entity
        shares no term with the mention (score 0), and past the catalogue's M entities."""
        ids, scores = no_results(len(queries), k)
        depth = min(k, self.num_entities)
        tokens = _bm25s().tokenize(
            list(queries), stopwords=self.stopwords, return_ids=False, show_progress=False
        )
        found, found_scores = self.retriever.retrieve(
            tokens, k=depth, show_progress=False, n_threads=1
        )
        shared = np.asarray(found_scores) > 0
        ids[:, :depth] = np.where(shared, found, PAD_ID)
        scores[:, :depth] = np.where(shared, found_scores, PAD_SCORE)
        return ids, scores


@settings
class LexicalOptions:
    """``negatives.lexical``: the BM25 sampler's options (BM25 over entity titles and texts,
    :data:`BM25_K1`, :data:`BM25_B`).

    Attributes:
        top_n: entities BM25 returns per mention before positives and entities outside the
            training domains are dropped; at least ``negatives.num_negatives``.
    """

    top_n: PositiveInt = 64


def _depth_covers_k(negatives) -> tuple[str, str] | None:
    if negatives.lexical.top_n < negatives.num_negatives:
        return (
            "negatives.lexical.top_n",
            f"({negatives.lexical.top_n}) must be at least 'negatives.num_negatives' "
            f"({negatives.num_negatives})",
        )
    return None


SPEC = SamplerSpec(
    name="lexical",
    sampler=GreedySampler,
    options=LexicalOptions,
    candidates="lexical",
    build=lambda negatives, num_entities: GreedySampler(),
    check=_depth_covers_k,
)

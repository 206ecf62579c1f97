"""Lexical negatives: BM25 top-k entities for the mention text (Gillick et al. 2019)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import bm25s
import numpy as np
import torch

from hnce.mining.samplers.base import SampledNegatives, SamplingRequest, admissible, take_first


class LexicalSampler:
    """The K highest-BM25 entities for each mention that are not positives (BM25 negatives, as in DPR and Gillick et al. 2019).

    Built once over the entity texts (``entity_texts[i]`` is entity i, e.g. title + description)
    with the maintained ``bm25s`` library; ``sample`` reads ``SamplingRequest.mention_texts``.
    Only entities sharing at least one term with the mention (BM25 score > 0) are eligible; a
    mention with fewer than K such non-positive entities gets id -1 / ``valid=False`` for the
    rest. Deterministic, so ``log_q`` is None.

    Args:
        entity_texts: one string per entity id 0..M-1.
        stopwords: bm25s stopword list name ("en") or None.
        k1, b: BM25 parameters.

    Example::

        sampler = LexicalSampler(["paris france capital", "paris texas city", "london"])
        sampler.sample(SamplingRequest(gold=torch.tensor([0]), positives=[{0}], num_entities=3,
                                       num_negatives=1, mention_texts=["paris"]))  # ids [[1]]
    """

    def __init__(
        self,
        entity_texts: Sequence[str],
        stopwords: str | None = "en",
        k1: float = 1.5,
        b: float = 0.75,
    ) -> None:
        if len(entity_texts) == 0:
            raise ValueError(f"{__file__}: LexicalSampler needs at least one entity text")
        self.num_entities = len(entity_texts)
        self.stopwords = stopwords
        self.retriever = bm25s.BM25(k1=k1, b=b)
        tokens = bm25s.tokenize(list(entity_texts), stopwords=stopwords, show_progress=False)
        self.retriever.index(tokens, show_progress=False)

    def save(self, directory: Path) -> None:
        """Write the BM25 index (``bm25s``' own files) into ``directory``."""
        self.retriever.save(str(directory), show_progress=False)

    @classmethod
    def load(cls, directory: Path, stopwords: str | None = "en") -> LexicalSampler:
        """The sampler of an index :meth:`save` wrote (tokenize queries with the same
        ``stopwords`` it was built with)."""
        sampler = cls.__new__(cls)
        sampler.retriever = bm25s.BM25.load(str(directory))
        sampler.num_entities = int(sampler.retriever.scores["num_docs"])
        sampler.stopwords = stopwords
        return sampler

    def search(self, mention_texts: Sequence[str], k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(entity ids [B, k'], BM25 scores [B, k']) with k' = min(k, M); id -1 where score 0."""
        k = min(k, self.num_entities)
        queries = bm25s.tokenize(
            list(mention_texts), stopwords=self.stopwords, return_ids=False, show_progress=False
        )
        ids, scores = self.retriever.retrieve(queries, k=k, show_progress=False, n_threads=1)
        ids_t = torch.from_numpy(np.asarray(ids, dtype=np.int64))
        scores_t = torch.from_numpy(np.asarray(scores, dtype=np.float32))
        return ids_t.masked_fill(scores_t <= 0, -1), scores_t

    def sample(self, request: SamplingRequest) -> SampledNegatives:
        texts = request.mention_texts
        if texts is None or len(texts) != request.batch_size:
            raise ValueError(
                f"{__file__}: the lexical sampler needs mention_texts, one per mention "
                f"({request.batch_size}), got {None if texts is None else len(texts)}"
            )
        if request.num_entities != self.num_entities:
            raise ValueError(
                f"{__file__}: sampler built over {self.num_entities} entities, request has "
                f"{request.num_entities}"
            )
        widest = max(len(e) for e in request.exclusions())
        ids, _ = self.search(texts, request.num_negatives + widest)
        keep = admissible(request, ids)
        out, valid, _ = take_first(ids, keep, request.num_negatives)
        return SampledNegatives(ids=out, valid=valid)

"""Score functions over the two towers' token encodings: the general form (eq. 9) and its special cases.

Mention tokens X = [x_1..x_L] and entity tokens Y = [y_1..y_L'] come from the towers with [CLS]
first (docs/math.md, Zhang & Stratos (2021) §4). The general form picks a direction (which side gives the
queries), reduces each side to a few vectors (leftmost columns, all columns, or m learned codes
that attend over the side), and sums per-query attention scores:

    s(x, y) = Σ_t q_t · attn(q_t, K),   soft: K softmax(Kᵀ q_t),   hard: k_{argmax_j q_t·k_j}   (eq. 9)

The keys double as values, so per query the soft score is Σ_j softmax_j(l) l_j and the hard score
max_j l_j with l_j = q_t · k_j. Named cases, each with its own direct implementation:

=========  ===============================================  ==========================
dual       ⟨x_1, y_1⟩                                       1 index vector / entity
multi-m    max_{t≤m} ⟨x_1, y_t⟩                             m index vectors / entity
som        Σ_i max_j ⟨x_i, y_j⟩ (ColBERT)                   one index vector per token
poly-m     ⟨y_1, Σ_t softmax_t(y_1·z_t) z_t⟩, z = codes(X)  exact: 1 stored vector / entity
genpoly-m  Σ_{s≤m'} ⟨y_s, Σ_t softmax_t(y_s·z_t) z_t⟩       exact: m' stored vectors / entity
=========  ===============================================  ==========================

Mining is by index for dual, multi-m and som (``indexable``: an inner-product search over fixed
entity vectors finds the top-k) and exact for poly, genpoly and the general form, whose mention
query depends on the entity: their index shards store each entity's reduced vectors
(``reduce_entities``) and the shard holders score every stored entity against the mention's
reduced vectors (``reduce_mentions``) with the scorer itself (:func:`exact_index_scores`,
``hnce.cluster.stores.exact_search``). Exact poly-16 scoring on one CPU thread runs at about 8e5
mention-entity pairs/s (d = 384, ``benchmarks/exact_mining.py``): 10,000 mentions over 100,000
entities take ~21 min per holder, over 1M ~3.5 h, so exact mining is for small catalogues.

Padding is masked: padded keys never win an attention, padded queries add nothing, and a
"leftmost m" reduction of a sequence shorter than m keeps only its real tokens.
"""

from __future__ import annotations

import abc
import math
from dataclasses import asdict, dataclass, fields, replace
from typing import Any, ClassVar, Literal

import torch
from torch import Tensor, nn

from hnce.settings import Flag, PositiveInt, settings

# Upper bound on elements of one block of pairwise logits (B x E x queries x keys) in `score`.
_BLOCK_ELEMENTS = 1 << 24
# Scorers whose entity side is its first (pooled) vector alone.
FIRST_ENTITY_VECTOR_ONLY = ("dual", "poly")


@settings
class ScorerConfig:
    """Which score function: the ``model.scorer`` section of a recipe.

    Attributes:
        name: dual | multi | som | poly | genpoly, a named case of eq. 9 that implies the
            general form's choices (direction, reductions, attention: :meth:`general_equivalent`).
        m: multi: entity vectors; poly/genpoly: number of codes.
        m_prime: genpoly: leftmost entity vectors used as queries (unset: m).
        skip_punctuation: leave the entity tokens that are punctuation out of the entity vectors
            the score reads (ColBERT's skiplist, Khattab & Zaharia 2020 §3.2: the tower still
            reads them, their output vectors are masked), so sum-of-max stores and searches
            fewer token vectors (:meth:`BiEncoder.encode_entities`). Only for som, multi and
            genpoly, which read entity tokens past the pooled first one.
    """

    name: Literal["dual", "multi", "som", "poly", "genpoly"] = "dual"
    m: PositiveInt = 1
    m_prime: PositiveInt | None = None
    skip_punctuation: Flag = False

    def __post_init__(self) -> None:
        if self.skip_punctuation and self.name in FIRST_ENTITY_VECTOR_ONLY:
            raise ValueError(
                f"skip_punctuation: {self.name} reads only the entity's pooled first vector, "
                "which is never punctuation; it applies to som, multi and genpoly"
            )

    @property
    def indexable(self) -> bool:
        """Whether entities are a fixed set of vectors a FAISS index can hold: asked of the
        scorer class itself (docs/math.md), never of a second list."""
        return _SCORER_CLASSES[self.name].indexable

    @property
    def mining(self) -> Literal["index", "exact"]:
        """How hard negatives are mined for this scorer (module docstring): ``index`` (FAISS
        search over index vectors) or ``exact`` (every stored entity scored by the scorer)."""
        return "index" if self.indexable else "exact"

    @classmethod
    def parse(cls, spec: str) -> ScorerConfig:
        """``"dual"``, ``"multi-8"``, ``"som"``, ``"poly-16"``, ``"genpoly-16"`` or ``"genpoly-16-4"`` (m, m')."""
        name, *numbers = spec.strip().split("-")
        try:
            values = [int(n) for n in numbers]
        except ValueError as error:
            raise ValueError(f"bad scorer spec {spec!r}: numbers after the name") from error
        if len(values) > 2:
            raise ValueError(f"bad scorer spec {spec!r}: at most two numbers (m, m')")
        return cls(
            name=name, m=values[0] if values else 1, m_prime=values[1] if len(values) > 1 else None
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> ScorerConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown ScorerConfig fields {unknown}; known: {sorted(known)}")
        return cls(**values)

    def general_equivalent(self) -> GeneralForm:
        """The general form that computes the same function as this named case (eq. 9, §4.2)."""
        m_prime = self.m_prime if self.m_prime is not None else self.m
        table = {
            "dual": GeneralForm(1, 1, "mention", "leftmost", "leftmost", "hard"),
            "multi": GeneralForm(1, self.m, "mention", "leftmost", "leftmost", "hard"),
            "som": GeneralForm(1, 1, "mention", "all", "all", "hard"),
            "poly": GeneralForm(1, self.m, "entity", "leftmost", "codes", "soft"),
            "genpoly": GeneralForm(m_prime, self.m, "entity", "leftmost", "codes", "soft"),
        }
        return replace(table[self.name], skip_punctuation=self.skip_punctuation)


@dataclass(frozen=True)
class GeneralForm:
    """The general form's choices (eq. 9): m queries, m' keys (unset: m), the query side, each
    side's reduction, the attention. Built in code: a recipe names a case, whose form
    (:meth:`ScorerConfig.general_equivalent`) is the reference its scorer is tested against."""

    m: int = 1
    m_prime: int | None = None
    query_side: Literal["mention", "entity"] = "mention"
    query_reduction: Literal["leftmost", "all", "codes"] = "leftmost"
    key_reduction: Literal["leftmost", "all", "codes"] = "leftmost"
    attention: Literal["soft", "hard"] = "hard"
    skip_punctuation: bool = False
    mining: ClassVar[str] = "exact"  # its mention query may depend on the entity


def _leftmost(hidden: Tensor, mask: Tensor, count: int) -> tuple[Tensor, Tensor]:
    """The ``count`` leftmost columns and their mask; sequences shorter than count are padded, masked."""
    vectors, kept = hidden[:, :count], mask[:, :count].bool()
    missing = count - vectors.shape[1]
    if missing > 0:
        vectors = torch.cat(
            [vectors, vectors.new_zeros(vectors.shape[0], missing, vectors.shape[2])], 1
        )
        kept = torch.cat([kept, kept.new_zeros(kept.shape[0], missing)], 1)
    return vectors, kept


def _code_attention(hidden: Tensor, mask: Tensor, codes: Tensor) -> tuple[Tensor, Tensor]:
    """Poly-encoder reduction: code c_t attends over the real tokens, z_t = Σ_i softmax_i(c_t·h_i) h_i."""
    logits = torch.einsum("md,nld->nml", codes.to(hidden.dtype), hidden)
    logits = logits.masked_fill(~mask.bool()[:, None, :], float("-inf"))
    vectors = torch.einsum("nml,nld->nmd", logits.softmax(-1), hidden)
    return vectors, torch.ones(vectors.shape[:2], dtype=torch.bool, device=hidden.device)


def _pair_logits(mention_vectors: Tensor, entity_vectors: Tensor) -> Tensor:
    """⟨x_a, y_j⟩ -> [B, E, a, j]; entity_vectors [E, j, d] (all pairs) or [B, E, j, d] (candidates)."""
    if entity_vectors.dim() == 3:
        return torch.einsum("bad,ejd->beaj", mention_vectors, entity_vectors)
    return torch.einsum("bad,bejd->beaj", mention_vectors, entity_vectors)


def _pair_masks(mention_mask: Tensor, entity_mask: Tensor) -> tuple[Tensor, Tensor]:
    """Masks broadcastable to [B, E, a, j]: mention [B, 1, a, 1], entity [·, E, 1, j]."""
    entity = entity_mask.bool()
    entity = entity[None, :, None, :] if entity.dim() == 2 else entity[:, :, None, :]
    return mention_mask.bool()[:, None, :, None], entity


def attention_scores(
    logits: Tensor, query_mask: Tensor, key_mask: Tensor, attention: str
) -> Tensor:
    """Σ_t over real queries of q_t·attn(q_t, K) from logits [..., queries, keys] (eq. 9).

    soft: Σ_j softmax_j(l_tj) l_tj (keys double as values); hard: max_j l_tj. Masked keys get no
    weight, masked queries contribute 0. Masks broadcast against the logits.
    """
    key_mask = key_mask.expand_as(logits)
    masked = logits.masked_fill(~key_mask, float("-inf"))
    if attention == "hard":
        per_query = masked.amax(-1)
    else:
        per_query = (masked.softmax(-1) * logits.masked_fill(~key_mask, 0.0)).sum(-1)
    return per_query.masked_fill(~query_mask.expand(per_query.shape), 0.0).sum(-1)


class Scorer(nn.Module, metaclass=abc.ABCMeta):
    """A score function s(x, y) over token encodings, split into a per-side reduction and the interaction.

    ``reduce_mentions`` / ``reduce_entities`` depend on one side only, so entity vectors can be
    computed once and scored against many mentions; ``interact`` applies the formula.
    Subclasses set ``indexable`` and ``vectors_per_entity``, the vectors an index shard stores per
    entity (None: as many as the entity has real tokens or kept reduced vectors).
    """

    name = "scorer"
    config: ScorerConfig | GeneralForm
    indexable = False
    vectors_per_entity: int | None = 1

    @abc.abstractmethod
    def reduce_mentions(self, hidden: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        """Mention tokens [B, L, d], mask [B, L] -> the vectors the formula reads [B, a, d], mask [B, a]."""

    @abc.abstractmethod
    def reduce_entities(self, hidden: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        """Entity tokens [E, L', d], mask [E, L'] -> vectors [E, b, d], mask [E, b]."""

    @abc.abstractmethod
    def interact(
        self,
        mention_vectors: Tensor,
        mention_mask: Tensor,
        entity_vectors: Tensor,
        entity_mask: Tensor,
    ) -> Tensor:
        """Scores [B, E] from reduced vectors; entity [E, b, d] (all pairs) or [B, E, b, d] (per mention)."""

    def score(
        self,
        mention_hidden: Tensor,
        mention_mask: Tensor,
        entity_hidden: Tensor,
        entity_mask: Tensor,
    ) -> Tensor:
        """All pairs: every mention [B, L, d] against every entity [E, L', d] -> [B, E]."""
        mention_vectors, mention_kept = self.reduce_mentions(mention_hidden, mention_mask)
        entity_vectors, entity_kept = self.reduce_entities(entity_hidden, entity_mask)
        return self.score_reduced(mention_vectors, mention_kept, entity_vectors, entity_kept)

    def score_reduced(
        self,
        mention_vectors: Tensor,
        mention_kept: Tensor,
        entity_vectors: Tensor,
        entity_kept: Tensor,
    ) -> Tensor:
        """All pairs from already reduced sides (``reduce_mentions`` [B, a, d], ``reduce_entities``
        [E, b, d]) -> [B, E], in blocks of entities that bound the pairwise logits' memory."""
        per_entity = mention_vectors.shape[0] * mention_vectors.shape[1] * entity_vectors.shape[1]
        step = max(1, _BLOCK_ELEMENTS // max(1, per_entity))
        blocks = [
            self.interact(
                mention_vectors,
                mention_kept,
                entity_vectors[i : i + step],
                entity_kept[i : i + step],
            )
            for i in range(0, entity_vectors.shape[0], step)
        ]
        if not blocks:
            return mention_vectors.new_zeros(mention_vectors.shape[0], 0)
        return torch.cat(blocks, dim=1)

    def score_candidates(
        self, mention_hidden: Tensor, mention_mask: Tensor, cand_hidden: Tensor, cand_mask: Tensor
    ) -> Tensor:
        """Each mention [B, L, d] against its own K candidates [B, K, L', d] (mask [B, K, L']) -> [B, K]."""
        batch, candidates, length, dim = cand_hidden.shape
        mention_vectors, mention_kept = self.reduce_mentions(mention_hidden, mention_mask)
        entity_vectors, entity_kept = self.reduce_entities(
            cand_hidden.reshape(batch * candidates, length, dim),
            cand_mask.reshape(batch * candidates, length),
        )
        return self.interact(
            mention_vectors,
            mention_kept,
            entity_vectors.reshape(batch, candidates, *entity_vectors.shape[1:]),
            entity_kept.reshape(batch, candidates, -1),
        )

    def entity_index_vectors(
        self, entity_hidden: Tensor, entity_mask: Tensor
    ) -> tuple[Tensor, Tensor]:
        """Vectors an index shard stores, float32 [V, d], and each one's row in the batch [V].

        This default: the kept vectors of ``reduce_entities``, in order: for som one vector per
        real token (its inner-product index); for the exact scorers what
        :func:`exact_index_scores` groups back per entity. The other indexable scorers store
        the vectors of their inner-product index.
        """
        vectors, kept = self.reduce_entities(entity_hidden, entity_mask)
        rows = torch.arange(vectors.shape[0], device=vectors.device)
        return vectors[kept].float(), rows[:, None].expand_as(kept)[kept]

    def mention_query_vectors(self, mention_hidden: Tensor, mention_mask: Tensor) -> Tensor:
        """Query vectors [B, Q, d] searched against ``entity_index_vectors``.

        This default: ``reduce_mentions`` with masked vectors zeroed: for som every token (a
        padded one adds max_j 0 = 0 to the sum, ``index_scores``); for the exact scorers a zero
        row reads as masked (:func:`exact_index_scores`).
        """
        vectors, kept = self.reduce_mentions(mention_hidden, mention_mask)
        return vectors * kept[..., None].to(vectors.dtype)


class DualScorer(Scorer):
    """Dual encoder s = ⟨x_1, y_1⟩ (Zhang & Stratos (2021) §4.2); one index vector per entity."""

    name = "dual"
    indexable = True
    vectors_per_entity = 1

    def reduce_mentions(self, hidden: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        return hidden[:, :1], mask[:, :1].bool()

    def reduce_entities(self, hidden: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        return hidden[:, :1], mask[:, :1].bool()

    def interact(
        self,
        mention_vectors: Tensor,
        mention_mask: Tensor,
        entity_vectors: Tensor,
        entity_mask: Tensor,
    ) -> Tensor:
        x = mention_vectors[:, 0]
        if entity_vectors.dim() == 3:
            return x @ entity_vectors[:, 0].T
        return torch.einsum("bd,bed->be", x, entity_vectors[:, :, 0])

    def entity_index_vectors(
        self, entity_hidden: Tensor, entity_mask: Tensor
    ) -> tuple[Tensor, Tensor]:
        rows = torch.arange(entity_hidden.shape[0], device=entity_hidden.device)
        return entity_hidden[:, 0].float(), rows

    def mention_query_vectors(self, mention_hidden: Tensor, mention_mask: Tensor) -> Tensor:
        return mention_hidden[:, :1]


class MultiVectorScorer(Scorer):
    """Multi-vector encoder s = max_{t≤m} ⟨x_1, y_t⟩ (Luan et al.; Zhang & Stratos (2021) §4.2); m index vectors per entity."""

    name = "multi"
    indexable = True

    def __init__(self, m: int) -> None:
        super().__init__()
        self.m = m
        self.vectors_per_entity = m

    def reduce_mentions(self, hidden: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        return hidden[:, :1], mask[:, :1].bool()

    def reduce_entities(self, hidden: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        return _leftmost(hidden, mask, self.m)

    def interact(
        self,
        mention_vectors: Tensor,
        mention_mask: Tensor,
        entity_vectors: Tensor,
        entity_mask: Tensor,
    ) -> Tensor:
        x = mention_vectors[:, 0]
        if entity_vectors.dim() == 3:
            logits = torch.einsum("bd,etd->bet", x, entity_vectors)
            kept = entity_mask.bool()[None]
        else:
            logits = torch.einsum("bd,betd->bet", x, entity_vectors)
            kept = entity_mask.bool()
        return logits.masked_fill(~kept, float("-inf")).amax(-1)

    def entity_index_vectors(
        self, entity_hidden: Tensor, entity_mask: Tensor
    ) -> tuple[Tensor, Tensor]:
        """m vectors per entity; a padded position repeats y_1, which leaves the max unchanged."""
        vectors, kept = _leftmost(entity_hidden, entity_mask, self.m)
        vectors = torch.where(kept[..., None], vectors, vectors[:, :1])
        rows = torch.arange(entity_hidden.shape[0], device=entity_hidden.device)
        return vectors.reshape(-1, vectors.shape[-1]).float(), rows.repeat_interleave(self.m)

    def mention_query_vectors(self, mention_hidden: Tensor, mention_mask: Tensor) -> Tensor:
        return mention_hidden[:, :1]


class SumOfMaxScorer(Scorer):
    """Sum-of-max (ColBERT) s = Σ_i max_j ⟨x_i, y_j⟩ over real tokens (Zhang & Stratos (2021) §4.2); token-level index."""

    name = "som"
    indexable = True
    vectors_per_entity = None

    def reduce_mentions(self, hidden: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        return hidden, mask.bool()

    def reduce_entities(self, hidden: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        return hidden, mask.bool()

    def interact(
        self,
        mention_vectors: Tensor,
        mention_mask: Tensor,
        entity_vectors: Tensor,
        entity_mask: Tensor,
    ) -> Tensor:
        logits = _pair_logits(mention_vectors, entity_vectors)
        mention_kept, entity_kept = _pair_masks(mention_mask, entity_mask)
        best = logits.masked_fill(~entity_kept, float("-inf")).amax(-1)
        return best.masked_fill(~mention_kept[..., 0], 0.0).sum(-1)


class PolyScorer(Scorer):
    """Poly-encoder (Humeau et al.; Zhang & Stratos (2021) §4.2) and its generalisation genpoly-m.

    m learned codes attend over the mention tokens: z_t = Σ_i softmax_i(c_t·x_i) x_i. Each of the
    m' leftmost entity vectors y_s (m' = 1: poly-m) attends over z, and the scores are summed:
    s = Σ_{s≤m'} ⟨y_s, Σ_t softmax_t(y_s·z_t) z_t⟩.
    """

    name = "poly"

    def __init__(self, m: int, hidden_size: int, entity_queries: int = 1) -> None:
        super().__init__()
        self.m = m
        self.entity_queries = entity_queries
        self.name = "poly" if entity_queries == 1 else "genpoly"
        # [CLS] is always real; m' > 1 leftmost vectors of a shorter entity keep only its tokens.
        self.vectors_per_entity = 1 if entity_queries == 1 else None
        self.codes = nn.Parameter(torch.randn(m, hidden_size) * hidden_size**-0.5)

    def reduce_mentions(self, hidden: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        return _code_attention(hidden, mask, self.codes)

    def reduce_entities(self, hidden: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        return _leftmost(hidden, mask, self.entity_queries)

    def interact(
        self,
        mention_vectors: Tensor,
        mention_mask: Tensor,
        entity_vectors: Tensor,
        entity_mask: Tensor,
    ) -> Tensor:
        logits = _pair_logits(mention_vectors, entity_vectors)  # [B, E, codes, entity queries]
        weights = logits.softmax(dim=2)  # each entity query attends over the codes
        per_query = (weights * logits).sum(2)
        _, entity_kept = _pair_masks(mention_mask, entity_mask)
        return per_query.masked_fill(~entity_kept[:, :, 0], 0.0).sum(-1)


class GeneralScorer(Scorer):
    """The general form (eq. 9) with every choice open: direction, reductions, soft or hard attention.

    Learned codes, where a reduction uses them, are ``query_codes`` [m, d] / ``key_codes`` [m', d].
    Slower than the named classes, and the reference they are tested against.
    """

    name = "general"

    def __init__(self, config: GeneralForm, hidden_size: int) -> None:
        super().__init__()
        self.config: GeneralForm = config
        self.query_count = config.m
        self.key_count = config.m_prime if config.m_prime is not None else config.m
        entity_side = (
            config.key_reduction if config.query_side == "mention" else config.query_reduction
        )
        count = self.key_count if config.query_side == "mention" else self.query_count
        fixed = entity_side == "codes" or (entity_side == "leftmost" and count == 1)
        self.vectors_per_entity = count if fixed else None
        scale = hidden_size**-0.5
        self.query_codes = (
            nn.Parameter(torch.randn(self.query_count, hidden_size) * scale)
            if config.query_reduction == "codes"
            else None
        )
        self.key_codes = (
            nn.Parameter(torch.randn(self.key_count, hidden_size) * scale)
            if config.key_reduction == "codes"
            else None
        )

    def _reduce(
        self, hidden: Tensor, mask: Tensor, how: str, count: int, codes: Tensor | None
    ) -> tuple[Tensor, Tensor]:
        if how == "all":
            return hidden, mask.bool()
        if how == "leftmost":
            return _leftmost(hidden, mask, count)
        assert codes is not None
        return _code_attention(hidden, mask, codes)

    def _query_side_is_mention(self) -> bool:
        return self.config.query_side == "mention"

    def _side(self, mention: bool) -> tuple[str, int, Tensor | None]:
        """The reduction of the mention side (``mention``) or the entity side: the queries'
        on the query side, the keys' on the other."""
        if mention == self._query_side_is_mention():
            return self.config.query_reduction, self.query_count, self.query_codes
        return self.config.key_reduction, self.key_count, self.key_codes

    def reduce_mentions(self, hidden: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        return self._reduce(hidden, mask, *self._side(mention=True))

    def reduce_entities(self, hidden: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        return self._reduce(hidden, mask, *self._side(mention=False))

    def interact(
        self,
        mention_vectors: Tensor,
        mention_mask: Tensor,
        entity_vectors: Tensor,
        entity_mask: Tensor,
    ) -> Tensor:
        logits = _pair_logits(mention_vectors, entity_vectors)  # [B, E, mention a, entity j]
        mention_kept, entity_kept = _pair_masks(mention_mask, entity_mask)
        if self._query_side_is_mention():
            return attention_scores(
                logits, mention_kept[..., 0], entity_kept, self.config.attention
            )
        return attention_scores(
            logits.transpose(-1, -2),
            entity_kept[:, :, 0, :],
            mention_kept.transpose(-1, -2),
            self.config.attention,
        )


def build_scorer(config: ScorerConfig | GeneralForm | str, hidden_size: int) -> Scorer:
    """The scorer a config (or a spec such as ``"multi-8"``) names, or the general form's."""
    if isinstance(config, str):
        config = ScorerConfig.parse(config)
    scorer: Scorer
    if isinstance(config, GeneralForm):
        scorer = GeneralScorer(config, hidden_size)
    elif config.name == "dual":
        scorer = DualScorer()
    elif config.name == "multi":
        scorer = MultiVectorScorer(config.m)
    elif config.name == "som":
        scorer = SumOfMaxScorer()
    elif config.name == "poly":
        scorer = PolyScorer(config.m, hidden_size, entity_queries=1)
    elif config.name == "genpoly":
        m_prime = config.m_prime if config.m_prime is not None else config.m
        scorer = PolyScorer(config.m, hidden_size, entity_queries=m_prime)
    scorer.config = config
    return scorer


_SCORER_CLASSES: dict[str, type[Scorer]] = {
    "dual": DualScorer,
    "multi": MultiVectorScorer,
    "som": SumOfMaxScorer,
    "poly": PolyScorer,
    "genpoly": PolyScorer,
}


def index_scores(
    query_vectors: Tensor, index_vectors: Tensor, owners: Tensor, num_entities: int
) -> Tensor:
    """Exhaustive search over index vectors, aggregated per entity -> [B, num_entities].

    For each query vector, an entity's score is the max inner product over its vectors; the scores
    of a mention's query vectors are summed. With a scorer's ``mention_query_vectors`` and
    ``entity_index_vectors`` this equals ``score`` for dual, multi-m and som (an index returns the
    top hits per query vector and the same aggregation reranks them exactly).
    """
    similarities = torch.einsum("bqd,vd->bqv", query_vectors.float(), index_vectors.float())
    best = similarities.new_full((*similarities.shape[:2], num_entities), -math.inf)
    index = owners.to(similarities.device)[None, None, :].expand_as(similarities)
    best = best.scatter_reduce(2, index, similarities, reduce="amax", include_self=True)
    return best.sum(1)


def exact_index_scores(
    scorer: Scorer, query_vectors: Tensor, index_vectors: Tensor, owners: Tensor
) -> tuple[Tensor, Tensor]:
    """Exact scores of an exact scorer's stored entities -> (entity ids [E], scores [B, E]).

    ``query_vectors`` [B, a, d] come from ``mention_query_vectors`` (zero rows are masked),
    ``index_vectors`` [V, d] and ``owners`` [V] (sorted) from ``entity_index_vectors``: each
    entity's vectors are grouped back into [E, b, d] with a mask and scored by
    ``score_reduced``, which equals ``score`` on the token encodings.
    """
    entities, counts = torch.unique_consecutive(owners, return_counts=True)
    width = int(counts.max()) if len(counts) else 0
    starts = torch.cumsum(counts, 0) - counts
    positions = torch.arange(len(owners), device=owners.device) - starts.repeat_interleave(counts)
    slots = torch.repeat_interleave(torch.arange(len(entities), device=owners.device), counts)
    vectors = index_vectors.new_zeros(len(entities), width, index_vectors.shape[-1])
    vectors[slots, positions] = index_vectors
    kept = torch.zeros(len(entities), width, dtype=torch.bool, device=owners.device)
    kept[slots, positions] = True
    query_kept = query_vectors.ne(0).any(-1)
    return entities, scorer.score_reduced(query_vectors, query_kept, vectors, kept)

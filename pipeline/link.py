"""Entity linking with a trained model: mentions marked in text in, top-k catalogue entities out.

A text marks each mention with ``[START_ENT]`` … ``[END_ENT]`` (KILT's markers, as in AIDA's
``input`` field); every marked span becomes one :class:`~hnce.cluster.stores.tables.Mention` whose
left and right contexts are the rest of the text, the other spans' markers dropped and their
words kept (:func:`marked_mentions`), as the converters give a mention its context.

Mentions are searched the way ``hnce eval`` searches them
(:func:`hnce.cluster.compute.retrieval.open_index`): encoded by the model's mention tower in the
encoder actors and searched against the whole catalogue in an index version of the *same*
model. That is the run's published version when the refresh indexed that checkpoint (nothing is
encoded), else one built once into ``<run>/eval-index/`` and found again by every later call.
A trained joint reranker may reorder the retriever's top candidates
(:func:`hnce.pipeline.rerank.rerank`).

A linker starts (or joins) Ray, its encoder pool and the index version's shard holders on its
first search and keeps them for every later call, until :meth:`EntityLinker.close` (or the end
of its ``with`` block): a warm call only encodes and searches its mentions. One linker serves
many threads at once (:class:`EntityLinker`, "Threads"); processes each open their own, and only
read the index version they share (:mod:`hnce.cluster.compute.retrieval`).

Example::

    from hnce import EntityLinker

    linker = EntityLinker.from_run("runs/wordnet")  # the run's newest checkpoint
    text = "He sat on the [START_ENT] bank [END_ENT] of the river."
    for candidate in linker.link([text], k=3)[0].candidates:
        print(candidate.rank, candidate.key, candidate.title, candidate.text[:60])
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import ray
import torch

from hnce.cluster.compute.entity_encoding import encode_entities as encode_entity_vectors
from hnce.cluster.compute.entity_encoding import encode_mention_queries
from hnce.cluster.compute.index_build import IndexedModel, ensure_token_store
from hnce.cluster.compute.retrieval import OpenIndex, Retrieved, open_index
from hnce.cluster.compute.session import init_ray
from hnce.cluster.stores.checkpoints import resolve_checkpoint
from hnce.cluster.stores.files import ClosedOnExit
from hnce.cluster.stores.tables import DatasetError, Mention
from hnce.cluster.stores.tables_read import EntityCatalogue
from hnce.cluster.stores.tokens import TokenStore
from hnce.encoders.biencoder import BiEncoder, load_biencoder
from hnce.encoders.reranker import RERANKER_FILE, JointReranker, load_reranker
from hnce.errors import InputError
from hnce.pipeline.config import Config, load_config
from hnce.pipeline.data.blink import truncate_text
from hnce.pipeline.data.kilt import END_ENT, START_ENT
from hnce.pipeline.devices import local_device
from hnce.pipeline.evaluate import resolve_model
from hnce.pipeline.metrics import column_widths, text_table
from hnce.pipeline.preflight import check_dataset
from hnce.pipeline.rerank import SplitCandidates, rerank, scoring_batch_size
from hnce.pipeline.run import RERANK_DIR, RUN_RECIPE, refresh_plan

logger = logging.getLogger(__name__)

_MARKER = re.compile(f"({re.escape(START_ENT)}|{re.escape(END_ENT)})")
_CONTEXT_CHARS = 40  # of each side of a mention in the table
_MIN_TEXT_CHARS = 20  # of an entity's text in the table, however narrow the width


def marked_mentions(text: str, source: str) -> list[Mention]:
    """Every ``[START_ENT] … [END_ENT]`` span of ``text`` as a mention, in order, with ids
    ``<source>#<n>`` and no gold (-1). A mention's context is the text around it with the other
    spans' markers dropped (their words kept), stripped at both ends.

    Raises :class:`InputError` naming ``source`` (e.g. ``argument 2``, ``stdin line 3``) for a
    text without a marked span, a marker without its partner, nested spans or an empty mention.
    """
    parts: list[str] = []  # the text without markers; a span is one part
    spans: list[int] = []
    inside = False
    for piece in _MARKER.split(text):  # text, marker, text, marker, ..., text
        if piece in (START_ENT, END_ENT):
            if (piece == START_ENT) == inside:
                raise InputError(f"{source}: {_misplaced(piece)}")
            if inside and not parts[-1]:  # the span this marker closes
                raise InputError(f"{source}: an empty mention ({START_ENT} {END_ENT})")
            inside = not inside
        elif inside:
            spans.append(len(parts))
            parts.append(piece.strip())
        else:
            parts.append(piece)
    if inside:
        raise InputError(f"{source}: {START_ENT} without its {END_ENT}")
    if not spans:
        raise InputError(f"{source}: no mention marked (mark each with {START_ENT} … {END_ENT})")
    return [
        Mention(
            f"{source}#{number}",
            "".join(parts[:span]).strip(),
            parts[span],
            "".join(parts[span + 1 :]).strip(),
            -1,  # gold unknown
        )
        for number, span in enumerate(spans, start=1)
    ]


def _misplaced(marker: str) -> str:
    if marker == START_ENT:
        return f"{START_ENT} inside a marked mention (nested, or its {END_ENT} is missing)"
    return f"{END_ENT} without a {START_ENT} before it"


def texts_mentions(texts: Sequence[str], sources: Sequence[str]) -> list[Mention]:
    """The marked mentions of every text, in order (:func:`marked_mentions`); ``sources`` name
    the texts in errors and in the mention ids."""
    return [
        mention
        for text, source in zip(texts, sources, strict=True)
        for mention in marked_mentions(text, source)
    ]


class Candidate(NamedTuple):
    """One entity found for a mention: its rank (1 = best), catalogue key and title, the
    retriever's score s(x, y) (also after a reranker reordered the candidates), the entity's
    whole text in the catalogue (what tells apart entities of one title, e.g. WordNet's senses
    of "bank"), and the reranker's score when a reranker ordered the candidates."""

    rank: int
    key: str
    title: str
    score: float
    text: str
    rerank_score: float | None = None


@dataclass(frozen=True)
class LinkedMention:
    """A mention and its candidates, best first."""

    mention: Mention
    candidates: list[Candidate]

    def to_json(self) -> dict[str, Any]:
        """One JSON object (``hnce link --json`` writes one line of it per mention); each
        candidate's fields as :class:`Candidate` names them, the entity's whole text included and
        ``rerank_score`` null without a reranker."""
        return {
            "id": self.mention.mention_id,
            "context_left": self.mention.context_left,
            "mention": self.mention.mention,
            "context_right": self.mention.context_right,
            "candidates": [candidate._asdict() for candidate in self.candidates],
        }


def format_linked(linked: Sequence[LinkedMention], width: int) -> str:
    """A readable table per mention: its id and context, then rank, key, title, the retriever's
    score (and the reranker's, when it ordered them) and the start of the entity's text, cut so
    that a row fits ``width`` characters where the other columns leave room."""
    blocks = []
    for item in linked:
        mention = item.mention
        left = mention.context_left[-_CONTEXT_CHARS:]
        right = mention.context_right[:_CONTEXT_CHARS]
        heading = f"{mention.mention_id}: {left} [{mention.mention}] {right}".strip()
        reranked = any(c.rerank_score is not None for c in item.candidates)
        headers = ["rank", "key", "title", "score", *(["rerank"] if reranked else [])]
        rows = [
            [str(c.rank), c.key, c.title, f"{c.score:.4f}"]
            + ([f"{c.rerank_score:.4f}"] if reranked else [])
            for c in item.candidates
        ]
        room = width - sum(column_widths(headers, rows)) - len(" | ") * len(headers)
        for row, candidate in zip(rows, item.candidates, strict=True):
            row.append(_clipped(candidate.text, max(room, _MIN_TEXT_CHARS)))
        blocks.append(heading + "\n" + text_table([*headers, "text"], rows))
    return "\n\n".join(blocks)


def _clipped(text: str, chars: int) -> str:
    """``text`` on one line in at most ``chars`` characters, cut at a word and ended by "…"
    where it was cut."""
    text = " ".join(text.split())
    return text if len(text) <= chars else truncate_text(text, chars - 1) + "…"


def check_catalogue(config: Config) -> None:
    """``data.root`` is a published dataset (:func:`check_dataset`) whose catalogue holds at
    least one entity (a dataset without entities has no ``entities/`` at all)."""
    with contextlib.suppress(DatasetError):  # then check_dataset says what is wrong
        if len(EntityCatalogue.open(Path(config.data.root))) == 0:
            raise config.error(
                "data.root", f"is {config.data.root!r}: its catalogue holds no entity"
            )
    check_dataset(config, [])


def load_linking_reranker(path: Path, device: torch.device) -> JointReranker:
    """A trained joint reranker on ``device`` from a reranker export (``reranker.json``), or the
    newest complete checkpoint (verified) of a reranker run: ``<run>/rerank`` or the run holding
    it."""
    path = Path(path)
    if (path / RERANKER_FILE).is_file():
        return load_reranker(path, device)
    if (path / RERANK_DIR).is_dir():
        path = path / RERANK_DIR
    _, export = resolve_checkpoint(path, "newest")
    return load_reranker(export, device)


class EntityLinker(ClosedOnExit):
    """Links mentions marked in text to catalogue entities with a trained bi-encoder (and,
    optionally, a trained joint reranker), searching the whole catalogue through the cluster.

    Build one with :meth:`from_run` (a run's checkpoint) or :meth:`from_export` (a bi-encoder
    export directory and a dataset); :meth:`link` marked texts, or :meth:`search` mentions;
    :meth:`encode_mentions` and :meth:`encode_entities` give the vectors the index is built from
    and searched with, computed in this process. Used as a context manager, it stops on exit
    the Ray instance it started.

    Threads: any number of threads may call :meth:`link`, :meth:`link_mentions` and
    :meth:`search` on one linker at once, and each gets exactly the answer it would get alone.
    The first call to need Ray, the encoder pool and the index opens them, once, while calls
    arriving meanwhile wait for it. Calls then encode and search their own mentions through
    the encoder actors concurrently; an actor serves one call at a time, so its model,
    tokenizer and index shards (the per-process read cache of plaid shards included) are never
    used by two calls at once. What a call does in this process runs one call at a time under
    the linker's lock: reading its candidates' texts (the catalogue's Parquet readers and
    row-group cache are not thread-safe: concurrent reads crashed, hung or failed), the reranker
    and :meth:`encode_mentions` / :meth:`encode_entities` (a Hugging Face tokenizer is not safe
    to share; torch already uses every core for one call). Memory
    does not grow with the threads beyond their mentions in flight. :meth:`close` once every
    call has returned: a call still running fails when the pool stops under it.

    Args:
        config: the recipe: ``data.root`` is the catalogue; ``run.dir`` where an index version
            of the model is found (``index/``, ``eval-index/``) or built (``eval-index/``); the
            ``refresh``, ``index`` and ``cluster`` sections the encoder pool, index and Ray.
        model: the bi-encoder.
        name: how logs name the model.
        reranker: reorders the retriever's top ``rerank.num_candidates`` when given.

    Example::

        linker = EntityLinker.from_run("runs/wordnet", checkpoint="newest")
        linked = linker.link(["He sat on the [START_ENT] bank [END_ENT] of the river."], k=5)
        linked[0].candidates[0]  # Candidate(rank=1, key='bank.n.01', title='bank', score=...,
        #   text='sloping land (especially the slope beside a body of water)', rerank_score=None)
    """

    def __init__(
        self,
        config: Config,
        model: IndexedModel,
        name: str,
        reranker: JointReranker | None = None,
    ) -> None:
        self.config = config
        self.model = model
        self.name = name
        self.reranker = reranker
        self.plan = refresh_plan(config)
        self.catalogue = EntityCatalogue.open(self.plan.data_dir)
        self._started_ray = False
        self._opening = threading.Lock()  # Ray, the pool and the index: opened by one call
        self._in_process = threading.Lock()  # the catalogue's cache, the in-process models
        self._opened = contextlib.ExitStack()
        self._index: OpenIndex | None = None
        self._biencoder: BiEncoder | None = None
        self._reranker_tokens: TokenStore | None = None

    @classmethod
    def from_config(
        cls,
        config: Config,
        checkpoint: str = "newest",
        export: Path | None = None,
        reranker: Path | None = None,
    ) -> EntityLinker:
        """The linker of a recipe: the bi-encoder exported in ``export``, else the run's
        ``checkpoint`` (``newest``, ``untrained``, a ``step-<S>/`` or ``export/`` directory, as
        ``hnce eval --checkpoint``); ``reranker`` as :func:`load_linking_reranker` reads it. An
        empty or missing catalogue is refused before any model is read."""
        check_catalogue(config)
        if export is not None:
            model, name = IndexedModel.from_export(Path(export)), str(export)
        else:
            model, name = resolve_model(config, checkpoint)
        joint = (
            None
            if reranker is None
            else load_linking_reranker(Path(reranker), local_device(config.cluster.use_gpu))
        )
        return cls(config, model, name, joint)

    @classmethod
    def from_run(
        cls,
        run: Path | str,
        checkpoint: str = "newest",
        overrides: Sequence[str] = (),
        reranker: Path | None = None,
    ) -> EntityLinker:
        """A run's checkpoint: ``run`` is its directory (the ``config.yaml`` ``hnce train``
        wrote there) or a recipe file; ``overrides`` are ``section.key=value`` as ``--set``."""
        recipe = Path(run) / RUN_RECIPE if Path(run).is_dir() else Path(run)
        return cls.from_config(load_config(recipe, overrides), checkpoint, reranker=reranker)

    @classmethod
    def from_export(
        cls,
        export_dir: Path | str,
        data_root: Path | str,
        run_dir: Path | str | None = None,
        recipe: Path | None = None,
        overrides: Sequence[str] = (),
        reranker: Path | None = None,
    ) -> EntityLinker:
        """The bi-encoder exported in ``export_dir`` (a checkpoint's ``export/``) over the
        dataset ``data_root``; ``run_dir`` (default: the recipe's ``run.dir``) keeps in its
        ``eval-index/`` the index version built for it, found again by later linkers."""
        where = [f"data.root={data_root}"] + ([] if run_dir is None else [f"run.dir={run_dir}"])
        config = load_config(recipe, [*overrides, *where])
        return cls.from_config(config, export=Path(export_dir), reranker=reranker)

    def search(self, mentions: Sequence[Mention], k: int = 8) -> Retrieved:
        """Top-``k`` entity ids and scores of ``mentions`` against the whole catalogue, in an
        index version of the model (module docstring), opened by the first call and kept;
        ``Retrieved.built`` says whether the catalogue had to be encoded to open it."""
        retrieved = self._open_index().retrieve(mentions, k)
        logger.info(
            "linked %d mention(s) with %s in index v%d of %s (%s)",
            len(mentions),
            self.name,
            retrieved.index_version.version,
            retrieved.index_version.path.parent,
            "built for this call" if retrieved.built else "reused",
        )
        return retrieved

    def _open_index(self) -> OpenIndex:
        """The index the linker searches, opened (Ray started or joined first) by the first call
        that needs it; calls that arrive meanwhile wait for it instead of opening their own."""
        with self._opening:
            if not ray.is_initialized():
                cpus = self.plan.refresh.num_encoders * self.plan.refresh.encoder_cpus
                init_ray(self.config.cluster, cpus)
                self._started_ray = True
            if self._index is None:
                self._index = self._opened.enter_context(open_index(self.plan, self.model))
            return self._index

    def link(
        self, texts: Sequence[str], k: int = 8, sources: Sequence[str] | None = None
    ) -> list[LinkedMention]:
        """The top-``k`` candidates of every mention marked in ``texts``, in order (several per
        text when it marks several); ``sources`` name the texts in errors (``text <n>``)."""
        sources = sources or [f"text {number}" for number in range(1, len(texts) + 1)]
        return self.link_mentions(texts_mentions(texts, sources), k)

    def link_mentions(self, mentions: Sequence[Mention], k: int = 8) -> list[LinkedMention]:
        """The top-``k`` candidates of each mention, reranked when the linker has a reranker."""
        if k < 1:
            raise InputError(f"k must be at least 1 (got {k})")
        if not mentions:
            return []
        depth = max(k, self.config.rerank.num_candidates) if self.reranker else k
        retrieved = self.search(mentions, depth)
        if self.reranker is None:
            return self._described(mentions, retrieved.cands[:, :k], retrieved.scores[:, :k])
        ids, scores, judged = self._reranked(mentions, retrieved)
        return self._described(mentions, ids[:, :k], scores[:, :k], judged[:, :k])

    def _reranked(
        self, mentions: Sequence[Mention], retrieved: Retrieved
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The retrieved ids reordered by the reranker, each with its retriever score and its
        reranker score."""
        assert self.reranker is not None
        found = SplitCandidates(list(mentions), retrieved.cands, retrieved.scores)
        with self._in_process:
            if self._reranker_tokens is None:
                self._reranker_tokens = TokenStore.ensure(
                    self.plan.data_dir, self.reranker.tokenizer, self.reranker.entity_length
                )
            ids, judged = rerank(
                self.reranker,
                self._reranker_tokens,
                found,
                found.cands.shape[1],
                scoring_batch_size(self.config.rerank.training.batch_size),
            )
        # each reranked id's column in the retriever's row (padding -1 matches padding)
        columns = (ids[:, :, None] == found.cands[:, None, :]).argmax(axis=2)
        return ids, np.take_along_axis(retrieved.scores, columns, axis=1), judged

    def _described(
        self,
        mentions: Sequence[Mention],
        ids: np.ndarray,
        scores: np.ndarray,
        judged: np.ndarray | None = None,
    ) -> list[LinkedMention]:
        """Keys, titles and texts of the candidates, read for these ids only (the row groups
        holding them, not the catalogue's texts), with the retriever's ``scores`` and the
        reranker's ``judged`` when given; padding (-1, last in a row where the catalogue holds
        fewer than k entities) is dropped."""
        with self._in_process:
            entities = self.catalogue.get_many(ids[ids >= 0].tolist())
        linked, taken = [], 0
        for number, (mention, row) in enumerate(zip(mentions, ids, strict=True)):
            present = row >= 0
            found = entities[taken : taken + int(present.sum())]
            taken += len(found)
            reranked = [None] * len(found) if judged is None else judged[number][present].tolist()
            candidates = [
                Candidate(rank, entity.key, entity.title, float(score), entity.text, judged_score)
                for rank, (entity, score, judged_score) in enumerate(
                    zip(found, scores[number][present], reranked, strict=True), start=1
                )
            ]
            linked.append(LinkedMention(mention, candidates))
        return linked

    def encode_mentions(
        self, texts: Sequence[str], sources: Sequence[str] | None = None
    ) -> np.ndarray:
        """Query vectors float32 [M, Q, d] of every mention marked in ``texts`` (Q = 1 for dual
        and multi-m), in one batch by the mention tower in this process: the vectors
        :meth:`search` sends to the index."""
        sources = sources or [f"text {number}" for number in range(1, len(texts) + 1)]
        mentions = texts_mentions(texts, sources)
        with self._in_process:
            return encode_mention_queries(
                self._local_biencoder(),
                [mention.context_left for mention in mentions],
                [mention.mention for mention in mentions],
                [mention.context_right for mention in mentions],
            )

    def encode_entities(self, entity_ids: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """Index vectors of catalogue entities (by entity_id; ``self.catalogue.ids_for_keys``
        maps keys), in this process from the catalogue's token store, as an index shard holds
        them: (vectors float32 [V, d], the entity id of each vector int64 [V]); one vector per
        entity for dual, several for multi-m and sum-of-max."""
        tokens = ensure_token_store(self.plan.data_dir, self.model)
        with self._in_process:
            vectors, owners, _ = encode_entity_vectors(
                self._local_biencoder(),
                tokens,
                np.asarray(entity_ids, dtype=np.int64),
                self.plan.refresh.encoder_batch_size,
                pool_factor=self.plan.index.token_pool_factor,
            )
        return vectors, owners

    def _local_biencoder(self) -> BiEncoder:
        """The bi-encoder loaded into this process (once) for the ``encode_*`` methods, which
        hold the linker's in-process lock."""
        if self._biencoder is None:
            device = local_device(self.config.cluster.use_gpu)
            self._biencoder = load_biencoder(self.model.export_dir, device).eval()
        return self._biencoder

    def close(self) -> None:
        """Stop the encoder pool holding the index, and the Ray instance this linker started
        (not one it joined or found running), once every call has returned."""
        with self._opening:
            self._opened.close()
            self._index = None
            if self._started_ray:
                ray.shutdown()
                self._started_ray = False

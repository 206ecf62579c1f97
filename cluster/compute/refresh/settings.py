"""The ``refresh`` section of a recipe (:data:`RefreshSettings`) and the rules it sets on the rest.

The fixed keys say whether and how the run refreshes and what each refresh builds; each trigger
with options adds its own group, ``refresh.<trigger>`` (declared beside the trigger,
:data:`hnce.cluster.compute.refresh.triggers.TRIGGER_SPECS`).
"""

from __future__ import annotations

from dataclasses import field
from typing import Annotated, Any, Literal

from pydantic import Field

from hnce.cluster.compute.refresh.triggers import TRIGGER_SPECS
from hnce.settings import Flag, NonNegativeInt, PositiveInt, Text, section_with_groups

_REFRESH_DOC = """The ``refresh`` section: whether and how the run refreshes, and what each refresh builds.

    Attributes:
        enabled: ``hnce train`` refreshes the negatives it trains on; false: the initial negatives
            (``negatives.initial``) are all it trains on (mined once).
        mode: how the trainer meets the refreshes (:mod:`hnce.cluster.compute.refresh.modes`):
            ``async`` (default), or ``sync``: it waits at every checkpoint for the negatives mined
            with it.
        trigger: which checkpoints ask for a refresh (:mod:`hnce.cluster.compute.refresh.triggers`):
            ``payoff`` (default; ``checkpoints`` under ``mode: sync``), ``stale`` or
            ``checkpoints``.
        num_encoders: encoder actors (0: one per ``hnce_encoder`` slot the cluster advertises, else
            one per GPU, else 1).
        encoder_cpus: torch threads (and CPUs requested) per CPU encoder actor.
        encoder_batch_size: entities per forward pass of an encoder actor.
        shard_size: catalogue rows per shard (one FAISS index file each).
        top_n: candidates kept per mention in a negatives version.
        splits: mention splits mined by every refresh (the train split at least, for training; add
            dev/test to rerank them with ``hnce rerank``).
        heldout_recall: after building its index, each refresh scores the eval split
            (``data.eval_split``, at most ``data.max_eval_mentions``) against it and logs
            recall@``eval.ks`` as ``hnce eval`` of that checkpoint would
            (:mod:`hnce.cluster.compute.refresh.heldout`).
    """


def _refresh_section() -> type:
    """:class:`RefreshSettings`: the fixed keys, then one option group per trigger that has
    options, from the triggers' specs."""
    fields = [
        ("enabled", Flag, True),
        ("mode", Literal["async", "sync"], "async"),
        ("trigger", Literal[tuple(TRIGGER_SPECS)], "payoff"),
        ("num_encoders", NonNegativeInt, 0),
        ("encoder_cpus", PositiveInt, 1),
        ("encoder_batch_size", PositiveInt, 128),
        ("shard_size", PositiveInt, 100_000),
        ("top_n", PositiveInt, 32),
        (
            "splits",
            Annotated[list[Text], Field(min_length=1)],
            field(default_factory=lambda: ["train"]),
        ),
        ("heldout_recall", Flag, True),
    ]
    return section_with_groups(
        "RefreshSettings", _REFRESH_DOC, __name__, fields, TRIGGER_SPECS.values()
    )


RefreshSettings: Any = _refresh_section()


def refresh_problem(
    refresh: Any, on_index: bool, train_split: str, num_negatives: int, trigger_set: bool
) -> tuple[str, str] | None:
    """The first rule the ``refresh`` section breaks, as (key, problem), or None. ``on_index``:
    the recipe trains on mined negatives (``negatives.source: index``); ``trigger_set``: the
    recipe or an override set ``refresh.trigger`` (unset, ``mode: sync`` resolves it to
    ``checkpoints``, the trigger sync waits for)."""
    if refresh.mode == "sync" and (not on_index or not refresh.enabled):
        return (
            "refresh.mode",
            "is sync, which waits for refreshed negatives: it needs 'negatives.source: index' "
            "and 'refresh.enabled: true'",
        )
    if refresh.mode == "sync" and not trigger_set:
        refresh.trigger = "checkpoints"
    if TRIGGER_SPECS[refresh.trigger].asynchronous and refresh.mode != "async":
        return (
            "refresh.trigger",
            f"is {refresh.trigger}, which asks the asynchronous coordinator for refreshes: it "
            "needs 'refresh.mode: async' (sync refreshes at every checkpoint)",
        )
    if refresh.top_n < num_negatives:
        return (
            "refresh.top_n",
            f"({refresh.top_n}) must be at least 'negatives.num_negatives' ({num_negatives})",
        )
    if on_index and train_split not in refresh.splits:
        return ("refresh.splits", f"{refresh.splits} must include the train split {train_split!r}")
    return None

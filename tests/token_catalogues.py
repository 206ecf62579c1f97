"""Synthetic token catalogues for the token indexes' tests: token vectors drawn around shared
"topics", as a language model's token vectors cluster around word senses, so that IVF lists,
centroids and residual codes see the structure they are built for."""

from __future__ import annotations

import numpy as np

DIM = 32
#: vectors an entity of a multi-M catalogue
M = 4


def unit(vectors: np.ndarray) -> np.ndarray:
    """`vectors` scaled to unit length along their last axis (float32)."""
    return (vectors / np.linalg.norm(vectors, axis=-1, keepdims=True)).astype(np.float32)


def token_catalogue(entities: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(token vectors [T, DIM], entity id of each, sorted): 2-12 tokens per entity, each one of
    1,000 topics' centres plus noise."""
    rng = np.random.default_rng(seed)
    topics = unit(rng.standard_normal((1000, DIM)))
    ids = np.repeat(np.arange(entities), rng.integers(2, 13, size=entities))
    vectors = topics[rng.integers(0, len(topics), size=len(ids))]
    return unit(vectors + 0.1 * rng.standard_normal(vectors.shape)), ids


def token_queries(vectors: np.ndarray, ids: np.ndarray, count: int, seed: int = 1) -> np.ndarray:
    """[count, 4, DIM] queries: noisy copies of tokens of a random entity, one padded row."""
    rng = np.random.default_rng(seed)
    queries = np.zeros((count, 4, DIM), np.float32)
    for row, entity in enumerate(rng.integers(0, ids.max() + 1, size=count)):
        own = vectors[ids == entity]
        picked = own[rng.integers(0, len(own), size=3)]
        queries[row, :3] = unit(picked + 0.1 * rng.standard_normal(picked.shape))
    return queries


def multi_catalogue(entities: int, seed: int = 2) -> tuple[np.ndarray, np.ndarray]:
    """(vectors [entities·M, DIM], entity id of each): M vectors per entity around the topics of
    :func:`token_catalogue`, in entity order, as a multi-M shard stores them."""
    vectors, _ = token_catalogue(entities * M // 7 + 1, seed)
    vectors = vectors[np.random.default_rng(seed).permutation(len(vectors))]
    if len(vectors) < entities * M:
        vectors = np.concatenate([vectors] * (entities * M // len(vectors) + 1))
    return vectors[: entities * M], np.repeat(np.arange(entities, dtype=np.int64), M)

"""The plaid token index on real-text tokens: WordNet's noun glosses encoded by the packaged
all-MiniLM-L6-v2 under the sum-of-max scorer (normalised token vectors, as the recipes score),
searched for WordNet's own example sentences. The synthetic catalogues of test_cluster_plaid.py
cluster by construction; these are a real model's tokens of real text, at the smallest size that
spans several centroids and shards (BENCHMARKS.md measures the same at the catalogue's size:
``benchmarks/plaid_index.py``)."""

from __future__ import annotations

from pathlib import Path

import faiss
import numpy as np
import pytest
import torch
from exact_scores import recall, sum_of_max

from hnce.cluster.compute.entity_encoding import compress_tokens
from hnce.cluster.stores.faiss_device import resolve_faiss_device
from hnce.cluster.stores.faiss_index import train_index
from hnce.cluster.stores.index_shard import IndexShard
from hnce.cluster.stores.index_spec import IndexSpec
from hnce.cluster.stores.sharded_searcher import ShardedSearcher
from hnce.encoders.biencoder import build_biencoder, minilm_path
from hnce.pipeline.data.bad_rows import BadRowPolicy
from hnce.pipeline.data.wordnet import data_files, iter_synsets

pytestmark = pytest.mark.slow

WORDNET = Path("/usr/share/wordnet")
#: every STRIDE-th noun synset of WordNet's data file: 411 glosses from across the file
STRIDE = 200
MENTIONS = 40
K = 10
SPEC = IndexSpec(kind="plaid", nlist=128, pq_m=16, nprobe=8)


@pytest.fixture(scope="module")
def real_tokens() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(token vectors [T, 384], entity id of each, queries [MENTIONS, Q, 384]): the entity side
    of the som scorer over every STRIDE-th noun synset's gloss, its mention side over the first
    example sentences of those synsets."""
    noun, prefix, pos = data_files(WORDNET)[0]
    with BadRowPolicy("strict") as policy:
        synsets = [s for _, s in iter_synsets(noun, prefix, pos, policy)][::STRIDE]
    examples = [s.examples[0] for s in synsets if s.examples][:MENTIONS]
    model = build_biencoder(minilm_path(), "som", entity_length=32, normalize=True).eval()
    with torch.inference_mode():
        entities = model.tokenize_entities([s.title for s in synsets], [s.text for s in synsets])
        vectors, rows = model.entity_index_vectors(**entities)
        mentions = model.tokenize_mentions([""] * len(examples), examples, [""] * len(examples))
        queries = model.mention_query_vectors(**mentions)
    return vectors.numpy(), rows.numpy().astype(np.int64), queries.numpy()


def test_plaid_recalls_the_exact_top_k_of_real_tokens(real_tokens) -> None:
    """Over 3 shards on one quantiser of 128 centroids (9,727 tokens; pq_m 16, 8 probed a query
    token, 200 of the 411 entities kept by the pruned interaction and 50 of them decoded),
    plaid keeps at least 0.5 of the exact top-10 over full-precision tokens (0.563 measured;
    0.713 scoring the same 50 from a float16 copy: the codes are coarse). With the pruned
    scores replaced by noise it kept 0.388, with each token decoded as its centroid alone
    (residuals dropped) 0.280."""
    vectors, ids, queries = real_tokens
    exact = np.argsort(-sum_of_max(queries, vectors, ids), axis=1)[:, :K]
    version = train_index(vectors, SPEC)
    shards = []
    for entities in np.array_split(np.arange(ids.max() + 1), 3):
        rows = np.flatnonzero((ids >= entities[0]) & (ids <= entities[-1]))
        built = compress_tokens(version, [(vectors[rows], ids[rows], 0)], SPEC)
        faiss.extract_index_ivf(built.index).nprobe = SPEC.probes
        cpu = resolve_faiss_device("cpu")
        shards.append(IndexShard.on_device(built.index, built.ids, cpu, built.codes))
    assert faiss.extract_index_ivf(version).nlist == SPEC.nlist
    found, _ = ShardedSearcher(shards, None, candidate_depth=200).search(queries, K)
    assert recall(found, exact) >= 0.5, recall(found, exact)

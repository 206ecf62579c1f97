"""What one GPU does for the multi-vector scorers at catalogue scale.

Two figures per device, measured in one invocation:

(1) **Entity encoding rate per scorer** through the product's encoder (``BiEncoder``
    ``entity_index_vectors`` under :func:`hnce.encoders.precision.autocast`, as an encoder actor
    runs it, the vectors copied to the host as float32): a BERT-base entity tower (12 × 768,
    random weights, SDPA attention), 128 tokens an entity, for dual (one 768-d vector an
    entity), multi-8 and sum-of-max with ColBERT's 128-d projection (8 and 128 vectors an
    entity). Entities/s, index vectors/s, and the hours 5,903,530 entities take at that rate.
(2) **Exact sum-of-max rescoring of candidate lists**, s = Σ_i max_j ⟨x_i, y_j⟩ (ColBERT's late
    interaction, Khattab & Zaharia 2020, eq. 3): 32 query token vectors against each of
    ``--candidates`` candidates of 128 token vectors, d = 128, in fp16 on the GPU (torch) and in
    float32 on this machine's CPU (numpy, the arithmetic the shard holders run:
    ``IndexShard.sum_of_max_top_k`` in ``cluster.stores.index_shard``): candidates scored per
    second, and the ratio of the two.
(3) **What the holders' CPUs then do with those vectors**, where FAISS is installed: a version's
    IVF-PQ quantiser (``train_index``: nlist 1024, ``IndexSpec.train_size`` 65,536 vectors,
    d = 128) and ``--pq-vectors`` token vectors added to a copy of it (``build_shard_index``, the
    ``index.token_copy`` path) and also encoded standalone (``token_codes``, the codes path), at
    ``pq_m`` 32 and 64, on every core FAISS uses: token vectors/s, and the hours 5,903,530
    entities × 124 tokens (the synthetic KILT catalogue's mean) take on one such node.

Needs torch and transformers (and FAISS for (3)); no Ray or DeepSpeed, so it runs on a GPU node
with a FAISS CPU wheel carried there; without CUDA it measures the CPU side at ``--cpu-batch``
and says the GPU figures remain.

    python -m benchmarks.gpu_multivector [--seconds 6] [--candidates 800]

writes ``benchmarks/results/gpu_multivector.md``.
"""

from __future__ import annotations

import platform
import tempfile
from pathlib import Path

import numpy as np
import torch
from transformers import BertConfig

from benchmarks import harness
from benchmarks.encoders_throughput import tiny_tokenizer
from hnce.encoders.biencoder import build_biencoder
from hnce.encoders.precision import autocast

FULL_CATALOGUE = 5_903_530
TOKENS_AN_ENTITY = 124  # the synthetic KILT catalogue's mean at 128 tokens
ENTITY_TOKENS = 128
MENTION_TOKENS = 32
WIDTH = 128
#: (scorer, projection) as the recipes use them at scale
SCORERS = (("dual", None), ("multi-8", WIDTH), ("som", WIDTH))


def encoding_rate(
    scorer: str, projection: int | None, device: torch.device, batch: int, seconds: float
) -> tuple[float, float]:
    """(entities/s, index vectors/s) of ``scorer``'s entity side at 128 tokens on ``device``."""
    with tempfile.TemporaryDirectory() as scratch:  # token ids are drawn at random below
        words = tiny_tokenizer(Path(scratch), ["entity"], ["catalogue"])
        model = build_biencoder(
            BertConfig(attn_implementation="sdpa"),  # BERT-base, its own 30,522-id vocabulary
            scorer,
            tokenizer=words,
            entity_length=ENTITY_TOKENS,
            projection_size=projection,
            device=device,
        ).eval()
    ids = torch.randint(1000, 30000, (batch, ENTITY_TOKENS), device=device)
    ids[:, 0], ids[:, -1] = words.cls_token_id, words.sep_token_id
    mask = torch.ones_like(ids)

    def encode() -> int:
        with autocast(device):
            vectors, _ = model.entity_index_vectors(ids, mask)
        return len(vectors.float().cpu().numpy())

    with torch.inference_mode():
        encode()  # warm-up
        entities = vectors = 0
        timer = harness.Timer()
        while timer.elapsed() < seconds:
            vectors += encode()
            entities += batch
        elapsed = timer.stop()
    return entities / elapsed, vectors / elapsed


def gpu_rescoring_rate(
    device: torch.device, queries: int, candidates: int, seconds: float
) -> float:
    """Candidates scored per second by Σ_i max_j ⟨x_i, y_j⟩ in fp16 on the GPU."""
    query = torch.randn(queries, MENTION_TOKENS, WIDTH, device=device, dtype=torch.float16)
    tokens = torch.randn(
        queries, candidates, ENTITY_TOKENS, WIDTH, device=device, dtype=torch.float16
    )

    def score() -> None:
        token_scores = torch.einsum("qid,qcjd->qcij", query, tokens)
        token_scores.amax(dim=3).float().sum(dim=2).cpu()

    score()
    torch.cuda.synchronize(device)
    done, timer = 0, harness.Timer()
    while timer.elapsed() < seconds:
        score()
        done += queries * candidates
    return done / timer.stop()


def cpu_rescoring_rate(queries: int, candidates: int, seconds: float) -> float:
    """Candidates scored per second by the shard holders' numpy arithmetic, one query at a time:
    live query tokens @ the candidates' token vectors, max per candidate's run of columns, sum."""
    rng = np.random.default_rng(0)
    query = rng.standard_normal((queries, MENTION_TOKENS, WIDTH), dtype=np.float32)
    tokens = rng.standard_normal((candidates * ENTITY_TOKENS, WIDTH), dtype=np.float32)
    offsets = np.arange(0, candidates * ENTITY_TOKENS, ENTITY_TOKENS)
    done, timer = 0, harness.Timer()
    while timer.elapsed() < seconds:
        for row in range(queries):
            token_scores = query[row] @ tokens.T
            np.maximum.reduceat(token_scores, offsets, axis=1).sum(0)
            done += candidates
    return done / timer.stop()


def quantiser_rows(vectors: int) -> list[str]:
    """Rows of (3): IVF-PQ add and standalone codes, token vectors/s on every core."""
    import faiss

    from hnce.cluster.stores.faiss_index import build_shard_index, train_index
    from hnce.cluster.stores.index_spec import IndexSpec
    from hnce.cluster.stores.pq_codes import token_codes

    rng = np.random.default_rng(0)
    tokens = rng.standard_normal((vectors, WIDTH), dtype=np.float32)
    rows = []
    for pq_m in (32, 64):
        spec = IndexSpec(kind="ivfpq", pq_m=pq_m)
        quantiser = train_index(tokens[: spec.train_size], spec)
        _, added = harness.timed(build_shard_index, tokens, spec, trained=quantiser)
        _, coded = harness.timed(token_codes, quantiser, tokens)
        total = FULL_CATALOGUE * TOKENS_AN_ENTITY
        rows.append(
            f"| {pq_m} | {vectors / added:,.0f} | {total / (vectors / added) / 3600:.1f} | "
            f"{vectors / coded:,.0f} | {total / (vectors / coded) / 3600:.1f} |"
        )
    return [
        f"IVF-PQ on this node's CPU (FAISS {faiss.__version__}, {faiss.omp_get_max_threads()} "
        f"threads; nlist 1024, trained on {IndexSpec().train_size:,} vectors, {vectors:,} "
        f"token vectors of d = {WIDTH}):",
        "",
        "| pq_m | add to the quantiser's copy, vectors/s | hours for 5.9M × 124 tokens | "
        "standalone codes, vectors/s | hours |",
        "|---:|---:|---:|---:|---:|",
        *rows,
    ]


def encoding_rows(device: torch.device, batch: int, seconds: float) -> list[str]:
    rows = []
    for scorer, projection in SCORERS:
        entities, vectors = encoding_rate(scorer, projection, device, batch, seconds)
        width = projection or 768
        hours = FULL_CATALOGUE / entities / 3600
        rows.append(
            f"| {scorer} ({width}-d) | {batch} | {entities:,.0f} | {vectors:,.0f} | "
            f"{vectors / entities:,.0f} | {hours:.2f} |"
        )
    return rows


def main() -> None:
    parser = harness.arguments(__doc__, "gpu_multivector", seconds=6.0, candidates=800)
    parser.add_argument("--gpu-batch", type=int, default=512, help="entities a GPU batch")
    parser.add_argument("--cpu-batch", type=int, default=16, help="entities a CPU batch")
    parser.add_argument("--queries", type=int, default=64, help="queries a rescoring batch")
    parser.add_argument("--pq-vectors", type=int, default=1_000_000, help="token vectors (3)")
    args = harness.parse(parser)
    cuda = torch.cuda.is_available()
    cpu_rate = cpu_rescoring_rate(8, args.candidates, args.seconds)
    header = (
        "| scorer (index width) | batch | entities/s | index vectors/s | vectors an entity "
        "| hours for 5,903,530 entities |"
    )
    lines = [
        "# One GPU for the multi-vector scorers: encoding and exact rescoring",
        "",
        f"`{harness.invocation('benchmarks.gpu_multivector')}`. BERT-base entity tower (random "
        f"weights), {ENTITY_TOKENS} tokens an entity, autocast as the encoder actors run it "
        "(bf16 on a GPU, fp32 on a CPU), index vectors copied to the host as float32. "
        f"CPU: {platform.processor() or platform.machine()}, {torch.get_num_threads()} torch "
        "threads.",
        "",
    ]
    if cuda:
        device = torch.device("cuda", 0)
        gpu_rate = gpu_rescoring_rate(device, args.queries, args.candidates, args.seconds)
        lines += [
            f"GPU: {torch.cuda.get_device_name(device)}, torch {torch.__version__}, CUDA "
            f"{torch.version.cuda}.",
            "",
            "Entity encoding on the GPU:",
            "",
            header,
            "|---|---:|---:|---:|---:|---:|",
            *encoding_rows(device, args.gpu_batch, args.seconds),
            "",
            f"Exact sum-of-max rescoring ({MENTION_TOKENS} query tokens × {args.candidates} "
            f"candidates × {ENTITY_TOKENS} tokens, d = {WIDTH}): GPU fp16 **{gpu_rate:,.0f}** "
            f"candidates/s, CPU float32 (numpy, one query at a time) **{cpu_rate:,.0f}** "
            f"candidates/s: **{gpu_rate / cpu_rate:,.0f}×**.",
        ]
    else:
        lines += [
            "No CUDA device here: the GPU rows remain (run this on a GPU node). This machine's "
            "CPU side:",
            "",
            header,
            "|---|---:|---:|---:|---:|---:|",
            *encoding_rows(torch.device("cpu"), args.cpu_batch, args.seconds),
            "",
            f"Exact sum-of-max rescoring on the CPU (numpy, one query at a time, "
            f"{args.candidates} candidates): **{cpu_rate:,.0f}** candidates/s.",
        ]
    try:
        import faiss  # noqa: F401
    except ImportError:
        lines += ["", "FAISS is not installed here: (3) not measured."]
    else:
        lines += ["", *quantiser_rows(args.pq_vectors)]
    harness.write_result(args.output, lines)


if __name__ == "__main__":
    main()

"""The GPU figures of issue 13, measured where a CUDA device is present, listed as remaining where not.

(a) BERT-base entity encoding at 128 tokens in bf16 (``hnce.encoders.precision.autocast``, SDPA
    attention), entities/s against the FLOP bound: 2 × 110M parameters × 128 tokens ≈ 28 GFLOP of
    matmuls per entity (the issue's ≈22 counts the encoder layers only) at the device's bf16 peak
    (``--peak-tflops``, 989 for an H100 SXM dense);
(d) exact top-k mining as the GPU shard holders would do it: a 5,903,530 × 768 fp16 entity matrix
    (``--entities``), query batches of 1,024, top-64, queries/s.

The DeepSpeed step through Ray Train with NCCL (b) and a refresh of ≥ 1M entities with GPU
encoding (c) run the product's own commands on a GPU node (``hnce train`` / ``hnce refresh`` with
``cluster.use_gpu: true``); they need Ray and DeepSpeed installed there and are listed here.
Without a CUDA device the script writes the section saying so, with every check that remains.

    python -m benchmarks.gpu_paths

writes ``benchmarks/results/gpu_paths.md``.
"""

from __future__ import annotations

import platform

import torch
from transformers import BertConfig, BertModel

from benchmarks import harness
from hnce.encoders.precision import autocast

REMAINING = [
    "(a) BERT-base entity encoding at 128 tokens, bf16, entities/s against the FLOP bound "
    "(target ≥ 60% of the bf16 peak): `python -m benchmarks.gpu_paths` on the GPU node",
    "(b) one DeepSpeed step through Ray Train with NCCL: `hnce train --config "
    "configs/synthetic-test.yaml --set cluster.use_gpu=true --set training.num_workers=1`. On "
    "a lent H200 (Ray 2.60, DeepSpeed 0.19.8, torch 2.11 CUDA 13, NCCL 2.28.9) NCCL's first "
    "broadcast in the trainer worker failed (`Failed to CUDA calloc async 4 bytes`) while a "
    "bare NCCL broadcast, one inside a Ray actor and one under Ray Train after "
    "deepspeed.initialize (bf16, ZeRO-1) all passed: bm25s, imported by the trainer, runs a "
    "JAX op at import and JAX took the GPU. With JAX kept on the CPU the run trained 6 bf16 "
    "steps on cuda:0 (0.18 s a step after the first, engine set-up 2.5 s). hnce now sets "
    "JAX_PLATFORMS=cpu for the driver and every Ray worker and imports bm25s only where BM25 "
    "runs; to re-run on a GPU node: the same command without exporting anything. On one GPU "
    "the refresh's encoder actors ask for the GPU the trainer holds: that run's refresh never "
    "encoded a shard (abandoned at the end of training, 18 s in; the pool fails with a "
    "placement error naming the held GPU after refresh.wait_floor_seconds); sharing one GPU "
    "between the trainer and the refresh is not designed yet",
    "(c) a refresh of ≥ 1M entities with GPU encoding: `hnce data synthetic-kilt` at 1M pages, "
    "then `hnce refresh` with `cluster.use_gpu: true` (FAISS GPU needs the `gpu` extra)",
    "(d) exact GPU top-k mining of a 5.9M × 768 fp16 matrix: `python -m benchmarks.gpu_paths`",
]


def encoding_rate(device: torch.device, batch: int, seconds: float, bf16_weights: bool) -> float:
    """Entities/s of a BERT-base tower (random weights) at 128 tokens under the product's
    autocast, its weights fp32 (as the encoder actors load them) or cast to bf16."""
    model = BertModel(BertConfig(attn_implementation="sdpa")).to(device).eval()
    if bf16_weights:
        model = model.to(torch.bfloat16)
    ids = torch.randint(1000, 30000, (batch, 128), device=device)
    mask = torch.ones_like(ids)
    with torch.inference_mode(), autocast(device):
        model(input_ids=ids, attention_mask=mask)  # the first batch warms up
        torch.cuda.synchronize(device)
        done, timer = 0, harness.Timer()
        while timer.elapsed() < seconds:
            model(input_ids=ids, attention_mask=mask)
            torch.cuda.synchronize(device)
            done += batch
    return done / timer.stop()


def mining_rate(device: torch.device, entities: int, queries: int, k: int) -> float:
    """Queries/s of exact inner-product top-k over an fp16 entity matrix on the device."""
    matrix = torch.randn(entities, 768, device=device, dtype=torch.float16)
    batch = torch.randn(queries, 768, device=device, dtype=torch.float16)
    torch.topk(batch @ matrix[:100_000].T, k, dim=1)
    torch.cuda.synchronize(device)
    with harness.Timer() as timer:
        for start in range(0, entities, 1_000_000):
            torch.topk(batch @ matrix[start : start + 1_000_000].T, k, dim=1)
        torch.cuda.synchronize(device)
    return queries / timer.seconds


def main() -> None:
    parser = harness.arguments(__doc__, "gpu_paths", entities=5_903_530, peak_tflops=989.0)
    args = harness.parse(parser)
    lines = ["# GPU paths (issue 13): encoding, NCCL step, GPU refresh, exact GPU mining", ""]
    if not torch.cuda.is_available():
        lines += [
            f"No CUDA device on the machine this ran on ({platform.node()}, torch "
            f"{torch.__version__}): no GPU was lent to this work, so none of the GPU figures "
            "has been measured yet. The CPU suite checks the GPU code paths' device rules "
            "(`pytest -k device`). Checks that remain, each to run on a GPU node:",
            "",
            *(f"- {check}" for check in REMAINING),
        ]
    else:
        device = torch.device("cuda", 0)
        name = torch.cuda.get_device_name(device)
        flops = 2 * 110e6 * 128
        rates = {
            (batch, bf16): encoding_rate(device, batch, 8.0, bf16)
            for batch in (256, 1024)
            for bf16 in (False, True)
        }
        mined = mining_rate(device, args.entities, 1024, 64)
        lines += [
            f"{name}, torch {torch.__version__}, CUDA {torch.version.cuda}.",
            "",
            "| check | figure |",
            "|---|---|",
            *(
                f"| (a) BERT-base entities/s, 128 tokens, autocast bf16, batch {batch}, weights "
                f"{'bf16' if bf16 else 'fp32'} | {rate:,.0f} "
                f"({rate * flops / (args.peak_tflops * 1e12):.0%} of the {args.peak_tflops:.0f} "
                f"TFLOP/s bound at {flops / 1e9:.0f} GFLOP/entity) |"
                for (batch, bf16), rate in rates.items()
            ),
            f"| (d) exact top-64 over {args.entities:,} × 768 fp16, queries/s | {mined:,.0f} |",
            "",
            "Remaining on a GPU node: " + "; ".join(REMAINING[1:3]) + ".",
        ]
    harness.write_result(args.output, lines)


if __name__ == "__main__":
    main()

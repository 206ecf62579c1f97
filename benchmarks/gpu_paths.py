"""The GPU figures (encoding, the NCCL step, a GPU refresh, exact GPU mining), measured where a CUDA device is present, listed as remaining where not.

(a) BERT-base entity encoding at 128 tokens in bf16 (``hnce.encoders.precision.autocast``, SDPA
    attention), entities/s against the FLOP bound: 2 × 110M parameters × 128 tokens ≈ 28 GFLOP of
    matmuls per entity (the issue's ≈22 counts the encoder layers only) at the device's bf16 peak
    (``--peak-tflops``, 989 for an H100 SXM dense);
(d) exact top-k mining as the GPU shard holders would do it: a 5,903,530 × 768 fp16 entity matrix
    (``--entities``), query batches of 1,024, top-64, queries/s.

(b, e) with ``--train``, where Ray and DeepSpeed are installed: the product's own ``hnce train``
    on one GPU with the refresh beside it (``cluster.gpu_sharing: auto``, which shares the GPU
    half and half: :mod:`hnce.cluster.compute.gpu_sharing`), asynchronous or, with
    ``--sync-every N``, a synchronous refresh every N steps that training waits for: a
    synthetic catalogue (``--train-entities`` per world, 3 worlds), a random BERT (``--layers``
    × ``--hidden``) with a WordPiece tokenizer (``--tokenizer``, default the packaged MiniLM's),
    bf16 DeepSpeed steps through Ray Train with NCCL, and refreshes encoded on the same GPU: where
    the run's seconds went, the step time, the refreshes published and used.

A refresh of ≥ 1M entities with FAISS on the GPU (c) needs the ``gpu`` extra there and is listed.
Without a CUDA device the script writes the section saying so, with every check that remains.

    python -m benchmarks.gpu_paths [--train | --train-only] [--sync-every N]

writes ``benchmarks/results/gpu_paths.md``.
"""

from __future__ import annotations

import argparse
import platform
import re
import shutil
from pathlib import Path

import torch
from transformers import BertConfig, BertModel

from benchmarks import harness
from benchmarks.harness.models import write_random_bert
from benchmarks.training_runs import published_refreshes, wall_clock_parts
from hnce.cluster.stores.run_events import read_events
from hnce.encoders.precision import autocast
from hnce.events import RunEvent

RECIPE = harness.ROOT / "configs" / "synthetic-test.yaml"

REMAINING = [
    "(a) BERT-base entity encoding at 128 tokens, bf16, entities/s against the FLOP bound "
    "(target ≥ 60% of the bf16 peak): `python -m benchmarks.gpu_paths` on the GPU node",
    "(b, e) `hnce train` on one GPU with the refresh beside it: `python -m benchmarks.gpu_paths "
    "--train` (asynchronous) and `--train --sync-every 15` on a GPU node with Ray, DeepSpeed and "
    "faiss-cpu installed (last run on a lent H200 on 2026-11-28: both trained to their end on "
    "negatives refreshed on the shared GPU)",
    "`hnce refresh` as a separate job beside a training launch on the one GPU (it takes half a "
    "GPU while the launch holds the run's training lock)",
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


def one_gpu_training(args: argparse.Namespace) -> list[str]:
    """(b, e): ``hnce train`` on one GPU with the refresh beside it (module docs); the result's
    lines."""
    work = args.work_dir
    data, run = work / "data", work / "run"
    if not (data / "manifest.json").is_file():
        shutil.rmtree(data, ignore_errors=True)
        harness.run_hnce(
            [
                "data",
                "synthetic",
                "--worlds",
                "3",
                "--entities-per-world",
                str(args.train_entities),
                "--mentions-per-entity",
                "2",
                "--out",
                str(data),
                "--no-progress",
            ]
        )
    model = write_random_bert(
        work / "model", args.tokenizer, args.layers, args.hidden, head_width=64
    )
    shutil.rmtree(run, ignore_errors=True)
    overrides = {
        "run.dir": run,
        "data.root": data,
        "model.path": model,
        "model.mention_length": 32,
        "model.entity_length": 128,
        "cluster.use_gpu": "true",
        "training.precision": "bf16",
        "training.num_workers": 1,
        "training.zero_stage": 1,  # the test recipe's ZeRO, mixed negatives and refresh: off by default
        "negatives.sampler": "mixed",
        "negatives.source": "index",
        "refresh.enabled": "true",
        "training.cpus_per_worker": 4,
        "training.steps": args.steps,
        "training.batch_size": 32,
        "training.learning_rate": 2.0e-5,
        "training.checkpoint_every": args.checkpoint_every or args.steps // 4,
        "training.log_every": 1,
        "refresh.encoder_cpus": 4,
        "refresh.encoder_batch_size": 512,
    }
    if args.sync_every:
        overrides |= {"refresh.mode": "sync", "training.checkpoint_every": args.sync_every}
    command = harness.run_recipe("train", RECIPE, overrides, log=work / "train.log")
    launch = read_events(run, RunEvent.LAUNCH)[-1]
    parts = wall_clock_parts(run, command.seconds)
    refreshes = published_refreshes(run)
    used = sorted(
        {int(e["version"]) for e in read_events(run, RunEvent.NEGATIVES) if "version" in e}
    )
    rates = [
        float(found.group(1))
        for window in refreshes
        if (found := re.search(r"at ([0-9.]+) entities/s", window.get("message", "")))
    ]
    refresh_seconds = [float(window["seconds"]) for window in refreshes]
    entities = 3 * args.train_entities
    return [
        f"| (b) `hnce train` on one GPU, bf16, BERT {args.layers}×{args.hidden}, "
        f"{args.steps} steps of 32 mentions, refresh "
        f"{f'sync every {args.sync_every} steps' if args.sync_every else 'async'}: GPUs | "
        f"{launch.get('gpus')} "
        f"({launch.get('gpus_reason')}) |",
        f"| (b) seconds before the first step / in the steps / per step / rest | "
        f"{parts['before first step']:.1f} / {parts['steps']:.1f} / {parts['per step']:.3f} / "
        f"{parts['rest']:.1f} |",
        f"| (e) refreshes of the {entities:,}-entity catalogue encoded on the trainer's GPU: "
        f"published, negatives versions trained on | {len(refreshes)}, {used} |",
        f"| (e) refresh seconds; encoding entities/s | "
        f"{', '.join(f'{seconds:.1f}' for seconds in refresh_seconds) or 'none'}; "
        f"{', '.join(f'{rate:,.0f}' for rate in rates) or 'none'} |",
    ]


def main() -> None:
    parser = harness.arguments(
        __doc__,
        "gpu_paths",
        work_dir=Path("/tmp/hnce-gpu-paths"),
        entities=5_903_530,
        peak_tflops=989.0,
        steps=200,
        train_entities=20_000,
        layers=12,
        hidden=768,
    )
    parser.add_argument("--train", action="store_true", help="run (b, e): hnce train on one GPU")
    parser.add_argument("--train-only", action="store_true", help="(b, e) only: skip (a) and (d)")
    parser.add_argument(
        "--checkpoint-every", type=int, default=0, help="training.checkpoint_every (0: steps/4)"
    )
    parser.add_argument(
        "--sync-every",
        type=int,
        default=0,
        help="refresh.mode sync with a checkpoint every N steps, so training waits for each GPU "
        "refresh (0: async)",
    )
    parser.add_argument("--tokenizer", type=Path, default=None, help="default: packaged MiniLM")
    args = harness.parse(parser)
    if args.tokenizer is None:
        from hnce.encoders.biencoder import minilm_path

        args.tokenizer = minilm_path()
    lines = ["# GPU paths: encoding, NCCL step, GPU refresh, exact GPU mining", ""]
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
            if not args.train_only
        }
        kernels = [
            f"| (a) BERT-base entities/s, 128 tokens, autocast bf16, batch {batch}, weights "
            f"{'bf16' if bf16 else 'fp32'} | {rate:,.0f} "
            f"({rate * flops / (args.peak_tflops * 1e12):.0%} of the {args.peak_tflops:.0f} "
            f"TFLOP/s bound at {flops / 1e9:.0f} GFLOP/entity) |"
            for (batch, bf16), rate in rates.items()
        ]
        if not args.train_only:
            mined = mining_rate(device, args.entities, 1024, 64)
            kernels.append(
                f"| (d) exact top-64 over {args.entities:,} × 768 fp16, queries/s | {mined:,.0f} |"
            )
        lines += [
            f"{name}, torch {torch.__version__}, CUDA {torch.version.cuda}.",
            "",
            "| check | figure |",
            "|---|---|",
            *kernels,
            *(one_gpu_training(args) if args.train or args.train_only else []),
            "",
            "Remaining on a GPU node: "
            + "; ".join(REMAINING[2:4] if args.train or args.train_only else REMAINING[1:4])
            + ".",
        ]
    harness.write_result(args.output, lines)


if __name__ == "__main__":
    main()

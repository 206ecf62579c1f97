"""``hnce plan``'s trainer figures against the measured peak memory of real training steps on CPU.

For two small BERT shapes (all-MiniLM-L6-v2's, and a 4-layer 256-wide one) and three memory
settings (plain, activation checkpointing, candidate chunks), each case runs in a fresh process:
the bi-encoder is built from its config, wrapped by DeepSpeed (ZeRO-0, fp32, gloo, one rank) and
trained for two steps of the real contrastive step on a full-length micro-batch. The peak
resident memory of those steps above the process's memory before the model existed (Linux
``VmHWM`` after a reset through ``/proc/self/clear_refs``: :func:`benchmarks.harness.own_peak_bytes`)
is compared with the estimator's total for the same recipe. Prints one row per case with the
ratio; asserts nothing.

    .venv/bin/python -m benchmarks.plan_memory
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import torch
from transformers import AutoTokenizer, BertConfig

from benchmarks import harness
from hnce.encoders.biencoder import build_biencoder, minilm_path
from hnce.encoders.local import load_local
from hnce.mining.losses import NCELoss
from hnce.pipeline.config import Config, load_config
from hnce.pipeline.plan import plan_memory
from hnce.pipeline.train.batch import ContrastiveBatch
from hnce.pipeline.train.one_process import single_process_group
from hnce.pipeline.train.step import train_micro_batch
from hnce.pipeline.train.worker import start_engine

CASES = {
    "plain": [],
    "activation checkpointing": ["model.activation_checkpointing=true"],
    "candidate chunks of 16": ["training.candidate_chunk_size=16"],
}
SHAPES = {
    "MiniLM-L6 (384 x 6)": {"hidden_size": 384, "num_hidden_layers": 6, "num_attention_heads": 12},
    "BERT 256 x 4": {"hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4},
}
# glibc returns every block over 64 KiB to the system when it is freed (no dynamic threshold,
# no retained heap top), so resident memory follows what torch holds.
MALLOC = {"MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "0"}
RECIPE = [
    "training.batch_size=8",
    "negatives.num_negatives=15",
    "model.mention_length=32",
    "model.entity_length=128",
    "training.num_workers=1",
    "training.zero_stage=0",
    "negatives.sampler=random",
    "negatives.source=none",
    "refresh.enabled=false",
]


def full_length_batch(config: Config) -> ContrastiveBatch:
    """A micro-batch of the recipe's shape, every sequence at full length: each mention's gold
    and its negatives among the candidates, random token ids (seed 0)."""
    batch, negatives = config.training.batch_size, config.negatives.num_negatives
    candidates = batch * (1 + negatives)
    generator = torch.Generator().manual_seed(0)

    def tokens(rows: int, length: int) -> dict[str, torch.Tensor]:
        ids = torch.randint(1000, 20000, (rows, length), generator=generator)
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}

    valid = torch.zeros(batch, candidates, dtype=torch.bool)
    for row in range(batch):
        valid[row, row * (1 + negatives) + 1 : (row + 1) * (1 + negatives)] = True
    return ContrastiveBatch(
        mention_ids=[str(i) for i in range(batch)],
        mentions=tokens(batch, config.model.mention_length),
        entity_ids=torch.arange(candidates),
        candidates=tokens(candidates, config.model.entity_length),
        gold=torch.arange(batch) * (1 + negatives),
        valid=valid,
        positive_ids=(torch.arange(batch) * (1 + negatives))[:, None],
    )


def measure(shape: dict[str, int], overrides: list[str], workdir: Path) -> dict[str, float]:
    """In this process: estimate, then build the bi-encoder, start DeepSpeed on it and train two
    steps; the estimate and the peak resident bytes above the memory before the model existed."""
    torch.set_num_threads(1)
    architecture = BertConfig(intermediate_size=4 * shape["hidden_size"], **shape)
    architecture.save_pretrained(workdir)  # what the estimator reads
    config = load_config(None, [f"model.path={workdir}", *RECIPE, *overrides])
    estimate = plan_memory(config, "retriever", 1000).trainer_total
    micro_batch = full_length_batch(config)
    with single_process_group():
        before = harness.own_rss_bytes()
        harness.reset_own_peak()
        model = build_biencoder(
            architecture,
            config.model.scorer,
            tokenizer=load_local(AutoTokenizer, minilm_path()),
            mention_length=config.model.mention_length,
            entity_length=config.model.entity_length,
        )
        if config.model.activation_checkpointing:
            model.enable_activation_checkpointing()
        engine = start_engine(model, config.training, torch.device("cpu"))
        engine.train()
        for _ in range(2):
            train_micro_batch(engine, micro_batch, NCELoss())
        return {"estimate": estimate, "measured": harness.own_peak_bytes() - before}


def main() -> None:
    parser = harness.arguments(__doc__, None, work_dir=Path("/tmp/hnce-plan-memory"))
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = harness.parse(parser)
    if args.one:
        shape, case = json.loads(args.one)
        args.work_dir.mkdir(parents=True, exist_ok=True)
        print(json.dumps(measure(SHAPES[shape], CASES[case], args.work_dir)))
        return
    print(f"{'model':<22} {'case':<26} {'estimate':>9} {'measured':>9} {'ratio':>6}")
    for shape in SHAPES:
        for case in CASES:  # each in a fresh process: its own peak, the allocator of MALLOC
            one = ["--one", json.dumps([shape, case]), "--work-dir", str(args.work_dir)]
            output = subprocess.run(
                [sys.executable, "-m", "benchmarks.plan_memory", *one],
                check=True,
                capture_output=True,
                text=True,
                env={**os.environ, **MALLOC},
                cwd=harness.ROOT,
            )
            figures = json.loads(output.stdout.strip().splitlines()[-1])
            estimate, measured = figures["estimate"] / 2**20, figures["measured"] / 2**20
            print(
                f"{shape:<22} {case:<26} {estimate:8.0f}M {measured:8.0f}M "
                f"{estimate / measured:6.2f}"
            )


if __name__ == "__main__":
    main()

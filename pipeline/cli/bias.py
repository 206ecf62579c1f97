"""``hnce bias``: the §6.4 synthetic gradient-bias experiment (Zhang & Stratos (2021) Figure 1).

Trains a one-ReLU-layer network by exact cross entropy on a low-entropy population over 1000
labels and records, along the way, the CE loss, the Monte Carlo NCE loss and the gradient-bias
norm ‖E[∇J_NCE] − ∇J_CE‖ of random, hard and mixed negatives (mining/bias.py). Writes
``<out>/bias.png`` (the two panels) and ``<out>/bias.json`` (every number).
"""

from __future__ import annotations

import argparse
from dataclasses import fields
from pathlib import Path

from hnce.mining.bias import SyntheticBiasConfig, plot_figure1, run_synthetic_experiment


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--out", type=Path, default=Path("runs/bias"), help="output directory (default runs/bias)"
    )
    defaults = SyntheticBiasConfig()
    for item in fields(SyntheticBiasConfig):
        default = getattr(defaults, item.name)
        parser.add_argument(
            "--" + item.name.replace("_", "-"),
            type=type(default),
            default=default,
            help=f"default {default}",
        )


def run(args: argparse.Namespace) -> int:
    config = SyntheticBiasConfig(
        **{f.name: getattr(args, f.name) for f in fields(SyntheticBiasConfig)}
    )
    result = run_synthetic_experiment(config)
    png, json_path = args.out / "bias.png", args.out / "bias.json"
    plot_figure1(result, png)
    result.to_json(json_path)
    print(
        f"population entropy {result.population_entropy:.3f} nats; "
        f"final KL(population ‖ model) {result.divergence[-1]:.3f}"
    )
    print(f"{'series':<22}{'first':>10}{'last':>10}")
    for name, values in result.summary().items():
        print(f"{name:<22}{values['first']:>10.4f}{values['last']:>10.4f}")
    print(f"wrote {png} and {json_path}")
    return 0

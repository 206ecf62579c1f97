"""Entity-side encode throughput (sequences/s) of each scorer, with and without length sorting.

Entities are real WordNet noun synsets (title = first lemma, text = gloss, BLINK layout, 128
tokens max), or synthetic texts of varied length when WordNet is not installed. For each model
(a tiny random BERT, hidden 32, and the packaged all-MiniLM-L6-v2) and each scorer, the same
entities are encoded to what the scorer keeps per entity (index vectors for dual / multi-m / som,
reduced key vectors for poly / genpoly) in batches taken in catalogue order (padded to the batch
maximum) and in length-sorted batches (``length_sorted_batches``). Writes
``benchmarks/results/encoders_throughput.md``.

    python -m benchmarks.encoders_throughput [--entities 1024] [--batch-size 64]
"""

from __future__ import annotations

import argparse
import platform
import random
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm
from transformers import BertConfig, BertTokenizerFast

from benchmarks import harness
from hnce.encoders.biencoder import BiEncoder, build_biencoder, minilm_path
from hnce.encoders.formatting import length_sorted_batches, tokenize_entities

WORDNET_NOUNS = Path("/usr/share/wordnet/data.noun")
SYNTHETIC_WORDS = "entity catalogue mention retrieval index negative sample encoder vector"
SCORERS = ("dual", "multi-8", "som", "poly-16", "genpoly-16-8")


def wordnet_entities(count: int) -> tuple[list[str], list[str], str]:
    """(titles, glosses) of ``count`` noun synsets spread over the file, and a source label."""
    if not WORDNET_NOUNS.is_file():
        rng = random.Random(0)
        words = SYNTHETIC_WORDS.split()
        texts = [" ".join(rng.choices(words, k=rng.randint(5, 150))) for _ in range(count)]
        return [f"entity {i}" for i in range(count)], texts, "synthetic texts of 5-150 words"
    synsets = []
    with WORDNET_NOUNS.open(encoding="utf-8") as lines:
        for line in lines:
            if line.startswith("  ") or " | " not in line:
                continue
            fields, gloss = line.split(" | ", 1)
            synsets.append((fields.split()[4].replace("_", " "), gloss.strip()))
    step = max(1, len(synsets) // count)
    chosen = synsets[::step][:count]
    return [t for t, _ in chosen], [g for _, g in chosen], f"WordNet noun synsets ({WORDNET_NOUNS})"


def tiny_tokenizer(directory: Path, titles: list[str], texts: list[str]) -> BertTokenizerFast:
    words = sorted({w for text in titles + texts for w in text.lower().replace(";", " ").split()})
    special = ["[PAD]", "[unused0]", "[unused1]", "[unused2]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    (directory / "vocab.txt").write_text("\n".join(special + words[:5000]) + "\n")
    return BertTokenizerFast(vocab=str(directory / "vocab.txt"))


def entity_side(model: BiEncoder) -> Callable[[torch.Tensor, torch.Tensor], object]:
    """What a refresh computes per entity batch for this scorer."""
    if model.scorer.indexable:
        return model.entity_index_vectors

    def reduced(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> object:
        hidden, mask = model.encode_entities(input_ids, attention_mask)
        return model.scorer.reduce_entities(hidden, mask)

    return reduced


def padded_positions(batch: dict[str, torch.Tensor], order: list[np.ndarray]) -> int:
    """Token positions computed over the batches in ``order``, each padded to its longest row."""
    return sum(int(batch["attention_mask"][rows].sum(1).max()) * len(rows) for rows in order)


def encode_batches(
    encode: Callable[[torch.Tensor, torch.Tensor], object],
    batch: dict[str, torch.Tensor],
    order: list[np.ndarray],
) -> None:
    """``encode`` every batch of ``order``, each cut to its longest row."""
    with torch.inference_mode():
        for rows in order:
            width = int(batch["attention_mask"][rows].sum(1).max())
            encode(batch["input_ids"][rows, :width], batch["attention_mask"][rows, :width])


def parse_args() -> argparse.Namespace:
    """The command line options."""
    parser = harness.arguments(
        __doc__, "encoders_throughput", entities=1024, batch_size=64, entity_length=128, repeats=3
    )
    return harness.parse(parser)


def model_builders(
    directory: Path, titles: list[str], texts: list[str]
) -> list[tuple[str, Callable[[str], BiEncoder]]]:
    """(name, build from a scorer spec) of each model: a tiny random BERT with a vocabulary of
    the entities' words (kept under ``directory``) and the packaged all-MiniLM-L6-v2."""
    tokenizer = tiny_tokenizer(directory, titles, texts)
    config = BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
    )
    return [
        (
            "tiny BERT (h32, 2 layers)",
            lambda spec: build_biencoder(config, spec, tokenizer=tokenizer),
        ),
        ("all-MiniLM-L6-v2", lambda spec: build_biencoder(minilm_path(), spec)),
    ]


def measure_scorer(
    model: BiEncoder, titles: list[str], texts: list[str], args: argparse.Namespace
) -> tuple[float, float, float, float]:
    """Sequences/s unsorted and length-sorted (the best of ``args.repeats`` runs of each, the
    two orders alternating so that both see the same drift in the machine's load), the padding
    cut (positions unsorted/sorted) and the mean entity length in tokens."""
    model.entity_length = args.entity_length
    batch = tokenize_entities(model.tokenizer, titles, texts, args.entity_length)
    lengths = batch["attention_mask"].sum(1).numpy()
    in_order = [
        np.arange(i, min(i + args.batch_size, len(lengths)))
        for i in range(0, len(lengths), args.batch_size)
    ]
    by_length = length_sorted_batches(lengths, args.batch_size)
    encode = entity_side(model)
    encode_batches(encode, batch, [in_order[0], by_length[0]])  # warm-up
    seconds = harness.alternated_best(
        {
            "unsorted": lambda: encode_batches(encode, batch, in_order),
            "sorted": lambda: encode_batches(encode, batch, by_length),
        },
        args.repeats,
    )
    padding_cut = padded_positions(batch, in_order) / padded_positions(batch, by_length)
    plain, sorted_ = len(lengths) / seconds["unsorted"], len(lengths) / seconds["sorted"]
    return plain, sorted_, padding_cut, float(lengths.mean())


def measure_all(
    titles: list[str], texts: list[str], args: argparse.Namespace
) -> tuple[list[str], float]:
    """One table row per model and scorer, each printed as it is measured, and the mean entity
    length (tokens, under the last model's tokenizer)."""
    rows: list[str] = []
    with tempfile.TemporaryDirectory() as scratch:
        for model_name, make in model_builders(Path(scratch), titles, texts):
            for spec in tqdm(SCORERS, desc=model_name):
                torch.manual_seed(0)
                model = make(spec).eval()
                plain, sorted_, padding_cut, mean_length = measure_scorer(
                    model, titles, texts, args
                )
                rows.append(
                    f"| {model_name} | {spec} | {plain:,.0f} | {sorted_:,.0f} | {sorted_ / plain:.2f}x "
                    f"| {padding_cut:.2f}x |"
                )
                print(rows[-1], flush=True)
    return rows, mean_length


def header_lines(args: argparse.Namespace, source: str, mean_length: float) -> list[str]:
    """The result file's title, setting and table header."""
    return [
        "# Encoder throughput: entity side per scorer",
        "",
        f"{args.entities} entities from {source}; BLINK entity layout, max {args.entity_length} tokens "
        f"(mean {mean_length:.1f}); batch size {args.batch_size}; best of {args.repeats} alternating runs; "
        f"{torch.get_num_threads()} torch threads; "
        f"{platform.processor() or platform.machine()}, torch {torch.__version__}, CPU.",
        "Unsorted = batches in catalogue order padded to the batch maximum; sorted = `length_sorted_batches`.",
        "",
        "| model | scorer | unsorted seq/s | length-sorted seq/s | speed-up | padding cut (positions unsorted/sorted) |",
        "|---|---|---:|---:|---:|---:|",
    ]


def main() -> int:
    args = parse_args()
    titles, texts, source = wordnet_entities(args.entities)
    rows, mean_length = measure_all(titles, texts, args)
    harness.write_result(args.output, header_lines(args, source, mean_length) + rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The token catalogues the plaid benchmark searches (:mod:`benchmarks.plaid_index`): every token
vector of a catalogue, the entity id of each, and the query vectors of a sample of its mentions,
encoded once and kept in the work directory as arrays (the token vectors as float16,
memory-mapped), so exact search, training and building all read the same vectors.

Texts (``--texts``):

- ``wordnet``: the whole WordNet catalogue (Debian's WordNet through the project's converter,
  ``hnce data wordnet``: 117,659 synsets), searched for its test split's mentions (example
  sentences of lemmas training never saw);
- ``foldoc``: FOLDOC's entries (Debian's ``dict-foldoc`` through its converter), searched for
  its test split's mentions (hyperlinks written in held-out entries);
- ``synthetic``: the synthetic KILT generator's catalogue of up to 128 tokens an entity (the
  full-scale benchmark's first stages), its test mentions.

Models (``--models``): real text is encoded by all-MiniLM-L6-v2 as the project resolves
``model.path: minilm``, under configs/demo.yaml's model section with ``model.scorer.name: som``
(the pipeline's :func:`~hnce.pipeline.recipe_models.build_model`: mean pooling, normalised token
vectors, entities of 32 tokens), ``pretrained`` as it starts training or ``trained``: the
export of ``hnce train`` with that recipe on the demo's WordNet subset at the demo's budget (120
steps of 8 mentions), its negatives version 0 mined with the starting model as
configs/wordnet.yaml mines it (:data:`TRAINING`). The synthetic catalogue is encoded by the tests' tiny random BERT (``tiny``: d = 32, drawn
with σ = 0.5, as ``benchmarks/token_index.py`` explains).

Entities are encoded as the encoder actors encode them (``encode_entities`` over the catalogue's
token store: the som scorer's entity side, ``BiEncoder.entity_index_vectors``), mentions as they
encode theirs (``encode_mention_queries``). ``--entities`` below the catalogue's size keeps a
seeded sample of its entities (renumbered 0..n-1 in catalogue order), and the mentions are then
drawn among those whose gold it kept.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from benchmarks import harness
from benchmarks.fullscale.run import Run
from benchmarks.token_index import mention_queries, prepare, scoring_model
from benchmarks.training_runs import checkpoint_export
from benchmarks.yardstick import convert
from hnce.cluster.compute.entity_encoding import encode_entities, encode_mention_queries
from hnce.cluster.stores.checkpoints import newest_checkpoint
from hnce.cluster.stores.files import AtomicPath
from hnce.cluster.stores.tables import mention_split_path
from hnce.cluster.stores.tables_read import EntityCatalogue, MentionSplit
from hnce.cluster.stores.tokens import TokenStore
from hnce.encoders.biencoder import BiEncoder, load_biencoder
from hnce.pipeline.config import Config, load_config
from hnce.pipeline.demo import demo_dataset
from hnce.pipeline.recipe_models import build_model
from hnce.progress import progress_bar

TEXTS = ("wordnet", "foldoc", "synthetic")
MODELS = {
    "pretrained": "all-MiniLM-L6-v2 as it starts training",
    "trained": "all-MiniLM-L6-v2 after 120 steps of sum-of-max training on the demo's WordNet "
    "subset, version 0 from the starting model",
    "tiny": "the tests' tiny random BERT (d = 32)",
}
#: the recipe whose model section encodes real text, and which trains the ``trained`` model
RECIPE = harness.ROOT / "configs" / "demo.yaml"
#: the ``trained`` model's overrides of the recipe: the som scorer, and version 0 from the
#: starting model (configs/wordnet.yaml's ``negatives.initial: model``). Sum-of-max has no
#: negative cache, so with the demo's random version 0 the payoff trigger never refreshes ("no
#: hard negatives") and mixed-50 draws random negatives for the whole run (measured: 120 steps,
#: negatives version -1 throughout).
TRAINING = {"model.scorer.name": "som", "negatives.initial": "model"}
#: entities encoded at once into the stored token array
ENCODE_CHUNK = 20_000
#: mentions encoded at once
MENTION_BATCH = 64
SAMPLE_SEED = 0


@dataclass(frozen=True)
class TokenCatalogue:
    """A catalogue's token `vectors` (float16 [T, d], memory-mapped), each one's entity `ids`
    (sorted, 0..entities-1), the `queries` [B, Q, d] of its sampled mentions (zero rows:
    padding), and what it is: `text` under `model`, `entities` of the `whole` catalogue's."""

    vectors: np.ndarray
    ids: np.ndarray
    queries: np.ndarray
    entities: int
    whole: int
    text: str
    model: str

    @property
    def tokens(self) -> int:
        return len(self.ids)

    @property
    def title(self) -> str:
        """The catalogue as a table's title names it: text, entities, tokens and model."""
        names = {"wordnet": "WordNet", "foldoc": "FOLDOC", "synthetic": "Synthetic KILT"}
        sampled = "" if self.entities == self.whole else f" (a sample of {self.whole:,})"
        return (
            f"{names[self.text]}, {self.entities:,} entities{sampled}, {self.tokens:,} tokens "
            f"({self.tokens / self.entities:.1f} an entity); {self.model}: {MODELS[self.model]}"
        )


def token_catalogue(args, text: str, model: str) -> TokenCatalogue:
    """`text` under `model`, encoded the first time and read after (module docstring)."""
    if text == "synthetic":
        if model != "tiny":
            raise SystemExit(f"--models: the synthetic catalogue is encoded by tiny, not {model}")
        return synthetic_catalogue(args)
    if model == "tiny":
        raise SystemExit(f"--models: {text} is encoded by pretrained or trained, not tiny")
    config = demo_config(args.work_dir)
    data = text_dataset(config, text)
    stem = args.work_dir / f"{text}-{model}-{args.entities or 'all'}"
    paths = stored_paths(stem, args.mentions)
    if not all(path.is_file() for path in paths.values()):
        encoder = som_model(config, model)
        tokens = TokenStore.ensure(data, encoder.tokenizer, encoder.entity_length)
        kept = sampled_entities(len(tokens), args.entities)
        store(paths, encoder, tokens, kept, lambda: mention_sample(encoder, data, kept, args))
    whole = len(EntityCatalogue.open(data))
    return read_catalogue(paths, whole, text, model)


def synthetic_catalogue(args) -> TokenCatalogue:
    """The first ``--entities`` of the synthetic catalogue of ``--catalogue`` entities (encoded
    whole once: its prefixes are read from the one array) under the tiny model, with its first
    ``--mentions`` test mentions."""
    run = Run(args.work_dir, args.catalogue, 128, 32, 2, "auto").load()
    prepare(run)
    paths = stored_paths(run.workdir / f"som-tiny-{args.catalogue}", args.mentions)
    if not all(path.is_file() for path in paths.values()):
        model, tokens = scoring_model(run, "tiny", "som")
        every = np.arange(args.catalogue, dtype=np.int64)
        store(paths, model, tokens, every, lambda: mention_queries(run, model, args.mentions))
    whole = read_catalogue(paths, args.catalogue, "synthetic", "tiny")
    entities = args.entities or args.catalogue
    if entities > args.catalogue:
        raise SystemExit(f"--entities {entities} exceeds --catalogue {args.catalogue}")
    rows = int(np.searchsorted(whole.ids, entities))
    vectors, ids = whole.vectors[:rows], whole.ids[:rows]
    return TokenCatalogue(vectors, ids, whole.queries, entities, entities, "synthetic", "tiny")


@functools.cache
def demo_config(work: Path) -> Config:
    """configs/demo.yaml with the som scorer, run under `work`, on the demo's WordNet subset
    (the whole WordNet dataset converted beside it the first time; the subset cut once a
    process)."""
    config, _ = demo_dataset(
        load_config(
            RECIPE, [f"run.dir={work}", f"model.scorer.name={TRAINING['model.scorer.name']}"]
        )
    )
    return config


def text_dataset(config: Config, text: str) -> Path:
    """The whole converted dataset of `text`: the demo's WordNet conversion (the one its subset,
    and so the training, came from) or FOLDOC's, converted once under the work directory."""
    if text == "wordnet":
        return config.run_dir / "wordnet"
    data = config.run_dir / f"source-{text}"
    convert(text, data)
    return data


def som_model(config: Config, model: str) -> BiEncoder:
    """MiniLM under the recipe's som model section, pretrained or trained (module docstring),
    in eval mode."""
    if model == "pretrained":
        return build_model(config).eval()
    return load_biencoder(trained_export(config))


def trained_export(config: Config) -> Path:
    """The export of the recipe's last checkpoint after ``hnce train`` on the demo subset
    (trained the first time, in ``<work>/som-training``)."""
    run_dir = config.run_dir / "som-training"
    newest = newest_checkpoint(run_dir) if run_dir.is_dir() else None
    if newest is None or newest[0] < config.training.steps:
        overrides = {"run.dir": run_dir, "data.root": config.data.root, **TRAINING}
        command = harness.run_recipe("train", RECIPE, overrides, log=config.run_dir / "train.log")
        print(f"hnce train (som, {config.training.steps} steps): {command.seconds:.0f} s")
    return checkpoint_export(run_dir)


def sampled_entities(catalogue: int, entities: int) -> np.ndarray:
    """Every entity id, or a seeded sample of `entities` of them, sorted."""
    if not entities or entities >= catalogue:
        return np.arange(catalogue, dtype=np.int64)
    rng = np.random.default_rng(SAMPLE_SEED)
    return np.sort(rng.choice(catalogue, entities, replace=False)).astype(np.int64)


def mention_sample(encoder: BiEncoder, data: Path, kept: np.ndarray, args) -> np.ndarray:
    """Query vectors [B, Q, d] of a seeded sample of ``--mentions`` of the test split's mentions
    (those whose gold the catalogue `kept`)."""
    catalogue = set(kept.tolist())
    mentions = MentionSplit.open(mention_split_path(data, "test")).read_all()
    mentions = [m for m in mentions if m.gold in catalogue]
    if len(mentions) < args.mentions:
        raise SystemExit(f"{data}: {len(mentions)} test mentions, --mentions {args.mentions}")
    rng = np.random.default_rng(SAMPLE_SEED)
    chosen = [mentions[i] for i in np.sort(rng.choice(len(mentions), args.mentions, False))]
    parts = [
        encode_mention_queries(
            encoder,
            [m.context_left for m in batch],
            [m.mention for m in batch],
            [m.context_right for m in batch],
        )
        for batch in (
            chosen[start : start + MENTION_BATCH] for start in range(0, len(chosen), MENTION_BATCH)
        )
    ]
    width = max(part.shape[1] for part in parts)
    return np.concatenate([np.pad(p, ((0, 0), (0, width - p.shape[1]), (0, 0))) for p in parts])


def stored_paths(stem: Path, mentions: int) -> dict[str, Path]:
    """The arrays of a stored catalogue: its token vectors, their entity ids, its queries."""
    names = {"vectors": "vectors", "ids": "ids", "queries": f"queries-{mentions}"}
    return {name: Path(f"{stem}.{suffix}.npy") for name, suffix in names.items()}


def store(paths: dict[str, Path], model: BiEncoder, tokens: TokenStore, kept, queries) -> None:
    """Every token vector of the entities `kept` (renumbered 0..n-1) encoded by `model` into a
    float16 array, chunk by chunk, with their entity ids, and `queries()`; each file published
    whole (a stopped run leaves none half written)."""
    if not paths["vectors"].is_file() or not paths["ids"].is_file():
        total = int(np.asarray(tokens.lengths[kept], dtype=np.int64).sum())
        ids, row = [], 0
        with AtomicPath(paths["vectors"]) as temporary:
            vectors = np.lib.format.open_memmap(
                temporary, "w+", np.float16, (total, model.output_size)
            )
            for start in progress_bar(range(0, len(kept), ENCODE_CHUNK), desc="encoding"):
                chunk = kept[start : start + ENCODE_CHUNK]
                encoded, chunk_ids, _ = encode_entities(model, tokens, chunk, 256)
                vectors[row : row + len(encoded)] = encoded
                ids.append(np.searchsorted(kept, chunk_ids))
                row += len(encoded)
            if row != total:
                raise RuntimeError(f"encoded {row} token vectors, expected {total}")
            vectors.flush()
            del vectors
        save(paths["ids"], np.concatenate(ids))
    save(paths["queries"], queries())


def save(path: Path, array: np.ndarray) -> None:
    with AtomicPath(path) as temporary, open(temporary, "wb") as handle:
        np.save(handle, array)


def read_catalogue(paths: dict[str, Path], whole: int, text: str, model: str) -> TokenCatalogue:
    """The stored arrays of `paths` as a catalogue of `whole`'s entities."""
    ids = np.load(paths["ids"])
    vectors = np.load(paths["vectors"], mmap_mode="r")
    queries = np.load(paths["queries"])
    return TokenCatalogue(vectors, ids, queries, int(ids[-1]) + 1, whole, text, model)

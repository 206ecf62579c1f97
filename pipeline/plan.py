"""Memory per process for a recipe (``hnce plan``): a trainer worker and an index shard holder.

Per trainer worker, for the model of the recipe's task (the retriever's two towers, or the
reranker's encoder) trained by DeepSpeed with ZeRO stage z over N = ``num_workers`` ranks:

- **model states** (the ZeRO paper's accounting, Rajbhandari et al. 2020 §3): mixed precision
  (bf16 on a GPU) keeps 2 B of parameters and 2 B of gradients per parameter and 12 B of
  optimizer state (fp32 master copy, Adam m and v); fp32 (a CPU) keeps 4 + 4 + 8 B. ZeRO-1
  partitions the optimizer states over N ranks, ZeRO-2 the gradients too, ZeRO-3 also the
  parameters. ZeRO-2/3 add DeepSpeed's communication buckets (5e8 elements each for reduce and
  all-gather by default).
- **activations** of one micro-batch (Korthikanti et al. 2022, eq. 1, with the element size a
  parameter): per transformer layer and sequence of s tokens, 16·s·h elements plus 2·a·s²
  attention probabilities, and 2·s·h + a·s² bytes of dropout masks; fused attention (SDPA
  flash / memory-efficient kernels, on a GPU) keeps no s² term; the backward pass adds
  gradients as large as one layer's activations. Activation checkpointing keeps each layer's
  input (s·h) and recomputes one layer at a time; candidate chunks keep only what the scorer
  reads of each candidate and recompute one chunk at a time. Checked on CPU against measured
  peaks of real steps (``benchmarks/plan_memory.py``).

Per index shard holder: ``refresh.shard_size`` entities x vectors per entity x bytes per vector,
which is the dimension x (2 B fp16 on a GPU, 4 B fp32 on a CPU) for a flat index, and for
``ivfpq`` the list code (``pq_m`` B) and its 8-byte id, plus, for sum-of-max, the standalone code
rescoring decodes (``pq_m`` B and the list number); for ``plaid`` the token's code (centroid id
and ``pq_m`` B of residual), its 8-byte id and at most 8 B of the centroid → entity inverse,
plus the version's quantiser once a holder; the whole index is the catalogue's worth. A
compressed multi-m index (``ivfpq``, ``hnsw``), and a compressed sum-of-max index with
``index.token_copy`` in place of its standalone codes, keeps a float16 copy of its vectors on
disk, memory-mapped and read for the candidates only: listed apart, as disk, not memory.

Example::

    plan = plan_memory(load_config(Path("configs/aida-blink.yaml")), "retriever", 5_903_530)
    print(plan.format())
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModel, BertConfig, PretrainedConfig

from hnce.cluster.stores.tables_read import EntityCatalogue
from hnce.encoders.biencoder import SCORER_FILE, read_description
from hnce.encoders.local import load_local, model_files
from hnce.encoders.scorers import ScorerConfig, build_scorer
from hnce.pipeline.config import Config
from hnce.pipeline.preflight import model_directory
from hnce.pipeline.run import TaskKind

GIB = 1024**3
#: FAISS keeps a 64-bit id beside every code in an IVF list
IVF_ID_BYTES = 8
#: a plaid shard's inverse in memory, a token at most: its centroid (int32) and one entity
#: slot (int32) a distinct (centroid, entity) pair (``hnce.cluster.stores.plaid``)
PLAID_INVERSE_BYTES = 8
#: a centroid's links in the plaid quantiser's HNSW graph (2·M int32 on its base level, M = 32,
#: and the upper levels' few)
PLAID_LINK_BYTES = 272


def plaid_token_bytes(centroids: int, pq_m: int) -> int:
    """Bytes a plaid token costs a holder: its code (centroid id in FAISS's coarse code, then the
    residual's ``pq_m`` bytes), its int64 entity id and its share of the inverse, at most."""
    return math.ceil(math.log2(centroids) / 8) + pq_m + IVF_ID_BYTES + PLAID_INVERSE_BYTES


# DeepSpeed's default reduce and all-gather bucket sizes (elements) under ZeRO-2/3.
ZERO_BUCKET_ELEMENTS = 5 * 10**8
# BLINK's bi-encoder, biencoder_wiki_large.bin: bert-large-uncased (docs/input-formats.md), for recipes
# whose towers come from a BLINK checkpoint (model.path: blink) planned without its base model.
BLINK_ARCHITECTURE = BertConfig(
    vocab_size=30522,
    hidden_size=1024,
    num_hidden_layers=24,
    num_attention_heads=16,
    intermediate_size=4096,
    max_position_embeddings=512,
)


@dataclass(frozen=True)
class Encoder:
    """The shape of one transformer tower."""

    parameters: int
    hidden: int
    layers: int
    heads: int

    @classmethod
    def from_config(cls, config: PretrainedConfig) -> Encoder:
        """Parameters counted on the meta device (nothing allocated), shape from the config."""
        with model_files(Path(config.name_or_path), "AutoModel"), torch.device("meta"):
            model = AutoModel.from_config(config)
        return cls(
            parameters=sum(p.numel() for p in model.parameters()),
            hidden=int(config.hidden_size),
            layers=int(config.num_hidden_layers),
            heads=int(config.num_attention_heads),
        )

    def layer_bytes(self, sequences: int, length: int, element: int, fused: bool) -> int:
        """Activations one layer keeps for its backward pass (Korthikanti et al. 2022 eq. 1)."""
        tokens = sequences * length * self.hidden
        scores = 0 if fused else sequences * self.heads * length * length
        return (16 * tokens + 2 * scores) * element + 2 * tokens + scores

    def tower_bytes(
        self, sequences: int, length: int, element: int, fused: bool, checkpointing: bool
    ) -> int:
        """Peak activations of the tower over ``sequences`` x ``length`` tokens, plus the
        embeddings and the output: every layer's, and gradients as large as one layer's while
        the backward pass starts; with activation checkpointing each layer's input and one
        layer recomputed at a time (its activations freed as its backward proceeds)."""
        tokens = sequences * length * self.hidden
        edges = 3 * tokens * element + tokens  # embeddings (sum, LayerNorm, dropout mask), output
        layer = self.layer_bytes(sequences, length, element, fused)
        if checkpointing:
            return edges + self.layers * tokens * element + layer
        return edges + (self.layers + 1) * layer


@dataclass(frozen=True)
class MemoryLine:
    """One figure of a plan: what, how it is counted, bytes."""

    name: str
    detail: str
    size: int


@dataclass
class MemoryPlan:
    """Per-process figures of a recipe; :meth:`format` is what ``hnce plan`` prints."""

    title: str
    trainer: list[MemoryLine]
    index: list[MemoryLine]

    @property
    def trainer_total(self) -> int:
        return sum(line.size for line in self.trainer)

    def format(self) -> str:
        lines = [self.title, "per trainer worker:"]
        lines += [_row(line) for line in self.trainer]
        lines.append(_row(MemoryLine("total", "", self.trainer_total)))
        lines.append("per index shard holder:")
        lines += [_row(line) for line in self.index]
        return "\n".join(lines)


def _row(line: MemoryLine) -> str:
    return f"  {line.name:<18} {line.size / GIB:9.2f} GiB  {line.detail}"


def model_states(
    parameters: int, stage: int, ranks: int, mixed_precision: bool
) -> list[MemoryLine]:
    """Parameters, gradients, optimizer states (and ZeRO buckets) of one rank."""
    weight, optimizer = (2, 12) if mixed_precision else (4, 8)
    shares = {
        "parameters": ranks if stage >= 3 else 1,
        "gradients": ranks if stage >= 2 else 1,
        "optimizer states": ranks if stage >= 1 else 1,
    }
    per_parameter = {"parameters": weight, "gradients": weight, "optimizer states": optimizer}
    kinds = {
        "parameters": "bf16" if mixed_precision else "fp32",
        "gradients": "bf16" if mixed_precision else "fp32",
        "optimizer states": "fp32 master, Adam m, v" if mixed_precision else "Adam m, v",
    }
    lines = []
    for name, share in shares.items():
        detail = f"{parameters / 1e6:.1f}M x {per_parameter[name]} B ({kinds[name]})"
        if share > 1:
            detail += f" / {share} ranks (ZeRO-{stage})"
        lines.append(MemoryLine(name, detail, math.ceil(parameters * per_parameter[name] / share)))
    if stage >= 2:
        buckets = 2 * ZERO_BUCKET_ELEMENTS * weight
        lines.append(MemoryLine("ZeRO buckets", "reduce + all-gather, 5e8 elements each", buckets))
    return lines


def entity_vectors_kept(scorer: ScorerConfig, entity_length: int) -> int:
    """Vectors per candidate the scorer reads (what a candidate chunk keeps): [CLS] for dual,
    m for multi, m' for (gen)poly, every token for som; the general form's key count."""
    general = scorer.general_equivalent()
    if general.query_side == "mention":
        reduction, count = general.key_reduction, general.m_prime or general.m
    else:
        reduction, count = general.query_reduction, general.m
    return entity_length if reduction == "all" else count


def tower_configs(config: Config, kind: TaskKind) -> list[PretrainedConfig]:
    """The towers' architectures: the retriever's mention and entity towers, or the reranker's
    encoder, from their local directories (no weights read)."""
    if kind == "reranker":
        path = model_directory(config, "rerank.model", config.rerank.model)
        return [load_local(AutoConfig, path)]
    if config.model.path == "blink" and config.blink.base_model is None:
        return [BLINK_ARCHITECTURE, BLINK_ARCHITECTURE]
    if config.model.path == "blink":
        base = load_local(AutoConfig, Path(str(config.blink.base_model)))
        return [base, base]
    path = model_directory(config, "model.path", config.model.path)
    if (path / "scorer.json").is_file():
        return [load_local(AutoConfig, path / "mention"), load_local(AutoConfig, path / "entity")]
    tower = load_local(AutoConfig, path)
    return [tower, tower]


def activation_lines(
    config: Config, kind: TaskKind, towers: Sequence[Encoder], element: int, fused: bool
) -> list[MemoryLine]:
    """Activations of one micro-batch, tower by tower."""
    settings = config.training if kind == "retriever" else config.reranker_training()
    batch, chunk = settings.batch_size, settings.candidate_chunk_size
    model = config.model
    checkpointing = model.activation_checkpointing
    if kind == "reranker":
        pairs = batch * config.rerank.num_candidates
        length = model.mention_length + model.entity_length - 1  # BLINK's pair layout
        return [
            _chunked_tower(
                "pair encoder", towers[0], pairs, length, chunk, 0, checkpointing, element, fused
            )
        ]
    mention, entity = towers
    candidates = batch * (1 + config.negatives.num_negatives)
    kept = entity_vectors_kept(model.scorer, model.entity_length) * entity.hidden * element
    mentions = mention.tower_bytes(batch, model.mention_length, element, fused, checkpointing)
    return [
        MemoryLine(
            "mention tower",
            f"{batch} x {model.mention_length} tokens{_checkpointed(checkpointing)}",
            mentions,
        ),
        _chunked_tower(
            "candidate tower",
            entity,
            candidates,
            model.entity_length,
            chunk,
            kept,
            checkpointing,
            element,
            fused,
        ),
    ]


def _checkpointed(checkpointing: bool) -> str:
    return ", activation checkpointing" if checkpointing else ""


def _chunked_tower(
    name: str,
    tower: Encoder,
    sequences: int,
    length: int,
    chunk: int,
    kept_per_sequence: int,
    checkpointing: bool,
    element: int,
    fused: bool,
) -> MemoryLine:
    """A tower over ``sequences``, all at once or in recomputed chunks keeping
    ``kept_per_sequence`` bytes of output per sequence."""
    detail = f"{sequences} x {length} tokens{_checkpointed(checkpointing)}"
    if 0 < chunk < sequences:
        peak = tower.tower_bytes(chunk, length, element, fused, checkpointing)
        detail += f", chunks of {chunk}"
        return MemoryLine(name, detail, sequences * kept_per_sequence + peak)
    return MemoryLine(
        name, detail, tower.tower_bytes(sequences, length, element, fused, checkpointing)
    )


def vector_width(config: Config, towers: Sequence[Encoder]) -> int:
    """d of the vectors the scorer sees and the index stores: ``model.projection_size`` when set,
    else the entity tower's width."""
    return config.model.projection_size or towers[-1].hidden


def index_lines(
    config: Config, towers: Sequence[Encoder], entities: int, on_gpu: bool
) -> list[MemoryLine]:
    """A shard holder's and the whole index's vectors for the retriever's scorer."""
    scorer = config.model.scorer
    per_entity = entity_vectors_kept(scorer, config.model.entity_length)
    bound = " (som: at most one per token)" if scorer.name == "som" else ""
    dimension = vector_width(config, towers)
    index = config.index
    if index.kind == "ivfpq":
        codes = index.pq_m + IVF_ID_BYTES
        if scorer.name == "som" and not index.token_copy:
            codes += index.pq_m + math.ceil(math.log2(index.nlist) / 8)
        per_vector = codes * per_entity
        detail = f"x {per_entity} vectors x {codes} B (ivfpq codes){bound}"
    elif index.kind == "plaid":
        codes = plaid_token_bytes(index.nlist, index.pq_m)
        per_vector = codes * per_entity
        detail = (
            f"x {per_entity} vectors x {codes} B (plaid: centroid id + {index.pq_m} B residual "
            f"code + {IVF_ID_BYTES} B id + at most {PLAID_INVERSE_BYTES} B of the inverse){bound}"
        )
    else:
        element, kind = (2, "fp16") if on_gpu else (4, "fp32")
        per_vector = dimension * per_entity * element
        detail = f"x {dimension} dims x {per_entity} vectors x {element} B ({kind}){bound}"
    shard = min(config.refresh.shard_size, entities)
    lines = [
        MemoryLine("shard", f"{shard:,} entities {detail}", shard * per_vector),
        MemoryLine("whole index", f"{entities:,} entities {detail}", entities * per_vector),
    ]
    if index.kind == "plaid":
        lines.append(
            MemoryLine(
                "plaid quantiser",
                f"{index.nlist:,} centroids x ({dimension} dims x 4 B + HNSW links "
                f"{PLAID_LINK_BYTES} B), once a holder however many shards it holds",
                index.nlist * (4 * dimension + PLAID_LINK_BYTES),
            )
        )
    if (scorer.name == "multi" and config.index.kind != "flat") or config.index.token_copy:
        copy = f"{entities:,} entities x {dimension} dims x {per_entity} vectors x 2 B (fp16)"
        lines.append(
            MemoryLine(
                "vector copy",
                f"{copy} on disk, memory-mapped: candidates are rescored from it",
                entities * dimension * per_entity * 2,
            )
        )
    return lines


def cache_line(
    config: Config, towers: Sequence[Encoder], entities: int, element: int
) -> MemoryLine:
    """The trainer's negative cache (``negatives.cache``, ``hnce.mining.negative_cache``): every
    entity's reduced vectors, its step and flag; on each worker, on its device (the training
    domains' entities at most: the whole catalogue is the bound stated), at the training's
    precision (``element`` bytes: bfloat16 in mixed precision, else float32)."""
    scorer = config.model.scorer
    per_entity = entity_vectors_kept(scorer, config.model.entity_length)
    dimension = vector_width(config, towers)
    dtype = "bfloat16" if element == 2 else "float32"
    detail = (
        f"{entities:,} entities x {dimension} dims x {per_entity} vectors x {element} B ({dtype})"
    )
    return MemoryLine("negative cache", detail, entities * (per_entity * dimension * element + 9))


def catalogue_size(config: Config) -> int | None:
    """Entities in ``data.root``'s catalogue, or None when it has not been converted yet."""
    root = Path(config.data.root)
    if not (root / "entities").is_dir():
        return None
    return len(EntityCatalogue.open(root))


def plan_memory(config: Config, kind: TaskKind, entities: int) -> MemoryPlan:
    """The per-process memory of ``config``'s ``kind`` task over a catalogue of ``entities``."""
    settings = config.training if kind == "retriever" else config.reranker_training()
    on_gpu = config.cluster.use_gpu
    mixed = on_gpu and settings.precision != "fp32"
    element = 2 if mixed else 4
    towers = [Encoder.from_config(tower) for tower in tower_configs(config, kind)]
    shared = towers_shared(config, kind)
    scorer_parameters = _scorer_parameters(config, kind, towers, shared)
    parameters = sum(t.parameters for t in towers[: 1 if shared else None]) + scorer_parameters
    states = model_states(parameters, settings.zero_stage, settings.num_workers, mixed)
    fused = on_gpu  # SDPA's fused kernels on CUDA; the math path on a CPU
    trainer = states + activation_lines(config, kind, towers, element, fused)
    if kind == "retriever" and config.negatives.cache.enabled:
        trainer.append(cache_line(config, towers, entities, element))
    device = "GPU (bf16)" if mixed else ("GPU (fp32)" if on_gpu else "CPU (fp32)")
    title = (
        f"{kind}: {settings.num_workers} worker(s), ZeRO-{settings.zero_stage}, {device}, "
        f"micro-batch {settings.batch_size}, {entities:,} entities"
        + (", one tower for both sides" if shared else "")
    )
    return MemoryPlan(title, trainer, index_lines(config, towers, entities, on_gpu))


def _scorer_parameters(
    config: Config, kind: TaskKind, towers: Sequence[Encoder], shared: bool
) -> int:
    """Weights outside the towers: the scorer's (codes) and the projections
    (``model.projection_size``; one when the towers are one), or the reranker's linear head."""
    if kind == "reranker":
        return towers[0].hidden + 1
    hidden, projected = towers[-1].hidden, config.model.projection_size
    with torch.device("meta"):
        scorer = build_scorer(config.model.scorer, vector_width(config, towers))
    sides = 1 if shared else 2
    projections = 0 if projected is None else sides * (hidden + 1) * projected
    return sum(p.numel() for p in scorer.parameters()) + projections


def towers_shared(config: Config, kind: TaskKind) -> bool:
    """Whether the retriever's mention and entity towers are one module: ``model.shared_towers``,
    or, unset, what a bi-encoder export in ``model.path`` says (``scorer.json``)."""
    if kind == "reranker" or config.model.path == "blink":
        return False
    if config.model.shared_towers is not None:
        return config.model.shared_towers
    export_dir = model_directory(config, "model.path", config.model.path)
    if not (export_dir / SCORER_FILE).is_file():
        return False
    return read_description(export_dir).shared_towers


def describe(plan: MemoryPlan) -> str:
    """The plan as JSON (for scripts)."""
    return json.dumps(
        {
            "title": plan.title,
            "trainer": {line.name: line.size for line in plan.trainer},
            "trainer_total": plan.trainer_total,
            "index": {line.name: line.size for line in plan.index},
        },
        indent=2,
    )

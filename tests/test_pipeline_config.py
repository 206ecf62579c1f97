"""The one settings tree: every error names the key and where it was set, before any work."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
import torch
import yaml

from hnce.pipeline.config import ConfigError, config_from_dict, dump_config, load_config

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
DEMO = CONFIGS / "demo.yaml"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "recipe.yaml"
    path.write_text(text)
    return path


def _leaves(tree: dict, prefix: str = "") -> list[tuple[str, object]]:
    out = []
    for key, value in tree.items():
        if isinstance(value, dict):
            out.extend(_leaves(value, f"{prefix}{key}."))
        else:
            out.append((f"{prefix}{key}", value))
    return out


@pytest.mark.parametrize("recipe", sorted(CONFIGS.glob("*.yaml")), ids=lambda p: p.name)
def test_every_recipe_loads_and_every_written_key_takes_effect(recipe: Path) -> None:
    config = load_config(recipe)
    assert config_from_dict(config.to_dict()) == config
    for key, written in _leaves(yaml.safe_load(recipe.read_text())):
        value: object = config
        for part in key.split("."):
            value = getattr(value, part)
        assert value == written, key


def test_values_and_overrides(tmp_path: Path) -> None:
    path = write(
        tmp_path, "training:\n  steps: 50\n  learning_rate: 1\nnegatives:\n  sampler: hard\n"
    )
    config = load_config(path, ["training.steps=7", "loss.name=focal", "loss.temperature=0.5"])
    assert config.training.steps == 7
    assert config.training.learning_rate == 1.0 and isinstance(config.training.learning_rate, float)
    assert config.negatives.sampler == "hard"
    assert (config.loss.name, config.loss.temperature) == ("focal", 0.5)


def test_unknown_key_names_key_file_and_line(tmp_path: Path) -> None:
    path = write(tmp_path, "run:\n  seed: 1\ntraining:\n  steps: 5\n  stpes: 9\n")
    with pytest.raises(ConfigError) as error:
        load_config(path)
    assert f"{path}:5: unknown key 'training.stpes'" in str(error.value)


def test_unknown_section(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="unknown key 'trainer'"):
        load_config(write(tmp_path, "trainer:\n  steps: 5\n"))


def test_wrong_type_names_key_and_line(tmp_path: Path) -> None:
    path = write(tmp_path, "training:\n  steps: many\n")
    with pytest.raises(ConfigError) as error:
        load_config(path)
    assert f"{path}:2: 'training.steps': Input should be a valid integer" in str(error.value)


def test_duplicate_keys_name_both_lines(tmp_path: Path) -> None:
    path = write(
        tmp_path, "training:\n  steps: 5\nrefresh:\n  enabled: true\ntraining:\n  steps: 9\n"
    )
    with pytest.raises(ConfigError) as error:
        load_config(path)
    assert f"{path}:5: duplicate key 'training' (first given at line 1)" in str(error.value)
    nested = write(tmp_path, "training:\n  steps: 5\n  log_every: 2\n  steps: 6\n")
    with pytest.raises(ConfigError, match=r":4: duplicate key 'steps' \(first given at line 2\)"):
        load_config(nested)


@pytest.mark.parametrize(
    ("line", "key"),
    [
        ("training:\n  steps: -5\n", "training.steps"),
        ("negatives:\n  num_negatives: -1\n", "negatives.num_negatives"),
        ("training:\n  cpus_per_worker: -2\n", "training.cpus_per_worker"),
        ("refresh:\n  encoder_cpus: 0\n", "refresh.encoder_cpus"),
        ("run:\n  dir: runs/../../etc\n", "run.dir"),
        ("index:\n  nlist: 16\n  nprobe: 32\n", "index.nprobe"),
        ("eval:\n  ks: [1, 0]\n", "eval.ks[1]"),
        ("negatives:\n  mixed: {hard_fraction: 1.5}\n", "negatives.mixed.hard_fraction"),
    ],
)
def test_range_and_value_errors_name_file_and_line(tmp_path: Path, line: str, key: str) -> None:
    path = write(tmp_path, "data:\n  root: x\n" + line)
    with pytest.raises(ConfigError) as error:
        load_config(path)
    last_line = 2 + line.count("\n")
    assert f"{path}:{last_line}: '{key}'" in str(error.value)


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("training.steps=ten", "training.steps"),
        ("training.steps=true", "training.steps"),
        ("eval.ks=[1, x]", "eval.ks[1]"),
        ("model.scorer=dual", "model.scorer"),
        ("refresh.enabled=3", "refresh.enabled"),
        ("training.zero_stage=5", "training.zero_stage"),
        ("training.batch_size=0", "training.batch_size"),
        ("cluster.adress=auto", "cluster.adress"),
        ("negatives.sampler=lexical", "negatives.sampler"),
        ("negatives.sampler=hardest", "negatives.sampler"),
        ("loss.name=hinge", "loss"),
        ("index.faiss_device=tpu", "index.faiss_device"),
        ("refresh.shard_size=0", "refresh.shard_size"),
        ("loss.temperature=0", "loss.temperature"),
        ("refresh.top_n=4", "refresh.top_n"),
        ("training.keep_deepspeed_state=oldest", "training.keep_deepspeed_state"),
    ],
)
def test_bad_override_names_key_and_the_override(override: str, key: str) -> None:
    with pytest.raises(ConfigError) as error:
        load_config(None, [override])
    assert f"'{key}" in str(error.value)
    assert f"--set {override}" in str(error.value)


@pytest.mark.parametrize("scorer", ["poly", "genpoly"])
def test_scorers_mined_exactly_accept_the_index_source_with_flat_shards(scorer: str) -> None:
    """The mining mode is asked of the scorer; only an approximate index kind is refused."""
    config = load_config(None, [f"model.scorer.name={scorer}", "negatives.source=index"])
    assert not config.model.scorer.indexable and config.model.scorer.mining == "exact"
    assert load_config(None, ["model.scorer.name=dual"]).model.scorer.mining == "index"
    with pytest.raises(ConfigError) as error:
        load_config(None, [f"model.scorer.name={scorer}", "index.kind=ivfpq"])
    assert "'index.kind'" in str(error.value) and "flat" in str(error.value)


def test_sum_of_max_takes_flat_or_compressed_shards_but_not_hnsw() -> None:
    """Sum-of-max rescores from token vectors: a flat shard stores them, an ivfpq one decodes
    them from its codes, HNSW has neither."""
    for kind in ("flat", "ivfpq"):
        assert load_config(None, ["model.scorer.name=som", f"index.kind={kind}"]).index.kind == kind
    with pytest.raises(ConfigError, match=r"'index.kind'.*not from HNSW"):
        load_config(None, ["model.scorer.name=som", "index.kind=hnsw"])


def test_a_token_copy_is_only_for_compressed_sum_of_max() -> None:
    """index.token_copy chooses what a compressed sum-of-max shard rescores from; on any other
    recipe it would do nothing, so it is refused."""
    som = ["model.scorer.name=som", "index.kind=ivfpq", "index.token_copy=true"]
    assert load_config(None, som).index.token_copy
    for scorer, kind in (("som", "flat"), ("dual", "ivfpq"), ("multi", "ivfpq")):
        with pytest.raises(ConfigError, match=r"'index.token_copy'"):
            load_config(
                None, [f"model.scorer.name={scorer}", f"index.kind={kind}", "index.token_copy=true"]
            )


def test_plaid_and_token_pooling_are_for_the_scorers_that_keep_token_vectors() -> None:
    """index.kind plaid holds several vectors an entity (som, multi-m), a token copy beside its
    codes for som; token pooling leaves an entity fewer vectors, which only som scores."""
    for scorer in ("som", "multi"):
        assert load_config(None, [f"model.scorer.name={scorer}", "index.kind=plaid"])
    copied = ["model.scorer.name=som", "index.kind=plaid", "index.token_copy=true"]
    assert load_config(None, copied).index.token_copy
    with pytest.raises(ConfigError, match=r"'index.kind'.*'plaid'.*one vector an entity"):
        load_config(None, ["model.scorer.name=dual", "index.kind=plaid"])
    pooled = ["model.scorer.name=som", "index.token_pool_factor=2"]
    assert load_config(None, pooled).index.token_pool_factor == 2
    with pytest.raises(ConfigError, match=r"'index.token_pool_factor'"):
        load_config(None, ["model.scorer.name=multi", "index.token_pool_factor=2"])


def test_every_scorer_option_can_be_written_in_a_recipe(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "model:\n  scorer: {name: genpoly, m: 16, m_prime: 4}\n"
        "negatives:\n  source: none\n  sampler: random\n",
    )
    scorer = load_config(path).model.scorer
    assert (scorer.name, scorer.m, scorer.m_prime) == ("genpoly", 16, 4)
    form = scorer.general_equivalent()  # the name implies the general form's choices
    assert (form.query_side, form.key_reduction, form.attention) == ("entity", "codes", "soft")
    with pytest.raises(ConfigError, match=r"'model.scorer.query_side'"):
        load_config(None, ["model.scorer.query_side=entity"])


def test_index_knobs_reach_the_index_section() -> None:
    index = load_config(
        None, ["index.kind=ivfpq", "index.nlist=256", "index.nprobe=8", "index.pq_m=16"]
    ).index
    assert index.to_json()["nlist"] == 256 and index.to_json()["nprobe"] == 8


def test_an_unset_probe_count_is_half_the_lists_for_multi_m_and_32_otherwise(
    tmp_path: Path,
) -> None:
    """Multi-m's one query vector finds its best entity vectors spread over many IVF lists, so
    unset, ``index.nprobe`` is half of ``index.nlist`` for it and 32 (at most nlist) for the
    others; a value the recipe gives is kept, and the resolved value is what the run's
    config.yaml says."""
    multi = ["index.kind=ivfpq", "model.scorer={name: multi, m: 8}"]
    assert load_config(None, multi).index.nprobe == 512
    assert load_config(None, [*multi, "index.nlist=64"]).index.nprobe == 32
    assert load_config(None, [*multi, "index.nprobe=40"]).index.nprobe == 40
    assert load_config(None, ["index.kind=ivfpq"]).index.nprobe == 32
    assert load_config(None, ["index.kind=ivfpq", "index.nlist=16"]).index.nprobe == 16
    config = load_config(None, multi)
    dump_config(config, tmp_path / "config.yaml")
    again = load_config(tmp_path / "config.yaml", ["model.scorer={name: dual, m: 1}"])
    assert again.index.nprobe == 512 and again.index.to_json()["nprobe"] == 512


def test_hard_sampler_needs_index_source() -> None:
    with pytest.raises(ConfigError, match=r"negatives\.source"):
        load_config(None, ["negatives.sampler=hard", "negatives.source=none"])


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["negatives.sampler=random", "negatives.source=none"], r"draws no index candidates"),
        (["model.scorer.name=som"], r"sum-of-max keeps a vector per entity token"),
        (["training.zero_stage=3"], r"'training\.zero_stage' is 3.*the cache's mentions"),
    ],
)
def test_the_negative_cache_refuses_what_it_cannot_serve(
    overrides: list[str], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(None, ["negatives.cache.enabled=true", *overrides])


def test_the_negative_cache_alone_feeds_a_hard_sampler_without_refresh_or_initial_negatives() -> (
    None
):
    """Without a refresh or a version 0, the cache still has what the steps write; unset, it is
    on wherever it applies, and off (not refused) where it does not."""
    alone = ["refresh.enabled=false", "negatives.initial=random", "negatives.sampler=hard"]
    with pytest.raises(ConfigError, match="needs mined negatives"):
        load_config(None, [*alone, "negatives.cache.enabled=false"])
    assert load_config(None, alone).negatives.cache.enabled
    assert load_config(None, [*alone, "negatives.cache.enabled=true"]).negatives.cache.enabled
    assert not load_config(None, ["negatives.sampler=random"]).negatives.cache.enabled
    assert not load_config(None, ["model.scorer.name=som"]).negatives.cache.enabled
    with pytest.raises(ConfigError, match="sum-of-max keeps a vector per entity token"):
        load_config(None, ["model.scorer.name=som", "negatives.cache.enabled=true"])


def test_malformed_override_and_yaml(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"section\.key=value"):
        load_config(None, ["training.steps"])
    with pytest.raises(ConfigError, match="top level"):
        load_config(write(tmp_path, "- a\n- b\n"))
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(write(tmp_path, "training: [\n"))
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "missing.yaml")


def test_yaml_is_loaded_safely(tmp_path: Path) -> None:
    path = write(tmp_path, "run:\n  dir: !!python/object/apply:os.system ['echo pwned']\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(path)


def test_each_sampler_declares_its_option_group_in_the_recipe_schema() -> None:
    """A sampler's spec is all the recipe needs: its name is a valid ``negatives.sampler`` and
    its options class is the group ``negatives.<name>``, set like any other key."""
    from hnce.mining.samplers import SAMPLER_SPECS

    defaults = load_config(None).negatives
    for name, spec in SAMPLER_SPECS.items():
        overrides = [f"negatives.sampler={name}", "negatives.initial=model"]
        if spec.candidates != "index":
            overrides = [f"negatives.sampler={name}", "negatives.source=none"]
        assert load_config(None, overrides).negatives.sampler == name
        if spec.options is None:
            continue
        assert isinstance(getattr(defaults, spec.group), spec.options)
        field = next(iter(spec.options.__dataclass_fields__))
        with pytest.raises(ConfigError, match=rf"'negatives\.{spec.group}\.{field}'"):
            load_config(None, [f"negatives.{spec.group}.{field}=not-a-number"])
    with pytest.raises(ConfigError, match=r"unknown key 'negatives\.nope'"):
        load_config(None, ["negatives.nope.size=1"])


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("training.learning_rate=.inf", "training.learning_rate"),
        ("negatives.hard.sampling_temperature=.nan", "negatives.hard.sampling_temperature"),
        ("refresh.stale.loss_ratio=.nan", "refresh.stale.loss_ratio"),
        ("loss.temperature=.nan", "loss.temperature"),
        ("eval.ks=[1, .inf]", "eval.ks"),
    ],
)
def test_a_non_finite_setting_is_refused_at_load_with_its_key(override: str, key: str) -> None:
    with pytest.raises(ConfigError, match=rf"--set {re.escape(override)}: '{re.escape(key)}"):
        load_config(None, [override])


def test_no_warm_up_trains_at_the_full_learning_rate_from_the_first_step() -> None:
    from deepspeed.runtime.lr_schedules import WarmupDecayLR

    from hnce.pipeline.train.deepspeed_config import build_deepspeed_config

    settings = load_config(None, ["training.warmup_steps=0", "training.steps=4"]).training
    schedule = build_deepspeed_config(settings, torch.device("cpu"))["scheduler"]["params"]
    model = torch.nn.Linear(1, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=settings.learning_rate)
    scheduler = WarmupDecayLR(optimizer, **schedule)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(settings.learning_rate)
    optimizer.step()
    scheduler.step()
    assert optimizer.param_groups[0]["lr"] <= settings.learning_rate


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_every_device_trains_with_torchs_adam_so_no_op_is_compiled_on_a_worker(device: str) -> None:
    """DeepSpeed's FusedAdam is compiled by nvcc on each GPU worker at start-up (and its builder
    failed on an H200's ``9.0a`` architecture); torch's Adam needs no compiler anywhere, and its
    fused kernel updates every tensor at once (tensor by tensor, a CPU spent 0.3 s a step)."""
    from hnce.pipeline.train.deepspeed_config import build_deepspeed_config

    settings = load_config(None, ["training.precision=fp32"]).training
    optimizer = build_deepspeed_config(settings, torch.device(device))["optimizer"]
    assert optimizer["params"]["torch_adam"] is True
    assert optimizer["params"]["fused"] is True


HOSTILE_RECIPES = {
    "self_alias": (b"a: &a [*a]\n", r"self_alias\.yaml:1: an alias refers to itself"),
    "complex_key": (b"? [a, b]\n: 1\n", r"complex_key\.yaml:1: a key must be a plain name"),
    "latin1": (b'run:\n  dir: "caf\xe9"\n', r"latin1\.yaml:2: not UTF-8 text"),
    "broken": (b"training:\n  steps: [1\n", r"broken\.yaml:3: not valid YAML"),
    "control": (b"run:\n  dir: a\x16b\n", r"control\.yaml:2: not valid YAML: character 0x0016"),
    "deep": (b"run: " + b"[" * 5000 + b"]" * 5000 + b"\n", r"deep\.yaml: nested too deeply"),
    "alias_bomb": (
        b"a: &a ["
        + b",".join([b'"lol"'] * 9)
        + b"]\n"
        + b"".join(
            f"{c}: &{c} [{','.join(['*' + p] * 9)}]\n".encode()
            for p, c in zip("abcdefgh", "bcdefghi", strict=True)
        ),
        r"alias_bomb\.yaml:\d+: the recipe expands to more than 100,000 values",
    ),
}


@pytest.mark.parametrize("name", sorted(HOSTILE_RECIPES))
def test_a_hostile_recipe_is_one_error_naming_its_file_and_line(tmp_path: Path, name: str) -> None:
    content, message = HOSTILE_RECIPES[name]
    recipe = tmp_path / f"{name}.yaml"
    recipe.write_bytes(content)
    with pytest.raises(ConfigError, match=message):
        load_config(recipe)


def _settings(node: object, prefix: str = "") -> dict[str, object]:
    if dataclasses.is_dataclass(node):
        leaves: dict[str, object] = {}
        for field in dataclasses.fields(node):
            leaves.update(_settings(getattr(node, field.name), f"{prefix}{field.name}."))
        return leaves
    return {prefix[:-1]: node}


def test_a_recipe_of_paths_and_steps_trains_what_the_demo_runs(tmp_path: Path) -> None:
    """The defaults are the measured recipe: naming only run.dir, data.root and training.steps
    gives every setting configs/demo.yaml trains with; the demo sets only its data (the demo
    section, data.root) and its budget (the checkpoints its curve evaluates)."""
    recipe = tmp_path / "three.yaml"
    recipe.write_text("run: {dir: runs/demo}\ndata: {root: data/x}\ntraining: {steps: 120}\n")
    three = _settings(load_config(recipe, ["data.root=data/wordnet"]))
    demo = _settings(load_config(DEMO, ["data.root=data/wordnet"]))
    differ = {key for key in demo if demo[key] != three[key]}
    assert differ <= {"training.checkpoint_every"} | {k for k in demo if k.startswith("demo.")}
    assert (three["negatives.cache.enabled"], three["negatives.share"]) == (True, "batch")
    assert (three["model.normalize"], three["refresh.trigger"]) == (None, "payoff")


def test_the_first_run_of_your_own_is_sized_to_the_machine_and_says_so() -> None:
    """configs/wordnet.yaml (the README's first run of your own) names no cluster, workers or
    encoders: on a 2-core machine it is one worker on the node's cores while no refresh works,
    and the driver's log line says so."""
    from hnce.pipeline.train.cores import describe_cores, resolve_cores

    config = load_config(CONFIGS / "wordnet.yaml")
    assert config.cluster.address == "local"
    assert (config.training.num_workers, config.training.cpus_per_worker) == (1, 1.0)
    assert config.refresh.num_encoders == 0  # one per slot, else per GPU, else one
    mode, why = resolve_cores(config.training.cores, nodes=1, use_gpu=False)
    said = describe_cores(mode, why, 1, config.training.cpus_per_worker, cores=2)
    assert said.startswith("1 worker(s), each on 2 thread(s) while no refresh works and 1 ")


def test_the_loss_temperature_is_typed_and_only_for_a_loss_that_has_one() -> None:
    """``loss.temperature`` unset is resolved by the scores (0.05 cosine, 1 inner product); a
    temperature for a loss that divides by none is refused, naming the key."""
    from hnce.mining.losses import loss_options

    assert load_config(None).loss.temperature is None
    assert loss_options("nce", None, cosine=True) == {"temperature": 0.05}
    assert loss_options("focal", None, cosine=False) == {"temperature": 1.0}
    assert loss_options("nce", 0.2, cosine=True) == {"temperature": 0.2}
    assert loss_options("triplet", None, cosine=True) == {}
    with pytest.raises(ConfigError, match=r"'loss\.temperature' is set, but loss 'triplet'"):
        load_config(None, ["loss.name=triplet", "loss.temperature=0.1"])
    with pytest.raises(ConfigError, match=r"'loss\.options'"):
        load_config(None, ["loss.options={temperature: 0.05}"])

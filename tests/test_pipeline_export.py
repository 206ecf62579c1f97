"""``hnce export``: a dual model's towers load in sentence-transformers and give hnce's own vectors
(mean and [CLS] pooling, normalised or not); other scorers are refused before any work; an export
of checkpoint S carries the index version of S's model (the one ``hnce eval`` searches), never the
run's live version of another step; and the export page's (docs/export.md), run as written, finds
with plain faiss and pyarrow in the exported index what hnce's own searcher finds in that
version."""

from __future__ import annotations

import errno
import json
import random
import re
import resource
import shlex
import signal
import string
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from conftest import LETTER_PIECES, tiny_bert_config, write_wordpiece_tokenizer
from sentence_transformers import MultiVectorEncoder, SentenceTransformer
from store_helpers import publish_index, random_word_dataset, write_checkpoint
from training_helpers import write_letter_export

from hnce.cluster.compute import retrieval
from hnce.cluster.compute.index_build import IndexedModel
from hnce.cluster.compute.retrieval import EVAL_INDEX_DIR, version_key
from hnce.cluster.stores.checkpoints import checkpoint_dir, verify_checkpoint
from hnce.cluster.stores.index_store import IndexStore, IndexVersion
from hnce.cluster.stores.tables_read import EntityCatalogue
from hnce.encoders import mention_window
from hnce.encoders.biencoder import build_biencoder, export_biencoder, load_biencoder
from hnce.encoders.pooling import declared_pooling
from hnce.encoders.reranker import build_reranker, export_reranker
from hnce.encoders.scorers import ScorerConfig
from hnce.encoders.sentence_transformers_export import export_sentence_transformers
from hnce.errors import InputError
from hnce.pipeline import export
from hnce.pipeline.cli.main import main
from hnce.pipeline.config import load_config
from hnce.pipeline.data.kilt import END_ENT, START_ENT
from hnce.pipeline.export import SENTENCE_TRANSFORMERS, export_run
from hnce.pipeline.run import RUN_RECIPE, refresh_plan

EXPORT_PAGE = Path(__file__).resolve().parents[1] / "docs" / "export.md"
SECTION = "# Export: `hnce export`"
pytestmark = pytest.mark.usefixtures("hf_modules_cache")
MENTION_LENGTH = 48


def words(count: int, seed: int) -> str:
    """``count`` random lower-case words (every one tokenizes with the letters' vocabulary)."""
    rng = random.Random(seed)
    return " ".join(
        "".join(rng.choices(string.ascii_lowercase, k=rng.randint(1, 9))) for _ in range(count)
    )


# Short ones, whose whole context fits the mention length, then contexts several times that
# length, which BLINK's window cuts on both sides of the mention: left-heavy, right-heavy, both,
# a side too short for its share (the rest flows to the other), the mention at the very start
# and at the very end, a mention longer than the window, and text the tokenizer normalises
# (accents stripped, lower-cased) or does not know (CJK: [UNK] pieces).
MENTIONS = [
    ("the big", "paris", "is a city"),
    ("", "seine", "river"),
    ("on a river", "city", ""),
    (words(300, 1), "paris", words(8, 2)),
    (words(6, 3), "seine", words(300, 4)),
    (words(200, 5), "big city", words(200, 6)),
    ("", "river", words(300, 7)),
    (words(300, 8), "paris", ""),
    ("a b", words(80, 9), "c d"),
    ("Zürich Café naïve 東京 " * 40, "Ñandú Ælfred", "Élan ÉCOLE 北京 " * 40),
]
# The first is longer than the entity length: both cut it there. None: no title (nor its marker).
ENTITIES = [
    ("paris", "capital of france " * 12),
    ("seine", "a river"),
    (None, "no title at all"),
    ("Zürich 東京 " * 20, "a title longer than the entity length"),
    ("Ñandú", "Élan ÉCOLE 北京 " * 30),
]
# With punctuation, which som's skiplist leaves out of an entity's tokens (not a mention's).
PUNCTUATED_MENTIONS = [*MENTIONS, ("it flows, west", "seine", "into (the) sea.")]
PUNCTUATED_ENTITIES = [*ENTITIES, ("seine", "a river, it flows; west (to the sea).")]


def write_run(
    run_dir: Path,
    pooling: str,
    normalize: bool,
    hidden_size: int = 32,
    step: int = 3,
    scorer: ScorerConfig | str = "dual",
    projection_size: int | None = None,
) -> Path:
    """A run whose checkpoint ``step`` holds a tiny random model (dual unless ``scorer``) with
    this pooling (seeded by the step: each step's model is another); its vocabulary is the
    letters and the punctuation."""
    pieces = [*LETTER_PIECES, *string.punctuation]
    tokenizer = write_wordpiece_tokenizer(run_dir.parent / "vocab", pieces)
    torch.manual_seed(step - 3)
    model = build_biencoder(
        tiny_bert_config(len(tokenizer), hidden_size),
        scorer,
        tokenizer=tokenizer,
        mention_length=MENTION_LENGTH,
        entity_length=24,
        projection_size=projection_size,
        pooling=pooling,
        normalize=normalize,
    )
    export_biencoder(model, run_dir.parent / f"export-{step}")
    write_checkpoint(run_dir, step, run_dir.parent / f"export-{step}")
    return run_dir


def marked_texts(rows: list[tuple[str, str, str]]) -> list[str]:
    """Each mention as docs/export.md tells users to feed the mention tower: one text marking
    the mention with [START_ENT] ... [END_ENT], as ``hnce link`` takes it."""
    return [f"{left} {START_ENT} {mention} {END_ENT} {right}" for left, mention, right in rows]


def entity_texts(rows: list[tuple[str | None, str]]) -> list[str]:
    """Each entity as docs/export.md tells users to feed the entity tower: BLINK's layout."""
    return [text if title is None else f"{title} [unused2] {text}" for title, text in rows]


def write_recipe(run_dir: Path, data_root: Path) -> Path:
    """The run's ``config.yaml``, as ``hnce train`` leaves it: its catalogue is ``data_root``."""
    recipe = run_dir / RUN_RECIPE
    recipe.write_text(f"run:\n  dir: {run_dir}\ndata:\n  root: {data_root}\n")
    return recipe


def publish_version_of(store: Path, run_dir: Path, step: int) -> IndexVersion:
    """A version of checkpoint ``step``'s model over the run's catalogue in the store ``store``
    (random 16-wide vectors), recorded as what ``hnce eval`` looks for (``version_key``), as a
    refresh or an evaluation would have published it."""
    plan = refresh_plan(load_config(run_dir / RUN_RECIPE))
    model = IndexedModel.from_checkpoint(checkpoint_dir(run_dir, step), step)
    fingerprint, catalogue, index = version_key(plan, model)
    vectors = np.random.default_rng(step).standard_normal((48, 16)).astype(np.float32)
    changes = {"model": fingerprint, "catalogue": catalogue, "index": index}
    return publish_index(IndexStore(store), step, vectors, shards=3, **changes)


def blink_texts(rows: list[tuple[str, ...]], markers: tuple[str, ...]) -> list[str]:
    """Each row's fields joined by BLINK's markers, as docs/export.md tells users to feed the towers."""
    texts = []
    for row in rows:
        parts = [row[0]]
        for marker, field in zip(markers, row[1:], strict=True):
            parts += [marker, field]
        texts.append(" ".join(part for part in parts if part))
    return texts


@pytest.mark.parametrize(
    ("pooling", "normalize"), [("mean", False), ("mean", True), ("cls", False), ("cls", True)]
)
def test_each_tower_loads_in_sentence_transformers_and_gives_hnces_vectors(
    tmp_path: Path, pooling: str, normalize: bool
) -> None:
    """Whatever a mention's context length: sentence-transformers alone cut the end of every
    input longer than the tower, often the mention itself (R@1 0.814 in hnce, 0.312 through
    the export on news data where nearly every mention's context was that long)."""
    run_dir = write_run(tmp_path / "run", pooling, normalize)
    written = export_run(run_dir, "newest", SENTENCE_TRANSFORMERS, tmp_path / "out", index=False)
    assert written == {
        "mention": tmp_path / "out" / "mention",
        "entity": tmp_path / "out" / "entity",
    }
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging left

    model = load_biencoder(run_dir / "checkpoints" / "step-3" / "export")
    mention_batch = model.tokenize_mentions(*zip(*MENTIONS, strict=True))
    entity_batch = model.tokenize_entities(*zip(*ENTITIES, strict=True))
    with torch.inference_mode():
        expected = {
            "mention": model.encode_mentions(**mention_batch)[0][:, 0],
            "entity": model.encode_entities(**entity_batch)[0][:, 0],
        }
    texts = {
        "mention": marked_texts(MENTIONS),
        "entity": entity_texts(ENTITIES),
    }
    assert mention_batch["input_ids"].shape[1] == MENTION_LENGTH  # the long contexts were cut
    assert entity_batch["input_ids"].shape[1] == model.entity_length  # the long texts were cut
    for tower, directory in written.items():
        loaded = SentenceTransformer(str(directory), device="cpu", trust_remote_code=True)
        vectors = loaded.encode(texts[tower], convert_to_tensor=True)
        torch.testing.assert_close(vectors, expected[tower], rtol=0, atol=1e-6)
        assert loaded.similarity_fn_name == ("cosine" if normalize else "dot")
        assert declared_pooling(directory) == pooling  # hnce reads it back as a model.path
        modules = json.loads((directory / "modules.json").read_text())
        assert all((directory / module["path"]).is_dir() for module in modules)
    if normalize:
        assert torch.allclose(expected["entity"].norm(dim=1), torch.ones(len(ENTITIES)))


def test_the_mention_tower_needs_trusted_code_reads_one_marked_mention_and_saves_again(
    tmp_path: Path,
) -> None:
    """The window is code shipped in the export: sentence-transformers refuses it untrusted. It
    reads hnce link's markers (kilt's, the file keeps its own copy to stand alone) and no other
    layout, BLINK's [unused0] included; sentence-transformers' own save and load keep it."""
    run_dir = write_run(tmp_path / "run", "mean", True)
    directory = export_run(run_dir, "newest", SENTENCE_TRANSFORMERS, tmp_path / "out", index=False)[
        "mention"
    ]
    with pytest.raises(ValueError, match="trust_remote_code=True"):
        SentenceTransformer(str(directory), device="cpu")
    assert (mention_window.START_ENT, mention_window.END_ENT) == (START_ENT, END_ENT)
    loaded = SentenceTransformer(str(directory), device="cpu", trust_remote_code=True)
    for unmarked in [
        "the [unused0] seine [unused1] river",
        f"{START_ENT} a {START_ENT} b {END_ENT}",
    ]:
        with pytest.raises(ValueError, match=re.escape(f"exactly one mention with {START_ENT}")):
            loaded.encode([unmarked])
    with pytest.raises(ValueError, match="takes no prompt"):
        loaded.encode(marked_texts(MENTIONS), prompt="query: ")
    loaded.save(str(tmp_path / "saved"))
    normalize = "3_Normalize/config.json"  # what sentence-transformers writes for it, as the export
    assert json.loads((tmp_path / "saved" / normalize).read_text()) == json.loads(
        (directory / normalize).read_text()
    )
    saved = SentenceTransformer(str(tmp_path / "saved"), device="cpu", trust_remote_code=True)
    texts = marked_texts(MENTIONS)
    torch.testing.assert_close(
        saved.encode(texts, convert_to_tensor=True),
        loaded.encode(texts, convert_to_tensor=True),
        rtol=0,
        atol=0,
    )


@pytest.mark.parametrize("normalize", [False, True])
def test_a_som_model_exports_as_multi_vector_encoders_giving_hnces_token_vectors_and_scores(
    tmp_path: Path, normalize: bool
) -> None:
    """sentence-transformers' MultiVectorEncoder reads each tower back with hnce's token vectors,
    exactly the ones som's score reads (real tokens, [CLS], [SEP] and the markers included, an
    entity's punctuation left out), and its MaxSim is hnce's sum of maxima; the mention tower
    keeps the mention inside its window as the dual export does."""
    som = ScorerConfig("som", skip_punctuation=True)
    run_dir = write_run(tmp_path / "run", "cls", normalize, scorer=som)
    written = export_run(run_dir, "newest", SENTENCE_TRANSFORMERS, tmp_path / "out", index=False)
    model = load_biencoder(run_dir / "checkpoints" / "step-3" / "export")
    mention_batch = model.tokenize_mentions(*zip(*PUNCTUATED_MENTIONS, strict=True))
    entity_batch = model.tokenize_entities(*zip(*PUNCTUATED_ENTITIES, strict=True))
    with torch.inference_mode():
        mentions = model.mention_side(mention_batch)
        entities = model.candidate_side(entity_batch)
        scores = model.scorer.score_reduced(*mentions, *entities)
    # the last entity's punctuation is among its real tokens, and left out of its vectors
    assert entities[1][-1].sum() < entity_batch["attention_mask"][-1].sum()

    mention_tower = MultiVectorEncoder(
        str(written["mention"]), device="cpu", trust_remote_code=True, local_files_only=True
    )
    entity_tower = MultiVectorEncoder(str(written["entity"]), device="cpu", local_files_only=True)
    queries = mention_tower.encode_query(marked_texts(PUNCTUATED_MENTIONS))
    documents = entity_tower.encode_document(entity_texts(PUNCTUATED_ENTITIES))
    for tokens, (vectors, kept) in [(queries, mentions), (documents, entities)]:
        assert len(tokens) == len(vectors)
        for row, token_vectors in enumerate(tokens):
            torch.testing.assert_close(token_vectors, vectors[row][kept[row]], rtol=0, atol=1e-6)
    assert mention_tower.similarity_fn_name == entity_tower.similarity_fn_name == "maxsim"
    torch.testing.assert_close(
        mention_tower.similarity(queries, documents), scores, rtol=1e-5, atol=1e-5
    )


@pytest.mark.parametrize(
    ("pooling", "projection_size", "refusal"),
    [("mean", None, "som with mean pooling"), ("cls", 16, "BLINK's projections")],
)
def test_a_som_model_whose_first_vector_no_module_writes_is_refused_before_loading(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    pooling: str,
    projection_size: int | None,
    refusal: str,
) -> None:
    """Mean pooling puts the mean first, a projection BERT's projected pooler output: no
    sentence-transformers module writes either into a token sequence."""
    run_dir = write_run(
        tmp_path / "run", pooling, False, scorer="som", projection_size=projection_size
    )

    def never(*_: object) -> None:
        raise AssertionError("the checkpoint was loaded")

    monkeypatch.setattr(export, "load_biencoder", never)
    monkeypatch.setattr(export.IndexedModel, "from_checkpoint", never)
    with pytest.raises(InputError, match=re.escape(refusal)):
        export_run(run_dir, "newest", SENTENCE_TRANSFORMERS, tmp_path / "out", index=False)
    assert not (tmp_path / "out").exists()


def test_a_scorer_that_is_not_dual_or_som_is_refused_before_anything_is_loaded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_dir = tmp_path / "run"
    write_checkpoint(run_dir, 5, write_letter_export(tmp_path / "multi", "multi-3"))

    def never(*_: object) -> None:
        raise AssertionError("the checkpoint was loaded")

    monkeypatch.setattr(export, "load_biencoder", never)
    monkeypatch.setattr(export.IndexedModel, "from_checkpoint", never)
    with pytest.raises(InputError, match="scorer 'multi' reads several vectors per side"):
        export_run(run_dir, "step-5", SENTENCE_TRANSFORMERS, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_the_command_refuses_an_existing_out_and_a_missing_checkpoint_and_reads_a_recipe(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = write_run(tmp_path / "run", "cls", False)
    (tmp_path / "taken").mkdir()
    assert main(["export", str(run_dir), "--out", str(tmp_path / "taken")]) == 2
    assert "already exists" in capsys.readouterr().err
    assert (
        main(["export", str(run_dir), "--checkpoint", "step-9", "--out", str(tmp_path / "o")]) == 2
    )
    assert "step-9: no complete checkpoint" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
    assert main(["export", str(run_dir), "--out", str(tmp_path / "o")]) == 2
    error = capsys.readouterr().err  # the index is over the run's catalogue, its recipe's
    assert f"{run_dir / RUN_RECIPE}: missing" in error and "--no-index" in error, error
    assert not (tmp_path / "o").exists()
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(f"run:\n  dir: {run_dir}\n")  # a recipe names the run by run.dir
    arguments = ["export", str(recipe), "--checkpoint", "step-3", "--no-index"]
    assert main([*arguments, "--out", str(tmp_path / "o")]) == 0
    assert sorted(p.name for p in (tmp_path / "o").iterdir()) == [
        "entity",
        "export.json",
        "mention",
    ]
    pair = json.loads((tmp_path / "o" / "export.json").read_text())
    model = IndexedModel.from_checkpoint(run_dir / "checkpoints" / "step-3", 3)
    assert pair == {"checkpoint": 3, "model": model.fingerprint, "catalogue": None}


def test_no_output_lands_in_a_runs_own_stores(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An export into the checkpoint it exports (which would then fail verification for every
    loader), an evaluation report into the index store, a plot into the negatives store: each
    is refused before any work with exit 2, naming the option and the store, and nothing is
    written there; the run directory itself stays the user's to write in."""
    run_dir = write_run(tmp_path / "run", "cls", False)
    before = sorted(path for path in run_dir.rglob("*"))
    inside = run_dir / "checkpoints" / "step-3" / "export" / "st"
    assert main(["export", str(run_dir), "--out", str(inside)]) == 2
    error = capsys.readouterr().err
    assert f"--out {inside}: lies inside the run's checkpoints/" in error, error
    verify_checkpoint(run_dir / "checkpoints" / "step-3")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(f"run:\n  dir: {run_dir}\n")
    report = run_dir / "index" / "v1" / "eval.json"
    assert main(["eval", "--config", str(recipe), "--out", str(report)]) == 2
    assert "--out" in (error := capsys.readouterr().err) and "run's index/" in error, error
    plot = run_dir / "negatives" / "plot.png"
    assert main(["status", str(run_dir), "--plot", str(plot)]) == 2
    assert "--plot" in (error := capsys.readouterr().err) and "negatives/" in error, error
    assert sorted(path for path in run_dir.rglob("*")) == before
    assert main(["export", str(run_dir), "--no-index", "--out", str(run_dir / "st")]) == 0


def test_an_export_of_a_checkpoint_carries_its_own_index_never_the_live_one_of_another_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run's live index (``index/CURRENT``) is step-2's, the last refreshed, while the newest
    checkpoint is step-3, whose version an evaluation built into ``eval-index/``. The export of
    the newest carries step-3's version, the export of step-2 the live one: each the version's
    manifest and files as published, the catalogue's keys in entity_id order, and
    ``export.json`` naming the step and model fingerprint the towers and the index share. Both
    versions exist, so nothing is built: no encoder pool (nor Ray for one) starts."""
    data = random_word_dataset(tmp_path / "data")
    run_dir = write_run(tmp_path / "run", "mean", False, hidden_size=16, step=2)
    write_run(run_dir, "mean", False, hidden_size=16, step=3)
    write_recipe(run_dir, data)
    live = publish_version_of(run_dir / "index", run_dir, 2)
    evaluated = publish_version_of(run_dir / EVAL_INDEX_DIR, run_dir, 3)
    assert IndexStore(run_dir / "index").current().checkpoint == 2

    def never(*_: object) -> None:
        raise AssertionError("an encoder pool was started")

    monkeypatch.setattr(retrieval, "start_pool", never)
    keys = EntityCatalogue.open(data).keys().to_pylist()
    for checkpoint, step, version in [("newest", 3, evaluated), ("step-2", 2, live)]:
        out = tmp_path / checkpoint
        written = export_run(run_dir, checkpoint, SENTENCE_TRANSFORMERS, out)
        assert written == {part: out / part for part in ("mention", "entity", "index")}
        model = IndexedModel.from_checkpoint(checkpoint_dir(run_dir, step), step)
        pair = json.loads((out / "export.json").read_text())
        assert pair == {
            "checkpoint": step,
            "model": model.fingerprint,
            "catalogue": version.manifest.catalogue,
        }
        manifest = json.loads((out / "index" / "manifest.json").read_text())
        assert manifest == json.loads((version.path / "manifest.json").read_text())
        assert manifest["model"] == model.fingerprint
        files = [name for shard in version.manifest.shards for name, _ in shard.files()]
        for name in files:
            assert (out / "index" / name).read_bytes() == (version.path / name).read_bytes()
        listed = sorted(path.name for path in (out / "index").iterdir())
        assert listed == sorted([*files, "manifest.json", "keys.parquet"])
        assert pq.read_table(out / "index" / "keys.parquet")["key"].to_pylist() == keys


@contextmanager
def refusing(path: Path) -> Iterator[int]:
    """The OS refuses the write of ``path`` in the block; yields the errno it refuses with. A
    file written in place is a link to /dev/full (ENOSPC). safetensors writes a temporary file
    and renames it, so the weights are refused by a limit on file sizes instead (EFBIG), which
    they alone exceed."""
    if path.suffix != ".safetensors":
        path.parent.mkdir(parents=True)
        path.symlink_to("/dev/full")
        yield errno.ENOSPC
        return
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # else the signal ends the process
    resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 10, limit[1]))
    try:
        yield errno.EFBIG
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limit)
        signal.signal(signal.SIGXFSZ, handler)


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs Linux's /dev/full")
@pytest.mark.parametrize("refused", ["model.safetensors", "tokenizer.json", "config.json"])
@pytest.mark.parametrize(
    ("write", "tower"),
    [
        (export_sentence_transformers, "mention"),
        (export_biencoder, "mention"),
        (export_reranker, "encoder"),
    ],
    ids=["sentence-transformers", "bi-encoder", "reranker"],
)
def test_a_write_the_machine_refuses_during_an_export_is_an_os_error_naming_it(
    tmp_path: Path, write: Callable[[object, Path], object], tower: str, refused: str
) -> None:
    """What saves a tower loses the file of a refused write: safetensors and tokenizers (Rust)
    raised a bare SafetensorError or Exception ending in '(os error 28)', a traceback and exit 1
    from ``hnce export`` on a full disk, and transformers' own writes named no file."""
    tokenizer = write_wordpiece_tokenizer(tmp_path / "vocab", LETTER_PIECES)
    config = tiny_bert_config(len(tokenizer))
    if write is export_reranker:
        model = build_reranker(config, tokenizer, mention_length=12, entity_length=10)
    else:
        model = build_biencoder(config, "dual", tokenizer=tokenizer)
    out = tmp_path / "out"
    with refusing(out / tower / refused) as code, pytest.raises(OSError) as raised:
        write(model, out)
    assert (raised.value.errno, raised.value.filename) == (code, str(out))


def test_an_export_past_the_file_size_limit_is_one_line_and_leaves_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A file larger than the machine allows (EFBIG, a quota on file sizes) is the machine's
    refusal like a full disk: exit 74 naming the directory, no traceback, no output left."""
    run_dir = write_run(tmp_path / "run", "cls", False)
    out = tmp_path / "st"
    before = sorted(tmp_path.iterdir())
    with refusing(out / "mention" / "model.safetensors") as code:
        assert code == errno.EFBIG
        assert main(["export", str(run_dir), "--no-index", "--out", str(out)]) == 74
    error = capsys.readouterr().err.strip().splitlines()
    assert error[-1].startswith("hnce export: ") and "File too large" in error[-1], error
    assert sorted(tmp_path.iterdir()) == before  # no output, no staging directory


def readme_section() -> tuple[list[str], list[str]]:
    """The ``hnce`` command lines and the Python blocks of the export page's (docs/export.md)."""
    text = EXPORT_PAGE.read_text(encoding="utf-8")
    start = text.index(SECTION)
    end = text.find("\n#", start + len(SECTION))
    section = text[start : end if end >= 0 else len(text)]
    shell = re.findall(r"```bash\n(.*?)```", section, re.S)
    commands = [line for block in shell for line in block.splitlines() if line.startswith("hnce ")]
    return commands, re.findall(r"```python\n(.*?)```", section, re.S)


def test_the_readme_export_section_runs_as_written(tmp_path: Path) -> None:
    """The export page's command, its sentence-transformers lines and its plain-faiss lines, with the
    example paths pointed at a small run: the top entities the lines find in the exported index
    equal hnce's own searcher's in the run's version of that checkpoint."""
    places = {
        "runs/wordnet": tmp_path / "runs" / "wordnet",
        "data/wordnet": random_word_dataset(tmp_path / "data"),
        "models/wordnet": tmp_path / "models" / "wordnet",
    }
    run_dir = write_run(places["runs/wordnet"], "mean", False, hidden_size=16)
    write_recipe(run_dir, places["data/wordnet"])
    publish_version_of(run_dir / "index", run_dir, 3)

    def pointed(text: str) -> str:
        for example, path in places.items():
            text = text.replace(example, str(path))
        return text

    commands, blocks = readme_section()
    assert len(commands) == 1 and len(blocks) == 2
    assert main(shlex.split(pointed(commands[0]))[1:]) == 0
    namespace: dict[str, object] = {}
    for block in blocks:
        exec(pointed(block), namespace)  # the page's own lines

    searcher = IndexStore(places["runs/wordnet"] / "index").current().load()
    queries = np.asarray(namespace["queries"], dtype=np.float32)
    entity_ids, scores = searcher.search(queries, 10)
    catalogue = EntityCatalogue.open(places["data/wordnet"])
    expected = [catalogue.get(int(i)).key for i in entity_ids[0]]
    top = namespace["top"]
    assert [key for _, key in top] == expected
    np.testing.assert_allclose([score for score, _ in top], scores[0], rtol=1e-5)

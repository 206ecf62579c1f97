"""Every model, config and tokenizer hnce loads comes through here: local directories only.

``transformers`` given a path that does not exist treats it as a Hub repository name and asks
the network (with retries); with network access it would fetch someone else's files. So each
load first checks that the directory exists and holds what is asked for, then calls
``from_pretrained`` with ``local_files_only=True``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from huggingface_hub.errors import StrictDataclassError

from hnce.errors import InputError

Loaded = TypeVar("Loaded")


def local_model_dir(path: Path | str, needs: str | None = "config.json") -> Path:
    """``path`` as a local directory (holding ``needs`` when given); :class:`InputError` saying
    what to pass otherwise."""
    directory = Path(path)
    missing = not directory.is_dir() or (needs is not None and not (directory / needs).is_file())
    if missing:
        what = f"no {needs}" if directory.is_dir() else "no such directory"
        raise InputError(
            f"{directory}: not a local model directory ({what}); hnce loads models only from "
            f"local Hugging Face directories and never downloads them: pass one (for the "
            f"packaged all-MiniLM-L6-v2, model.path: minilm)"
        )
    return directory


def load_local(loader: type[Loaded], path: Path | str, **options: Any) -> Loaded:
    """``loader.from_pretrained(path, local_files_only=True, **options)`` after checking
    ``path`` is a local model directory (``loader``: AutoModel, AutoConfig, AutoTokenizer...)."""
    needs = None if loader.__name__.endswith("Tokenizer") else "config.json"
    directory = local_model_dir(path, needs)
    with model_files(directory, loader.__name__):
        return loader.from_pretrained(directory, local_files_only=True, **options)  # type: ignore[attr-defined]


#: what transformers and torch raise of a model directory's files whose content they cannot use:
#: a config that is not JSON or of the wrong types (``hidden_dropout_prob: -1``, ``dtype: true``,
#: sizes too large to allocate, heads that do not divide the width)
_CONTENT_ERRORS = (
    ValueError,
    TypeError,
    KeyError,
    AttributeError,
    OverflowError,
    RuntimeError,
    StrictDataclassError,
)


@contextmanager
def model_files(directory: Path, what: str) -> Iterator[None]:
    """Inside the block, what ``from_pretrained`` / ``from_config`` say of files they could not
    use is the user's: one :class:`InputError` naming ``directory`` and ``what`` was built from
    it. An ``OSError`` with an errno is the machine refusing a read and stays one."""
    try:
        yield
    except OSError as error:
        if error.errno is not None:
            raise
        raise _unloadable(what, directory, error) from None
    except _CONTENT_ERRORS as error:
        raise _unloadable(what, directory, error) from None


def _unloadable(what: str, directory: Path, error: Exception) -> InputError:
    said = " ".join(str(error).split()) or type(error).__name__
    return InputError(f"{directory}: {what} cannot load it: {said[:300]}")

"""Property: past the Ray boundary, the store files a resumed worker, a shard holder and the
payoff trigger read keep the error contract (docs/failures.md) whatever they hold.

tests/test_boundary.py stops where Ray would start; tests/store_contents.py reads the files
read beyond it (a checkpoint's negative cache rows, an index version's codes and ids, the
refresh log) through the readers those processes call. Each defect a checksum cannot catch that
a hostile user found there is a named damage, refused naming the file; hypothesis draws further
(case, damage, seed) examples, named damages among them, and the reader must refuse in one line
naming the file or read content that can be used. ``benchmarks/boundary_fuzz.py`` runs many
more under recorded seeds.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from boundary import hostile_examples
from hypothesis import given
from hypothesis import strategies as st
from store_contents import NAMED, READER_CASES, build_reader_workspace, run_reader_example

#: examples of the property in the quick tier (more: HNCE_BOUNDARY_EXAMPLES, boundary.hostile_examples)
EXAMPLES = 40
#: every (case, damage) an example may draw: a named damage, or bytes damaged
DRAWN = [
    (case, name) for case in sorted(READER_CASES) for name in ("bytes", *READER_CASES[case].damages)
]


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_reader_workspace(tmp_path_factory.mktemp("readers"))


@pytest.mark.parametrize("case", sorted(READER_CASES))
def test_the_undamaged_files_read_whole(case: str, workspace: Path, tmp_path: Path) -> None:
    """Each reader takes the files as written, so what the property sees refused is the
    damage."""
    shutil.copytree(workspace, tmp_path / "ws")
    assert READER_CASES[case].read(tmp_path / "ws" / "run") is None


@pytest.mark.parametrize(("case", "damage"), NAMED)
def test_each_named_damage_is_refused_naming_the_file(
    case: str, damage: str, workspace: Path, tmp_path: Path
) -> None:
    """The defects a checksum cannot catch (the file re-signed): each is refused by the file's
    one reader, in one line naming the file, where it was read before as a traceback or as
    numbers to train on."""
    outcome = run_reader_example(workspace, tmp_path / "ws", case, damage, seed=0)
    assert outcome.broken() is None and outcome.said is not None, outcome


def test_every_reader_keeps_the_contract_under_hostile_files(
    workspace: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    scratch = tmp_path_factory.mktemp("scratch") / "ws"

    @hostile_examples(EXAMPLES)
    @given(drawn=st.sampled_from(DRAWN), seed=st.integers(0, 2**32 - 1))
    def keeps_the_contract(drawn: tuple[str, str], seed: int) -> None:
        case, damage = drawn
        outcome = run_reader_example(workspace, scratch, case, damage, seed)
        broken = outcome.broken()
        assert broken is None, (
            f"{case}, {outcome.damage}: {broken}\nreplay: python -m benchmarks.boundary_fuzz "
            f"--case '{case}' --damage '{damage}' --seed {seed}"
        )

    keeps_the_contract()

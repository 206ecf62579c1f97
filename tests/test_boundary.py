"""Property: every command keeps the error contract (docs/failures.md) whatever its inputs hold.

For each command and each kind of input it reads (tests/boundary.py: text and JSON lines,
recipes, Parquet tables and their manifest, run manifests and logs, checkpoints and exports),
hypothesis draws (case, seed); the seed damages one input (truncated, a bit flipped, bytes that
are not UTF-8, a value of the wrong type, NaN or infinite, emptied, a 1 MiB line), re-signing
its checksums half the time. The command must exit 0, 2 or 74 or reach the point where Ray
would start, say a failure in one line beginning ``hnce`` with no traceback, and change nothing
outside its outputs. The quick tier runs a bounded, derandomized set of examples;
``benchmarks/boundary_fuzz.py`` runs many more under recorded seeds.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from boundary import CASES, build_workspace, hostile_examples, run_example
from hypothesis import given
from hypothesis import strategies as st

#: examples of the property in the quick tier (more: HNCE_BOUNDARY_EXAMPLES, boundary.hostile_examples)
EXAMPLES = 60


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_workspace(tmp_path_factory.mktemp("boundary"))


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_undamaged_workspace_passes_every_command(case: str, workspace: Path, tmp_path) -> None:
    """Each command accepts the workspace as written, so what the property sees fail is the
    damage."""
    outcome = run_example(workspace, tmp_path / "ws", case, None)
    assert outcome.broken() is None and outcome.status in (None, 0), outcome


def test_every_command_keeps_the_contract_under_hostile_input(
    workspace: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    scratch = tmp_path_factory.mktemp("scratch") / "ws"

    @hostile_examples(EXAMPLES)
    @given(case=st.sampled_from(sorted(CASES)), seed=st.integers(0, 2**32 - 1))
    def keeps_the_contract(case: str, seed: int) -> None:
        outcome = run_example(workspace, scratch, case, seed)
        broken = outcome.broken()
        assert broken is None, (
            f"hnce {case}, seed {seed}: {outcome.damage}: {broken}\n{outcome.stderr}"
            f"replay: python -m benchmarks.boundary_fuzz --case '{case}' --seed {seed}"
        )

    keeps_the_contract()

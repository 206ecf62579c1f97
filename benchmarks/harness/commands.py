"""A measured child process: wall seconds, peak memory per role over its tree, its own peak.

Benchmarks that run the product's real commands (``hnce data ...``, ``hnce train``...) run each
in its own child process through :func:`run_command` (:func:`run_hnce` for ``hnce``), so that a
stage's memory is its own. The peaks per role come from :class:`~benchmarks.harness.memory.PeakMemory`
over this process's tree; the child's own peak (it and the descendants it waited for, exact:
``ru_maxrss`` from ``wait4``) is reported apart. The kernel carries a process's high-water mark
across ``exec``, so that figure is never below this process's resident set when it started the
child (:class:`PeakMemory` resets this process's mark on entry, so it is that set, not this
process's lifetime peak).

Example::

    command = run_hnce(["data", "wordnet", "--out", str(out)], log=work / "commands.log")
    print(command.seconds, command.child_peak_bytes, command.peak_gib)
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.harness.memory import PeakMemory
from benchmarks.harness.results import ROOT
from benchmarks.harness.timing import Timer

#: ``hnce`` as a child process of this interpreter (no reliance on the console script's PATH).
HNCE = [
    sys.executable,
    "-c",
    "import sys; from hnce.pipeline.cli.main import main; sys.exit(main())",
]


@dataclass(frozen=True)
class Command:
    """What one child process took: wall seconds, peak GiB per role (and ``all processes``),
    its own peak bytes, its standard output when it was kept, and the private (anonymous) part
    of each role's peak (:class:`~benchmarks.harness.memory.PeakMemory`)."""

    seconds: float
    peak_gib: dict[str, float]
    child_peak_bytes: int
    stdout: str
    private_gib: dict[str, float] = field(default_factory=dict)


def run_command(
    argv: Sequence[str], label: str, log: Path | None = None, keep_stdout: bool = False
) -> Command:
    """Run ``argv`` in a child process (working directory: the repository root) under
    :class:`PeakMemory`; its stderr is appended to ``log`` after a ``$ label`` line (inherited
    when there is no log), its stdout kept or discarded. Exits (SystemExit) when it fails."""
    errors = log.open("a") if log is not None else None
    try:
        if errors is not None:
            errors.write(f"\n$ {label}\n")
            errors.flush()
        with PeakMemory() as memory, Timer() as timer:
            child = subprocess.Popen(
                list(argv),
                stdout=subprocess.PIPE if keep_stdout else subprocess.DEVNULL,
                stderr=errors,
                text=True,
                cwd=ROOT,
            )
            stdout = child.stdout.read() if child.stdout is not None else ""
            _, status, usage = os.wait4(child.pid, 0)
            child.returncode = os.waitstatus_to_exitcode(status)
    finally:
        if errors is not None:
            errors.close()
    if child.stdout is not None:
        child.stdout.close()
    if child.returncode != 0:
        where = f"; see {log}" if log is not None else ""
        raise SystemExit(f"{label} failed with exit status {child.returncode}{where}")
    return Command(
        timer.seconds, memory.as_gib(), usage.ru_maxrss * 1024, stdout, memory.private_as_gib()
    )


def run_hnce(
    arguments: Sequence[str], log: Path | None = None, keep_stdout: bool = False
) -> Command:
    """``hnce <arguments>`` through :func:`run_command`."""
    return run_command([*HNCE, *arguments], "hnce " + " ".join(arguments), log, keep_stdout)


def run_recipe(
    command: str, recipe: Path, overrides: dict[str, object], log: Path | None = None
) -> Command:
    """``hnce <command> --config <recipe> --no-progress --set key=value ...`` (one ``--set`` per
    item of ``overrides``) through :func:`run_hnce`."""
    arguments = [command, "--config", str(recipe), "--no-progress"]
    for key, value in overrides.items():
        arguments += ["--set", f"{key}={value}"]
    return run_hnce(arguments, log)

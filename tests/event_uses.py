"""Who writes and who reads each :class:`hnce.events.RunEvent`, derived from the code.

Every ``RunEvent.<MEMBER>`` in the repository's Python files (found by ``git ls-files``, so a
moved module is found where it now is) is one use. A use is a *write* when the member is what a
``.write(...)`` call logs (its first argument, or either branch of a conditional there) or the
``"event"`` of a dict display (a record being built to be written); every other use reads (a
``read_events`` kind, a comparison, a lookup key, a default). :func:`uses` also keeps the fields
each write sets by name (its keyword arguments, or the dict's other string keys).

Print the listing (what ``hnce/events.py`` used to keep by hand)::

    .venv/bin/python tests/event_uses.py
"""

from __future__ import annotations

import ast
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from hnce.events import RunEvent

REPO = Path(__file__).resolve().parents[1]
EVENTS_MODULE = REPO / "hnce" / "events.py"


@dataclass(frozen=True)
class Use:
    """One ``RunEvent.<member>`` in the code: where, and whether it writes (with its fields)."""

    member: str
    path: str  # relative to the repository
    line: int
    scope: str  # the enclosing class and function (``Worker.step``), or ``<module>``
    writes: bool
    fields: frozenset[str] = field(default_factory=frozenset)

    @property
    def where(self) -> str:
        return f"{self.path}: {self.scope}"

    @property
    def in_tests(self) -> bool:
        return self.path.startswith("tests/")


def python_files() -> list[Path]:
    """The repository's Python files (tracked or new, not ignored), this listing's module and
    the events' own module aside."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.py"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    skip = {EVENTS_MODULE, Path(__file__).resolve()}
    return [REPO / name for name in listed if (REPO / name).is_file() and REPO / name not in skip]


def _member(node: ast.AST) -> str | None:
    """``X`` of ``RunEvent.X`` (or ``events.RunEvent.X``)."""
    if not isinstance(node, ast.Attribute) or node.attr not in RunEvent.__members__:
        return None
    owner = node.value
    name = owner.id if isinstance(owner, ast.Name) else getattr(owner, "attr", None)
    return node.attr if name == "RunEvent" else None


def _logged(node: ast.expr) -> list[ast.expr]:
    """The expressions a logged event may come from: the node, or both branches of ``a if c
    else b``."""
    if isinstance(node, ast.IfExp):
        return [*_logged(node.body), *_logged(node.orelse)]
    return [node]


def _written(tree: ast.AST) -> dict[int, frozenset[str]]:
    """``id`` of every member node that a write logs, with the fields the write names."""
    written: dict[int, frozenset[str]] = {}
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "write"
            and node.args
        ):
            names = frozenset(k.arg for k in node.keywords if k.arg is not None)
            for logged in _logged(node.args[0]):
                written[id(logged)] = names
        elif isinstance(node, ast.Dict):
            keys = [k.value if isinstance(k, ast.Constant) else None for k in node.keys]
            if "event" in keys:
                names = frozenset(k for k in keys if isinstance(k, str) and k != "event")
                for logged in _logged(node.values[keys.index("event")]):
                    written[id(logged)] = names
    return written


class _Scoped(ast.NodeVisitor):
    """Every member use of one file, with its enclosing class and function."""

    def __init__(self, path: str, written: dict[int, frozenset[str]]) -> None:
        self.path, self.written, self.scope, self.found = path, written, [], []

    def _enter(self, node: ast.AST, name: str) -> None:
        self.scope.append(name)
        self.generic_visit(node)
        self.scope.pop()

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self._enter(node, node.name)

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        self._enter(node, node.name)

    def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> None:
        self._enter(node, node.name)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        member = _member(node)
        if member is not None:
            writes = id(node) in self.written
            self.found.append(
                Use(
                    member,
                    self.path,
                    node.lineno,
                    ".".join(self.scope) or "<module>",
                    writes,
                    self.written.get(id(node), frozenset()),
                )
            )
        self.generic_visit(node)


def uses(files: list[Path] | None = None) -> list[Use]:
    """Every use of a member in ``files`` (default: the repository's Python files)."""
    found: list[Use] = []
    for path in python_files() if files is None else files:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        name = path.relative_to(REPO).as_posix() if path.is_relative_to(REPO) else path.name
        visitor = _Scoped(name, _written(tree))
        visitor.visit(tree)
        found.extend(visitor.found)
    return found


def member_docs() -> dict[str, str]:
    """Each member's comment in ``hnce/events.py`` (the ``#:`` lines just above it)."""
    lines = EVENTS_MODULE.read_text(encoding="utf-8").splitlines()
    docs: dict[str, str] = {}
    for number, line in enumerate(lines):
        found = re.match(r"\s+([A-Z_]+) = \"", line)
        if not found:
            continue
        comment = []
        above = number - 1
        while above >= 0 and lines[above].strip().startswith("#:"):
            comment.insert(0, lines[above].strip()[2:].strip())
            above -= 1
        docs[found.group(1)] = " ".join(comment)
    return docs


def listing(found: list[Use] | None = None) -> str:
    """One block per member: its value, then who writes it (with the fields) and who reads it,
    one line per enclosing function; the tests' uses counted, not listed."""
    found = uses() if found is None else found
    blocks = []
    for event in RunEvent:
        mine = [use for use in found if use.member == event.name]
        lines = [f"{event.name} ({event.value!r})"]
        for label, writes in (("written by", True), ("read by", False)):
            places: dict[str, set[str]] = {}
            for use in mine:
                if use.writes == writes and not use.in_tests:
                    places.setdefault(use.where, set()).update(use.fields)
            tests = sorted({use.path for use in mine if use.writes == writes and use.in_tests})
            lines.append(f"  {label}:")
            lines.extend(
                f"    {where}" + (f" ({', '.join(sorted(names))})" if names else "")
                for where, names in sorted(places.items())
            )
            if tests:
                lines.append(f"    tests: {len(tests)} files")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


if __name__ == "__main__":
    print(listing())

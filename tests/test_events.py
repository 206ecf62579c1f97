"""Every event of a run's logs is named by a member of :class:`hnce.events.RunEvent`: no writer or
reader in the repository's Python files spells an event kind as a string literal (an ``ast``
walk), and the members keep the strings earlier runs wrote. Who writes
and reads each member is derived from the code (``tests/event_uses.py``): every member has a
writer in the package and a reader, and every field a writer names is in its member's comment."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

from event_uses import listing, member_docs, python_files, uses

from hnce.cluster.stores.run_events import LOG_FILE, read_events
from hnce.events import RunEvent

REPO = Path(__file__).resolve().parents[1]
#: what a new event kind spelt as a literal looks like (a file's ``write`` of text does not)
EVENT_NAME = re.compile(r"[a-z][a-z0-9_]*")


def _event_literal(node: ast.expr | None) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    return None


def _names_event(node: ast.expr) -> bool:
    """``x["event"]`` or ``x.get("event", ...)``."""
    if isinstance(node, ast.Subscript):
        return _event_literal(node.slice) == "event"
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "get"
        and bool(node.args)
        and _event_literal(node.args[0]) == "event"
    )


def literal_events(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, literal) of every event kind ``tree`` spells as a string: the first argument of a
    ``.write(...)`` that looks like an event name, the kind given to ``read_events``, the value of
    an ``"event"`` key in a dict display, and a string an ``["event"]`` is compared with."""
    found = []
    for node in ast.walk(tree):
        literals: list[ast.expr | None] = []
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute | ast.Name):
            called = node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id
            if called == "write" and isinstance(node.func, ast.Attribute) and node.args:
                text = _event_literal(node.args[0])
                if text is not None and EVENT_NAME.fullmatch(text):
                    literals.append(node.args[0])
            elif called == "read_events":
                literals.extend(node.args[1:2])
                literals.extend(k.value for k in node.keywords if k.arg == "event")
        elif isinstance(node, ast.Dict):
            literals.extend(
                value
                for key, value in zip(node.keys, node.values, strict=True)
                if key is not None and _event_literal(key) == "event"
            )
        elif isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(_names_event(side) for side in sides):
                for side in sides:
                    inner = (
                        side.elts if isinstance(side, ast.Tuple | ast.List | ast.Set) else [side]
                    )
                    literals.extend(inner)
        if isinstance(node, ast.Call) and _names_event(node):
            literals.extend(node.args[1:2])  # the default of .get("event", ...)
        found.extend(
            (literal.lineno, text)
            for literal in literals
            if literal is not None and (text := _event_literal(literal)) is not None
        )
    return sorted(set(found))


def test_no_writer_or_reader_spells_an_event_as_a_string() -> None:
    found = []
    for path in python_files():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        found.extend(
            f"{path.relative_to(REPO)}:{line}: {text!r}" for line, text in literal_events(tree)
        )
    assert not found, "name these events by their RunEvent member:\n" + "\n".join(found)


def test_the_check_finds_each_way_of_spelling_an_event() -> None:
    source = """
log.write("step", step=1)
EventLog(run).write(
    "a_new_kind",
)
read_events(run, "end")
read_events(run, event="resume")
line = {"event": "refresh", "outcome": "published"}
if record["event"] == "checkpoint" or record.get("event", "launch") in ("start", "stale"):
    handle.write("a line of text\\n")
    handle.write(json.dumps(line) + "\\n")
    log.write(RunEvent.STEP, step=1)
    read_events(run, RunEvent.END)
    read_events(run)
"""
    found = literal_events(ast.parse(source))
    assert found == [
        (2, "step"),
        (4, "a_new_kind"),
        (6, "end"),
        (7, "resume"),
        (8, "refresh"),
        (9, "checkpoint"),
        (9, "launch"),
        (9, "stale"),
        (9, "start"),
    ]


def test_the_members_keep_the_strings_on_disk(tmp_path: Path) -> None:
    """Changing a value would leave the logs of earlier runs unread: the strings are pinned, and a
    line an earlier run wrote is found by its member."""
    assert {event.name: str(event) for event in RunEvent} == {
        "LAUNCH": "launch",
        "START": "start",
        "RESUME": "resume",
        "STEP": "step",
        "END": "end",
        "CHECKPOINT": "checkpoint",
        "NEGATIVES": "negatives",
        "LOSS_COLUMNS": "loss_columns",
        "REFRESH_WAIT": "refresh_wait",
        "INITIAL_NEGATIVES_WAIT": "initial_negatives_wait",
        "REFRESH": "refresh",
        "HELDOUT_RECALL": "heldout_recall",
        "INITIAL_NEGATIVES": "initial_negatives",
        "NONFINITE_LOSS": "nonfinite_loss",
        "NONFINITE_STOP": "nonfinite_stop",
        "REFRESH_STOP": "refresh_stop",
        "REFRESH_FAILED": "refresh_failed",
        "REFRESHES_END": "refreshes_end",
        "REFRESH_DECISION": "refresh_decision",
        "NEGATIVE_CACHE": "negative_cache",
    }
    earlier = [{"event": event.value, "time": 1.0, "step": 3} for event in RunEvent]
    (tmp_path / LOG_FILE).write_text("".join(json.dumps(line) + "\n" for line in earlier))
    for event in RunEvent:
        assert [line["event"] for line in read_events(tmp_path, event)] == [event.value]


def test_every_event_has_a_writer_in_the_package_and_a_reader() -> None:
    found = uses()
    package = {
        u.member
        for u in found
        if u.writes and not u.in_tests and not u.path.startswith("benchmarks/")
    }
    read = {u.member for u in found if not u.writes}
    assert not [e.name for e in RunEvent if e.name not in package], "written nowhere"
    assert not [e.name for e in RunEvent if e.name not in read], "read nowhere"


def test_every_field_a_writer_names_is_in_its_events_comment() -> None:
    """The comments in hnce/events.py are the events' field reference: a writer that adds or
    renames a field updates its member's comment (tests write partial events: not counted)."""
    docs = member_docs()
    assert set(docs) == set(RunEvent.__members__) and all(docs.values()), docs
    missing = sorted(
        f"{use.where}: {use.member}.{name}"
        for use in uses()
        if use.writes and not use.in_tests
        for name in use.fields
        if f"``{name}``" not in docs[use.member]
    )
    assert not missing, "fields not in hnce/events.py's comments:\n" + "\n".join(missing)


def test_the_derivation_tells_writes_from_reads(tmp_path: Path) -> None:
    source = tmp_path / "example.py"
    source.write_text(
        """
class Worker:
    def step(self, log, stop):
        log.write(RunEvent.STEP, step=1, loss=0.5)
        log.write(RunEvent.NONFINITE_STOP if stop else RunEvent.NONFINITE_LOSS, cause="x")

def record():
    return {"event": RunEvent.REFRESH, "outcome": "published"}

def read(run):
    return read_events(run, RunEvent.END), [e for e in run if e["event"] == RunEvent.RESUME]
"""
    )
    found = {(u.member, u.scope, u.writes, u.fields) for u in uses([source])}
    assert found == {
        ("STEP", "Worker.step", True, frozenset({"step", "loss"})),
        ("NONFINITE_STOP", "Worker.step", True, frozenset({"cause"})),
        ("NONFINITE_LOSS", "Worker.step", True, frozenset({"cause"})),
        ("REFRESH", "record", True, frozenset({"outcome"})),
        ("END", "read", False, frozenset()),
        ("RESUME", "read", False, frozenset()),
    }
    assert "STEP ('step')" in listing(uses([source]))

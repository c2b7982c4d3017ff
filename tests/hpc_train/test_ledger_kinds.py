"""The ledger's vocabulary (``hpc_core.ledger.Kind``), checked against the code that writes and
reads the ledger: every kind written is a member (never a bare string), with only its fields;
every reader asks for a kind by its member; every kind has a writer; contract.py's table lists
each kind. The code is read, not run (``ast``), in every package and the benchmarks."""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from hpc_core.ledger import EVENTS, Kind
from hpc_train import contract
from tests import code_scan
from tests.code_scan import callee_names, name_of

ROOT = code_scan.ROOT
NAMES = {str(kind) for kind in Kind}
# what writes an event: ``note(KIND, **data)`` (the launcher's, its parts', rank 0's),
# ``ledger.record(path, KIND, ...)``, and ``Event(KIND, ...)`` (an event not yet written)
WRITERS = {"note", "deputy_note", "_record", "record", "Event"}
DATA_FREE = {"Event"}  # its data is one dict, not keywords: no field check


def sources() -> Iterator[tuple[str, ast.Module]]:
    return code_scan.sources(ROOT)


def member(node: ast.expr) -> str | None:
    """``Kind.X`` or ``ledger.Kind.X``: X; anything else None."""
    if isinstance(node, ast.Attribute) and name_of(node.value) == "Kind":
        return node.attr
    return None


def bare(node: ast.expr) -> list[str]:
    """The ledger kinds a node spells as strings: a constant, or a tuple/list/set of them."""
    return code_scan.constants(node, NAMES)


def kindish(node: ast.expr) -> bool:
    """Something holding an event's kind: ``e.kind``, ``row["kind"]``, ``raw["event"]``, ``kind``."""
    if isinstance(node, ast.Attribute):
        return node.attr == "kind"
    if isinstance(node, ast.Subscript):
        return isinstance(node.slice, ast.Constant) and node.slice.value in ("kind", "event")
    return isinstance(node, ast.Name) and node.id == "kind"


@dataclass(frozen=True)
class Write:
    where: str
    kind: str | None  # the member's name (Kind.X: "X"); None: the kind is a variable
    spelled: str | None  # a bare string in the kind's place
    fields: frozenset[str]  # the data's field names the code spells out
    checks_fields: bool


def fields_of(call: ast.Call) -> set[str]:
    """Keywords, and the keys of ``**{...}`` (and of ``**({...} if c else {...})``)."""
    out = {k.arg for k in call.keywords if k.arg is not None}
    for k in call.keywords:
        if k.arg is None:
            value = k.value
            dicts = [value.body, value.orelse] if isinstance(value, ast.IfExp) else [value]
            for d in dicts:
                if isinstance(d, ast.Dict):
                    out |= {str(key.value) for key in d.keys if isinstance(key, ast.Constant)}
    return out


def writes() -> list[Write]:
    found = []
    for path, tree in sources():
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call) or not callee_names(node.func) & WRITERS:
                continue
            for arg in node.args[:2]:  # note(KIND, ...) and record(path, KIND, ...)
                kind, spelled = member(arg), bare(arg)
                if kind or spelled:
                    found.append(Write(
                        f"{path}:{node.lineno}", kind, spelled[0] if spelled else None,
                        frozenset(fields_of(node)),
                        not callee_names(node.func) & DATA_FREE,
                    ))  # fmt: skip
                    break
    return found


def bare_reads() -> list[str]:
    """Every place that asks for a kind by its string: compared with an event's kind, passed
    as a ``kind``, or kept in a tuple/set of kinds."""
    found = []
    for path, tree in sources():
        if path == "hpc_core/ledger.py":
            continue  # the vocabulary itself
        takes = code_scan.params(tree, "kind")
        for node in ast.walk(tree):
            spelled: list[str] = []
            if isinstance(node, ast.Compare):
                operands = [node.left, *node.comparators]
                if any(kindish(o) for o in operands):
                    spelled = [s for o in operands for s in bare(o)]
            elif isinstance(node, ast.Call):
                at = takes.get(name_of(node.func) or "")
                if at is not None and len(node.args) > at:
                    spelled = bare(node.args[at])
                spelled += [s for k in node.keywords if k.arg == "kind" for s in bare(k.value)]
            elif isinstance(node, ast.Tuple | ast.Set) and 0 < len(bare(node)) == len(node.elts):
                spelled = bare(node)  # a collection of nothing but kinds
            if spelled:
                found.append(f"{path}:{node.lineno}: {spelled}")
    return sorted(set(found))


def reads() -> set[str]:
    """Every ``Kind.X`` the code names outside its writers (the readers' kinds)."""
    written = {(w.where, w.kind) for w in writes()}
    out = set()
    for path, tree in sources():
        for node in ast.walk(tree):
            name = member(node) if isinstance(node, ast.Attribute) else None
            if name and (f"{path}:{node.lineno}", name) not in written:
                out.add(name)
    return out


@pytest.fixture(scope="module")
def written() -> list[Write]:
    return writes()


def test_the_scan_finds_the_writers_it_must(written):
    """The scan itself: it sees submit's, rank 0's and the launcher's writes (a scan that found
    nothing would pass every other test)."""
    where = {w.where.split(":")[0] for w in written}
    assert {"hpc_train/submit.py", "hpc_train/worker/ledger_hooks.py"} <= where
    assert any(w.startswith("hpc_train/launch/") for w in where)
    assert len(written) >= 15  # the launcher's own are few: its executor writes for every end


def test_every_kind_written_is_a_member_never_a_string(written):
    assert [w.where for w in written if w.spelled] == []
    unknown = [w.where for w in written if w.kind is not None and w.kind not in Kind.__members__]
    assert unknown == []


def test_every_writer_passes_only_its_kinds_fields(written):
    extra = {
        w.where: sorted(w.fields - set(Kind[w.kind].fields))
        for w in written
        if w.kind is not None and w.checks_fields and not w.fields <= set(Kind[w.kind].fields)
    }
    assert extra == {}


def test_every_kind_has_a_writer_and_the_readers_know_every_kind_written(written):
    assert {w.kind for w in written if w.kind} == set(Kind.__members__)
    assert reads() <= set(Kind.__members__)
    assert set(EVENTS) == set(Kind)  # what ledger.record accepts and ledger.read keeps


def test_readers_ask_for_a_kind_by_its_member_never_by_its_string():
    assert bare_reads() == []


def test_the_scan_would_find_a_bare_kind(tmp_path, monkeypatch):
    """The scans fail on what they exist to catch: a bare string written, compared, passed."""
    code = (
        'note("blamed", node="n1", colour="red")\n'
        'ends = [e for e in events if e.kind in ("stopped", "finished")]\n'
        "def first(events, kind): ...\n"
        'first(events, "started")\n'
        'note(Kind.RELEASED, node="n1", colour="red")\n'
    )
    (tmp_path / "hpc_train").mkdir()
    (tmp_path / "hpc_train" / "probe.py").write_text(code)
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    found = writes()
    assert [w.spelled for w in found] == ["blamed", None]
    assert found[1].kind == "RELEASED" and "colour" not in Kind.RELEASED.fields
    assert bare_reads() == [
        "hpc_train/probe.py:2: ['stopped', 'finished']",
        "hpc_train/probe.py:4: ['started']",
    ]


def test_the_contract_table_lists_every_kind_with_its_member():
    table = contract.__doc__ or ""
    missing = [
        k.name for k in Kind if f"``ledger.jsonl``: ``{k}`` | ``Kind.{k.name}`` |" not in table
    ]
    assert missing == []


def test_each_kind_says_its_writer_and_fields():
    for kind in Kind:
        assert kind.writer and kind.fields, kind.name
        assert len(set(kind.fields)) == len(kind.fields), kind.name

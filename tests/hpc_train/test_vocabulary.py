"""The toolkit's typed words, checked against the code that writes and reads them: a stop's
cause (``contract.Cause``), task 0's word to a round (``contract.RoundAction``) and a speed
lever's name (``job.levers.LeverName``) are named by their members everywhere, never spelled as
strings; each member is the string the ledger, the verdict file, the submit option and the
rank's argument always held. The code is read, not run (``ast``), in every package and the
benchmarks, like the ledger's kinds (tests/hpc_train/test_ledger_kinds.py)."""

from __future__ import annotations

import ast
import json
import sys
from collections.abc import Callable

from hpc_core import ledger
from hpc_core.ledger import Kind
from hpc_core.rundir import RunDir
from hpc_train.contract import Cause, RoundAction, RoundVerdict, read_verdict, write_verdict
from hpc_train.job import levers
from hpc_train.job.levers import LeverName
from tests import code_scan
from tests.code_scan import constants, name_of

ROOT = code_scan.ROOT
CAUSES = {str(c) for c in Cause}
ACTIONS = {str(a) for a in RoundAction}
LEVER_NAMES = {str(n) for n in LeverName}


def causeish(node: ast.expr) -> bool:
    """Something holding a stop's cause: ``x.cause``, ``e.get("cause")``, ``row["cause"]``,
    ``cause``, ``self._cause``."""
    if isinstance(node, ast.Attribute):
        return node.attr in ("cause", "_cause")
    if isinstance(node, ast.Subscript):
        return isinstance(node.slice, ast.Constant) and node.slice.value == "cause"
    if isinstance(node, ast.Call) and name_of(node.func) == "get" and node.args:
        return isinstance(node.args[0], ast.Constant) and node.args[0].value == "cause"
    return isinstance(node, ast.Name) and node.id == "cause"


def actionish(node: ast.expr) -> bool:
    """A round verdict's action (``verdict.action``; argparse's ``args.action`` is a subcommand)."""
    return (
        isinstance(node, ast.Attribute) and node.attr == "action" and name_of(node.value) != "args"
    )


def passed(node: ast.Call, takes: dict[str, set[int]], values: set[str]) -> list[str]:
    """The strings of ``values`` a call passes where its callee (any of the code's functions
    and classes of that name, ``takes``) has the parameter, by position."""
    at = takes.get(name_of(node.func) or "", set())
    return [s for i in sorted(at) if len(node.args) > i for s in constants(node.args[i], values)]


def compared_or_passed(
    node: ast.AST, holds: Callable[[ast.expr], bool], keyword: str, words: set[str],
    takes: dict[str, set[int]],
) -> list[str] | None:  # fmt: skip
    """The ``words`` a comparison with something that ``holds`` one spells, or a call passes
    as ``keyword`` or in its callee's parameter of that name; None: ``node`` is neither."""
    if isinstance(node, ast.Compare):
        operands = [node.left, *node.comparators]
        if any(holds(o) for o in operands):
            return [s for o in operands for s in constants(o, words)]
        return []
    if isinstance(node, ast.Call):
        out = [s for k in node.keywords if k.arg == keyword for s in constants(k.value, words)]
        return out + passed(node, takes, words)
    return None


def cause_spelled(node: ast.AST, takes: dict[str, set[int]]) -> list[str]:
    """The causes ``node`` spells as strings where a cause belongs."""
    found = compared_or_passed(node, causeish, "cause", CAUSES, takes)
    if found is not None:
        return found
    if isinstance(node, ast.Assign | ast.AnnAssign):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        if any(causeish(t) for t in targets) and node.value is not None:
            return constants(node.value, CAUSES)
    elif isinstance(node, ast.Return) and isinstance(node.value, ast.Tuple):
        first = node.value.elts[0] if node.value.elts else None  # (class, description)
        if isinstance(first, ast.Tuple) and first.elts:
            first = first.elts[0]  # ((class, description), repeated)
        return constants(first, CAUSES) if first is not None else []
    elif isinstance(node, ast.Tuple | ast.Set):
        found = constants(node, CAUSES)
        return found if 0 < len(found) == len(node.elts) else []  # nothing but causes
    return []


def action_spelled(node: ast.AST, takes: dict[str, set[int]]) -> list[str]:
    """The round actions ``node`` spells as strings where one belongs."""
    return compared_or_passed(node, actionish, "action", ACTIONS, takes) or []


def lever_spelled(node: ast.AST) -> list[str]:
    """The lever names ``node`` spells as strings: compared (``"pack" in on``), passed, or in a
    collection of nothing but lever names (a kernel-name tuple that holds "flash" among
    others is no lever's)."""
    if isinstance(node, ast.Compare):
        return [s for o in [node.left, *node.comparators] for s in constants(o, LEVER_NAMES)]
    if isinstance(node, ast.Call):
        values = [*node.args, *(k.value for k in node.keywords)]
        return [s for v in values if isinstance(v, ast.Constant) for s in constants(v, LEVER_NAMES)]
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        found = constants(node, LEVER_NAMES)
        return found if 0 < len(found) == len(node.elts) else []
    return []


def takes(trees: list[tuple[str, ast.Module]], param: str) -> dict[str, set[int]]:
    """Every function and class of the code taking ``param``: its name -> the positions (a
    call in one module may call another's: ``own_notice.send(Cause.HANG, job)``)."""
    out: dict[str, set[int]] = {}
    for _path, tree in trees:
        for name, at in code_scan.params(tree, param).items():
            out.setdefault(name, set()).add(at)
    return out


def spelled() -> dict[str, list[str]]:
    """Every place a cause, a round action or a lever name is spelled as a string, by word."""
    found: dict[str, list[str]] = {"cause": [], "action": [], "lever": []}
    trees = list(code_scan.sources(ROOT))
    causes, actions = takes(trees, "cause"), takes(trees, "action")
    for path, tree in trees:
        enum_body = path in ("hpc_train/contract.py", "hpc_train/job/levers.py")
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.ClassDef)
                and enum_body
                and node.name in ("Cause", "RoundAction", "LeverName")
            ):
                continue
            for word, said in (("cause", cause_spelled(node, causes)),
                               ("action", action_spelled(node, actions)),
                               ("lever", lever_spelled(node))):  # fmt: skip
                found[word] += [f"{path}:{getattr(node, 'lineno', 0)}: {s!r}" for s in said]
    return {word: sorted(set(places)) for word, places in found.items()}


def members_named() -> dict[str, int]:
    """How often the code names each enum's members (``Cause.X`` ...): the scan's own check."""
    counts = {"Cause": 0, "RoundAction": 0, "LeverName": 0}
    for _path, tree in code_scan.sources(ROOT):
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and name_of(node.value) in counts:
                counts[str(name_of(node.value))] += 1
    return counts


def test_causes_verdict_actions_and_lever_names_are_named_by_their_members():
    """0 bare strings: the product and the benchmarks name each word by its member."""
    assert spelled() == {"cause": [], "action": [], "lever": []}


def test_the_scan_sees_the_members_the_code_names():
    """A scan that saw nothing would pass the test above: the writers name the members."""
    named = members_named()
    assert named["Cause"] >= 30 and named["RoundAction"] >= 10 and named["LeverName"] >= 20


def test_the_scan_would_find_bare_words(tmp_path, monkeypatch):
    """The scan fails on what it exists to catch: each word spelled in each place it goes."""
    code = (
        'note(Kind.STOPPED, cause="hang", why="x")\n'
        'if e.get("cause") == "grow": pass\n'
        "def decision(action, why, cause): ...\n"
        "def send(self, cause, job_id): ...\n"
        'decision(Action.FAIL, "x", "no nodes")\n'
        'own_notice.send("hang", job)\n'
        'BLAMED = frozenset({"crash", "infrastructure"})\n'
        'def report(): return ("crash", "a rank died"), False\n'
        'if verdict.action == "requeue": pass\n'
        'write_verdict(RoundVerdict("stop", "why"))\n'
        "class RoundVerdict:\n    action: str\n    why: str\n"
        'if args.action == "requeue": pass\n'  # argparse's subcommand: no verdict
        'if "pack" in on: pass\n'
        'levers_on("gelu", LeverName.PACK)\n'
        'EXACT = ("gelu", "pad-check")\n'
        'MARKS = ("scaled_dot_product", "flash")\n'  # a kernel's name among others: no lever
    )
    (tmp_path / "hpc_train").mkdir()
    (tmp_path / "hpc_train" / "probe.py").write_text(code)
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    lines = {
        word: sorted(int(p.split(":")[1]) for p in places) for word, places in spelled().items()
    }
    assert lines == {
        "cause": [1, 2, 5, 6, 7, 7, 8],
        "action": [9, 10],
        "lever": [15, 16, 17, 17],
    }


def test_each_member_is_the_string_it_always_was():
    """The ledger's ``stopped`` lines, the verdict file and the submit options keep their
    strings: a member written is the old string, read back it compares equal to the member."""
    assert {str(c) for c in Cause} == {
        "notice", "crash", "infrastructure", "user error", "hang", "straggler", "bad node",
        "no progress", "no nodes", "cancelled", "grow", "finished", "storage", "bad checkpoint",
    }  # fmt: skip
    assert [str(a) for a in RoundAction] == ["restart", "requeue", "stop", "done"]
    assert [str(lever.name) for lever in levers.LEVERS] == [
        "compile", "flash", "fused-adamw", "gelu", "pad-check", "host-sizes", "lazy-stats",
        "foreach-grads", "pack",
    ]  # fmt: skip
    assert json.dumps({"cause": Cause.USER_ERROR}) == '{"cause": "user error"}'


def test_a_cause_and_a_verdict_go_through_their_files_as_strings_and_back(tmp_path):
    run = RunDir(tmp_path)
    ledger.record(run.ledger, Kind.STOPPED, "41", 0, cause=Cause.USER_ERROR, why="x")
    assert '"cause": "user error"' in run.ledger.read_text()
    (event,) = ledger.read(run.ledger)
    assert event.get("cause") == Cause.USER_ERROR and Cause(event.get("cause")) is Cause.USER_ERROR
    write_verdict(run, "41", 0, RoundVerdict(RoundAction.FAIL, "no restart left"))
    assert json.loads(run.round_verdict("41", 0).read_text())["action"] == "stop"
    verdict = read_verdict(run, "41", 0)
    assert verdict is not None and verdict.action is RoundAction.FAIL

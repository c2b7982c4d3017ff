"""Check your running jobs from outside them: stalls, stuck exits, requeue storms, pending jobs
that will never start, save dirs that vanished. Each finding comes with the command that fixes it.

Examples:
    hpc-train doctor                                  # your runs (your runs index), read-only
    hpc-train doctor --act --notify https://hooks.example.com/T0/B0/X
    hpc-train doctor --act --notify 'mail -s hpc-train ops@example.com'
    hpc-train doctor --all-users --json               # the head node: every user's jobs, read-only

The in-job watchers (the hang watchdog, the stuck-agent kill) are the first line; the doctor is
the second, from the head node, for what they cannot see (a watcher that is itself stuck, a job
that never starts). What it checks, per run whose job Slurm has not ended:

    stalled        RUNNING, no update for longer than the watchdog's allowance + --margin, and no
                   in-job verdict for this start (no incident, no round verdict, no stop). Sure
                   (acted on) past twice that, or at once without heartbeats (--no-watchdog).
                   Fix: ``scontrol requeue JOB``.
    stuck-at-exit  RUNNING, training is over (max update reached, its checkpoint or ``finished``
                   in the ledger), nothing written for --exit-grace: a torchrun agent or launcher
                   that never exits. Fix: ``scancel JOB`` (the final checkpoint is on disk).
    requeue-storm  --storm-restarts restarts within --storm-window (the ledger's, else Slurm's
                   Restarts). Fix: ``scontrol requeuehold JOB`` (``hold`` when pending), then read
                   the causes (``hpc-train status JOB``) before ``scontrol release JOB``.
    pending-forever PENDING for a reason that does not clear by itself: a partition down or
                   inactive, a required node drained, down or quarantined. Fix: per reason.
    save-dir       the save dir is gone or unreadable while the job runs. Fix: ``scancel JOB``.
    storage        the save dir's file system has no room for the next save and a save on notice
                   (2 x the last checkpoint's size; the free space, the checkpoint's size and the
                   last verified checkpoint said). Fix: free space there (``status`` names the
                   checkpoints set aside), or raise the quota.
    ledger         a corrupt line in the run's ledger (skipped by every reader; said here).

``--act`` runs the fix of every *sure* finding (stall, stuck exit, storm) through Slurm;
``--notify`` is told of every finding (with or without ``--act``: the head node's read-only
timer notifies): a URL gets the finding as JSON by POST (a Slack or
Alertmanager-style webhook), anything else runs as ``sh -c CMD`` with the JSON on stdin (as the
launcher's ``--notify``). A finding is told once while it stands unchanged, again after
``--renotify`` (6 h) or when it changes (sure now, another fix or verdict); the record is
``doctor-notified.json`` in ``$STATE_DIRECTORY`` (systemd's) or the user's state dir.
Exit status: 0 nothing found, 1 findings, 2 bad input.

``--all-users`` (the head node, read-only: ``--act`` is refused with it) reads Slurm's job list
once (``scontrol show job -o``: every user's jobs) and finds each job's save dir from its StdOut
path: ``submit`` sends a job's logs to ``<save dir>/slurm/%j_%t_log.out``, so a job whose StdOut
sits in a ``slurm/`` dir beside a ``.hpc-train/`` dir is a run of this toolkit (``metrics.maybe_run``:
a save dir gone or not ours to look into is kept, to be a finding). The user's own runs
index is read too. Reading other users' save dirs needs read permission on them (a shared
group on FSx); an unreadable one is a finding, never a traceback.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from hpc_core import ledger, slurm
from hpc_core.ledger import Kind
from hpc_core.rundir import RunDir, atomic_write
from hpc_train import cli
from hpc_train.contract import STOPPING
from hpc_train.faults import suspects
from hpc_train.runs import index, storage
from hpc_train.runs.metrics import RunView, all_jobs_runs, job_records, observe

NOTIFY_TIMEOUT_S = 10.0
RENOTIFY_S = 6 * 3600.0  # a finding that persists is told again this often (--renotify)
NOTIFIED = "doctor-notified.json"  # what was told, in the state dir (notified_path)
FORGET_S = 7 * 24 * 3600.0  # a record of a run no pass has checked for this long is dropped
STALL, EXIT, STORM, PENDING, SAVE_DIR, LEDGER, STORAGE = (
    "stalled", "stuck-at-exit", "requeue-storm", "pending-forever", "save-dir", "ledger", "storage",
)  # fmt: skip
# Reasons Slurm gives a pending job that no scheduling pass will clear by itself.
NEVER_CLEARS = ("PartitionDown", "PartitionInactive", "PartitionConfig", "BadConstraints",
                "PartitionNodeLimit", "ReqNodeNotAvail", "InvalidAccount", "InvalidQOS")  # fmt: skip
UNAVAILABLE_RE = re.compile(r"UnavailableNodes:(\S+)")
GONE_NODE_STATES = ("drain", "down", "fail", "maint", "inval")


@dataclass(frozen=True)
class Limits:
    margin_s: float = 60.0  # past the watchdog's allowance
    exit_grace_s: float = 120.0  # a finished run's job still RUNNING this long after its last write
    storm_restarts: int = 3
    storm_window_s: float = 3600.0


@dataclass(frozen=True)
class RunFinding:
    check: str
    job: str
    run: str
    save_dir: str
    what: str  # one line
    fix: str  # the command that fixes it (a shell line)
    sure: bool = False  # --act runs ``action`` (only for sure findings)
    action: tuple[str, ...] = ()  # the Slurm client command --act runs

    def describe(self) -> str:
        tag = " [sure]" if self.sure else ""
        return (
            f"{self.check}{tag}: job {self.job or '-'} ({self.run}): {self.what}\n  fix: {self.fix}"
        )

    def as_json(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if k != "action"}


# --- the checks (pure: a view, the node states, the limits) ---------------------------------


def diagnose(
    view: RunView, limits: Limits = Limits(), node_states: dict[str, str] | None = None
) -> list[RunFinding]:
    """What is wrong with one run whose job Slurm has not ended."""
    job, name, save = view.labels
    out: list[RunFinding] = []

    def found(check: str, what: str, fix: str, action: Sequence[str] = ()) -> None:
        out.append(RunFinding(check, job, name, save, what, fix, bool(action), tuple(action)))

    for check, what, fix in file_problems(view):
        found(check, what, fix)
    state = view.job_state
    if state is None or state.finished:
        return out
    short = short_of_room(view)
    if short is not None:
        found(STORAGE, *short)
    storm = storm_count(view, limits)
    if storm >= limits.storm_restarts:
        hold = "requeuehold" if state.state == "RUNNING" else "hold"
        found(STORM, f"{storm} restarts within {limits.storm_window_s:.0f} s ({state.state})",
              f"scontrol {hold} {job}  # read `hpc-train status {job}`, then `scontrol release {job}`",
              ("scontrol", hold, job))  # fmt: skip
    if state.state == "PENDING":
        why = pending_forever(state.reason, view, node_states or {})
        if why is not None:
            found(PENDING, why[0], why[1])
        return out
    if state.state != "RUNNING" or view.missing:
        return out
    progress = view.last_progress
    if progress is None:
        return out
    idle = view.now - progress
    if training_over(view):
        if idle > limits.exit_grace_s:
            found(EXIT, f"training is over (update {view.summary.updates}/{view.max_update}) "
                  f"but the job still runs, nothing written for {idle:.0f} s",
                  f"scancel {job}  # the final checkpoint is on disk", ("scancel", job))  # fmt: skip
        return out
    allowance = view.judged_allowance_s()[0] + limits.margin_s  # the alert's, too
    if idle <= allowance:
        return out
    verdict = in_job_verdict(view)
    watched = bool(view.beats)
    if verdict is None:
        sure = not watched or idle > 2 * allowance
        what = (f"no update for {idle:.0f} s (allowance {allowance:.0f} s with the margin) at "
                f"update {view.summary.updates}, and no in-job verdict"
                + ("" if watched else " (no heartbeats: --no-watchdog)"))  # fmt: skip
    else:
        sure = idle > 2 * allowance
        what = f"no update for {idle:.0f} s although the in-job watcher said: {verdict}"
    found(STALL, what, f"scontrol requeue {job}  # resumes from the last checkpoint",
          ("scontrol", "requeue", job) if sure else ())  # fmt: skip
    return out


def file_problems(view: RunView) -> list[tuple[str, str, str]]:
    """(check, what, fix) of each problem with the run's files: a save dir gone while the job
    runs (it can save nowhere), a ledger line no reader can use."""
    job, _, save = view.labels
    if view.missing:
        fix = f"scancel {job}  # then restore the save dir, and resubmit"
        return [(SAVE_DIR, f"{p} while the job is {view.state}: it can save nowhere", fix)
                for p in view.problems]  # fmt: skip
    fix = f"less {RunDir(Path(save)).ledger}  # the line is skipped by every reader"
    return [(LEDGER, problem, fix) for problem in view.problems]


def short_of_room(view: RunView) -> tuple[str, str] | None:
    """(what, fix) when the save dir's file system has no room for the next save and a save on
    notice (``runs.storage``): the room, a checkpoint's size, the last verified checkpoint."""
    if view.missing:
        return None
    found = storage.of(RunDir(view.run.save_dir), view.events, view.room)
    short = found.short()
    if short is None or found.room is None:
        return None
    aside = f"; {len(found.set_aside)} checkpoint(s) set aside there" if found.set_aside else ""
    what = (
        f"no room for the next save and a save on notice: {short}{aside}; {found.verified_line()}"
    )
    return (
        what,
        f"df -h {found.room.path}  # free space there (or raise the quota) before the next save",
    )


def training_over(view: RunView) -> bool:
    """Has the run trained to its end (train.log, the ranks' phase, the ledger)?"""
    start = view.current_start
    done = view.max_update is not None and view.summary.updates >= view.max_update
    finished = start is not None and any(
        e.kind == Kind.FINISHED and (e.job, e.restart) == (start.job, start.restart)
        for e in view.events
    )
    return done or finished or (view.phase == STOPPING and bool(view.beats))


def in_job_verdict(view: RunView) -> str | None:
    """What the in-job watchers said of the current start, if anything."""
    start = view.current_start
    if start is None:
        return None
    rd = RunDir(Path(view.labels[2]))
    if view.start_ended():
        return "the start ended (ledger)"
    try:
        if rd.round_verdict(start.job, start.restart).exists():
            return "a round verdict (restart, requeue or stop)"
        if rd.incident(start.job, start.restart).exists():
            return "a hang incident"
    except OSError:
        return None
    return None


def storm_count(view: RunView, limits: Limits) -> int:
    """Restarts within the storm window: the ledger's starts after the run's first (a restart
    is a start that had one before it, however long ago the first was); without a ledger,
    Slurm's Restarts of the job."""
    if view.events:
        starts = sorted(e.time for e in view.events if e.kind == Kind.STARTED)
        return sum(1 for t in starts[1:] if view.now - t <= limits.storm_window_s)
    return view.job_state.restarts if view.job_state else 0


def pending_forever(
    reason: str, view: RunView, node_states: dict[str, str]
) -> tuple[str, str] | None:
    """(what, fix) when ``reason`` will not clear by itself; None when it will (or may)."""
    job = view.labels[0]
    if not any(mark in reason for mark in NEVER_CLEARS):
        return None
    if "Partition" in reason and "Node" not in reason:
        return (f"pending: {reason}",
                f"scontrol show partition  # then `scontrol update partitionname=P state=up` "
                f"or `scontrol update jobid={job} partition=OTHER`")  # fmt: skip
    if "ReqNodeNotAvail" in reason:
        listed = UNAVAILABLE_RE.search(reason)
        names = listed.group(1).split(",") if listed else []
        held = {n.node for n in suspects.quarantined(view.events)}
        gone = sorted(
            n for n in names
            if n in held or any(s in node_states.get(n, "") for s in GONE_NODE_STATES)
        )  # fmt: skip
        if not gone:
            return None  # unavailable for now (allocated, powering up): it may clear
        why = ", ".join(f"{n} ({'quarantined' if n in held else node_states.get(n, '?')})"
                        for n in gone)  # fmt: skip
        return (f"pending on nodes that will not come back by themselves: {why}",
                f"scontrol update jobid={job} ExcNodeList={','.join(gone)}  # or, once checked, "
                f"`scontrol update nodename={gone[0]} state=resume`")  # fmt: skip
    return (
        f"pending: {reason}",
        f"scontrol show job {job}  # then fix the request or scancel {job}",
    )


# --- finding the runs, and acting ------------------------------------------------------------


def notify(target: str, finding: RunFinding, log: Callable[[str], None]) -> bool:
    """Tell ``target`` (a URL: POST JSON; else ``sh -c`` with the JSON on stdin) of a finding."""
    body = json.dumps({"source": "hpc-train doctor", "time": time.time(), **finding.as_json(),
                       "text": finding.describe()})  # fmt: skip
    try:
        if re.match(r"https?://", target):
            req = urllib.request.Request(
                target, body.encode(), {"Content-Type": "application/json"}, method="POST"
            )
            with urllib.request.urlopen(req, timeout=NOTIFY_TIMEOUT_S) as resp:
                return 200 <= resp.status < 300
        proc = subprocess.run(["sh", "-c", target], input=body, text=True, capture_output=True,
                              timeout=NOTIFY_TIMEOUT_S)  # fmt: skip
        if proc.returncode != 0:
            log(f"--notify command exited {proc.returncode}")
        return proc.returncode == 0
    except (OSError, ValueError, subprocess.TimeoutExpired, urllib.error.URLError) as err:
        log(f"--notify failed: {err}")
        return False


def notified_path() -> Path:
    """Where the record of what was notified lives: systemd's ``$STATE_DIRECTORY`` when the
    unit has a ``StateDirectory=`` (the head node's service sees the home read-only), else the
    user's state dir, beside the runs index (``ledger.user_index``)."""
    systemd = os.environ.get("STATE_DIRECTORY", "").split(":")[0]
    return (Path(systemd) if systemd else ledger.user_index().parent) / NOTIFIED


def fingerprint(finding: RunFinding) -> str:
    """What makes a finding the same as last pass's: its check, whether it is sure, its fix, and
    its words without their numbers (the idle seconds grow every pass; a changed verdict or
    reason is news)."""
    words = re.sub(r"\d+(?:\.\d+)?", "N", finding.what)
    return f"{finding.check}|{finding.sure}|{finding.fix}|{words}"


def notify_changed(
    target: str,
    findings: Sequence[RunFinding],
    checked: Sequence[str],
    log: Callable[[str], None],
    now: float | None = None,
    renotify_s: float = RENOTIFY_S,
    path: Path | None = None,
) -> list[RunFinding]:
    """Notify ``target`` of the findings that are new or changed since they were last told,
    or were told ``renotify_s`` ago (0: every pass): the head node's timer runs every 5 minutes
    and would otherwise repeat a standing finding 12 times an hour. A finding that went away is
    forgotten (so its return is news again). The record (``notified_path``) is written
    atomically; one that cannot be read or written costs only repeats, never a pass.
    Returns the findings told."""
    now = time.time() if now is None else now
    path = notified_path() if path is None else path
    who = hashlib.sha256(target.encode()).hexdigest()[:16]  # a webhook URL may be a secret
    record: dict[str, Any] = {}
    try:
        record = json.loads(path.read_text())
        if not isinstance(record, dict):
            raise ValueError("not a JSON object")
    except FileNotFoundError:
        record = {}
    except (OSError, ValueError) as err:
        log(f"notified record {path} not read ({err}): notifying every finding")
        record = {}
    mine = record.get(who)
    told: dict[str, Any] = mine if isinstance(mine, dict) else {}
    checked_dirs = set(checked)
    current = {f"{f.check} {f.job} {f.save_dir}": f for f in findings}
    kept = {
        key: entry for key, entry in told.items()
        if isinstance(entry, dict)
        and (key in current or (entry.get("save_dir") not in checked_dirs
                                and now - told_at(entry) < FORGET_S))
    }  # fmt: skip
    sent = []
    for key, f in current.items():
        entry = kept.get(key)
        said = fingerprint(f)
        fresh = (entry is not None and entry.get("fingerprint") == said
                 and now - told_at(entry) < renotify_s)  # fmt: skip
        if fresh:
            continue
        if notify(target, f, log):
            kept[key] = {"fingerprint": said, "time": now, "save_dir": f.save_dir}
            sent.append(f)
        else:
            kept.pop(key, None)  # not told: told again next pass
    record[who] = kept
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, json.dumps(record, indent=1, sort_keys=True) + "\n")
    except OSError as err:
        log(f"notified record {path} not written ({err.strerror or err}): the next pass "
            "notifies these findings again")  # fmt: skip
    return sent


def told_at(entry: dict[str, Any]) -> float:
    """When a record entry was told (0, long ago, for a garbled one: it is told again)."""
    try:
        return float(entry.get("time", 0))
    except (TypeError, ValueError):
        return 0.0


def act(finding: RunFinding, log: Callable[[str], None]) -> bool:
    """Run a sure finding's fix through Slurm; True when Slurm took it."""
    if not finding.sure:
        return False
    try:
        slurm.run(list(finding.action))
    except slurm.SlurmError as err:
        log(f"{' '.join(finding.action)}: {err}")
        return False
    log(f"acted: {' '.join(finding.action)}")
    return True


def check(
    runs: Sequence[index.Run],
    states: dict[str, slurm.JobState],
    limits: Limits,
    now: float | None = None,
) -> list[RunFinding]:
    """Findings for every run whose job Slurm has not ended (the node states asked only when a
    pending job waits for nodes)."""
    now = time.time() if now is None else now
    views = [observe(r, states.get(r.job or ""), now) for r in runs]
    live = [v for v in views if v.job_state is not None and not v.job_state.finished]
    nodes: dict[str, str] = {}
    if any("ReqNodeNotAvail" in (v.job_state.reason if v.job_state else "") for v in live):
        try:
            nodes = slurm.partition_nodes(None)
        except slurm.SlurmError:
            nodes = {}
    return [f for v in live for f in diagnose(v, limits, nodes)]


# --- the command line -----------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = cli.Parser(
        prog="hpc-train doctor",
        description=(__doc__ or "").split("\n\n")[0],
        epilog=cli.examples(__doc__, "hpc-train doctor"),
    )
    p.add_argument("runs", nargs="*", metavar="RUN", help="save dirs or job ids (default: all)")
    p.add_argument(
        "--all-users",
        action="store_true",
        help="every user's jobs (Slurm's job list), read-only: the head node",
    )
    p.add_argument(
        "--act",
        action="store_true",
        help="run the fix of each sure finding through Slurm (your own runs)",
    )
    p.add_argument(
        "--notify",
        metavar="URL|CMD",
        help="tell of every finding, with or without --act: a webhook URL (POST JSON) or a shell command (JSON on stdin)",
    )
    p.add_argument(
        "--renotify",
        type=float,
        default=RENOTIFY_S,
        metavar="S",
        help="tell a finding that has not changed again after S seconds (0: every pass)",
    )
    p.add_argument("--json", action="store_true", help="one JSON list, for machines")
    d = Limits()
    p.add_argument(
        "--margin",
        type=float,
        default=d.margin_s,
        metavar="S",
        help="seconds past the watchdog's allowance before a stall is said",
    )
    p.add_argument(
        "--exit-grace",
        type=float,
        default=d.exit_grace_s,
        metavar="S",
        help="seconds a finished run's job may still run",
    )
    p.add_argument(
        "--storm-restarts",
        type=int,
        default=d.storm_restarts,
        metavar="N",
        help="restarts within --storm-window that make a storm",
    )
    p.add_argument("--storm-window", type=float, default=d.storm_window_s, metavar="S",
                   help="the storm's window in seconds")  # fmt: skip
    return p


def main(argv: list[str] | None = None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    if args.all_users and args.act:
        p.error("--all-users is read-only: --act acts on your own runs only")
    for flag, value in (("--margin", args.margin), ("--exit-grace", args.exit_grace),
                        ("--storm-window", args.storm_window), ("--renotify", args.renotify)):  # fmt: skip
        if value < 0:
            p.error(f"{flag} {value:g}: seconds cannot be negative")
    if args.storm_restarts < 1:
        p.error(f"--storm-restarts {args.storm_restarts}: at least 1")
    limits = Limits(args.margin, args.exit_grace, args.storm_restarts, args.storm_window)

    def log(msg: str) -> None:
        print(f"hpc-train doctor: {msg}", file=sys.stderr)

    try:
        runs = [index.resolve(a, log) for a in args.runs] if args.runs else index.user_runs(log)
    except index.RunNotFound as err:
        p.error(str(err))
    why = slurm.unreachable()
    if why is not None:
        p.error(f"Slurm cannot be asked ({why}): the doctor needs the controller")
    try:
        if args.all_users:
            found = all_jobs_runs(job_records())
            seen = {r.job for r, _ in found}
            states = {s.job_id: s for _, s in found}
            states.update(slurm.job_states([r.job for r in runs if r.job and r.job not in seen]))
            runs = [*[r for r, _ in found], *[r for r in runs if r.job not in seen]]
        else:
            states = slurm.job_states([r.job for r in runs if r.job])
    except slurm.SlurmError as err:
        p.error(str(err))
    findings = check(runs, states, limits)
    if args.json:
        print(json.dumps([f.as_json() for f in findings], indent=1))
    elif findings:
        print("\n".join(f.describe() for f in findings))
    else:
        print(f"no findings in {len(runs)} run(s)")
    if args.act:
        for f in findings:
            act(f, log)
    if args.notify:
        notify_changed(args.notify, findings, [str(r.save_dir) for r in runs], log,
                       renotify_s=args.renotify)  # fmt: skip
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())

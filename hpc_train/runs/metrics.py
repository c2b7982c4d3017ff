"""Your runs in Prometheus: their progress, losses, restarts and goodput as metrics.

Examples:
    hpc-train metrics serve                          # http://127.0.0.1:9478/metrics
    hpc-train metrics serve --port 9478 --address 0.0.0.0
    hpc-train metrics write /var/lib/node_exporter/textfile  # hpc_train.prom, atomic
    hpc-train metrics write - --save-dir /lustre/runs/roberta  # print one run's metrics

Every scrape reads what the toolkit already keeps: the runs index (``hpc-train status``'s list),
each run's ledger, its train.log, its ranks' heartbeats (``hpc_train.contract.read_beats``) and
Slurm's word on every job in ONE ``scontrol show job`` (after a ``ping``; a dead controller is
``hpc_train_slurm_up 0``, and the states then come from the ledgers). The goodput is
``hpc_train.planning.goodput``'s, as ``hpc-train status`` shows it. Nothing is cached: a scrape is a
fresh read (a few small files per run). Labels: ``job`` (the newest Slurm job of the run),
``run`` (its name), ``save_dir``. See docs/operations.md for the alert rules over these.
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import itertools
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from hpc_core import ledger, slurm, space
from hpc_core.ledger import Kind
from hpc_core.rundir import RunDir, atomic_write
from hpc_train import cli
from hpc_train.contract import Beat, read_beats
from hpc_train.job.limits import HangLimits
from hpc_train.planning import goodput
from hpc_train.runs import follow, index, storage
from hpc_train.runs.logparse import RunSummary
from hpc_train.runs.named_nodes import NodeNote, node_notes
from hpc_train.watch import hangs

DEFAULT_PORT = 9478  # unassigned in Prometheus' default-port allocations list
TEXTFILE = "hpc_train.prom"  # node_exporter's textfile collector reads *.prom
PREFIX = "hpc_train"
LABELS = ("slurm_job", "run", "save_dir")  # "job" is the scrape job's (Prometheus target label)
DEFAULT_HANG = HangLimits()  # a run submitted before its ledger recorded its own


# --- what one scrape knows of one run -------------------------------------------------------


@dataclass
class RunView:
    """One run as the metrics and the doctor see it, read once per scrape (or doctor pass)."""

    run: index.Run
    state: str  # Slurm's state while it knows the job, else the ledger's (index.ledger_state)
    job_state: slurm.JobState | None
    events: list[ledger.Event] = field(default_factory=list)
    summary: RunSummary = field(default_factory=RunSummary)
    beats: list[Beat] = field(default_factory=list)  # the current start's ranks
    problems: list[str] = field(default_factory=list)  # corrupt ledger lines, unreadable files
    missing: bool = False  # the save dir is gone (or unreadable)
    now: float = 0.0
    room: space.Space | None = None  # its file system's room (``runs.storage``; None: unknown)

    @property
    def labels(self) -> tuple[str, str, str]:
        job = self.run.job or (self.job_state.job_id if self.job_state else "")
        return (job or "", self.run.name or self.run.save_dir.name, str(self.run.save_dir))

    @property
    def alive(self) -> bool:
        return self.job_state is not None and not self.job_state.finished

    @property
    def current_start(self) -> ledger.Event | None:
        starts = [e for e in self.events if e.kind == Kind.STARTED]
        return starts[-1] if starts else None

    def start_ended(self) -> bool:
        """Did the current start end by the launcher's own word (stopped or finished)?"""
        start = self.current_start
        return start is not None and any(
            e.kind in goodput.ENDS and (e.job, e.restart) == (start.job, start.restart)
            for e in self.events
        )

    @property
    def max_update(self) -> int | None:
        return self.run.max_update or self.summary.max_update

    @property
    def last_progress(self) -> float | None:
        """When the run last completed an update: the newest heartbeat at the highest update
        (the current start), else train.log's last write, else the current start's events."""
        if self.beats:
            reached = max(b.update for b in self.beats)
            return max(b.time for b in self.beats if b.update == reached)
        times = [e.time for e in self.events if e.kind in (Kind.FIRST_UPDATE, Kind.CHECKPOINT)]
        with contextlib.suppress(OSError):
            times.append(RunDir(self.run.save_dir).train_log.stat().st_mtime)
        start = self.current_start
        if start is not None:
            times = [t for t in times if t >= start.time] or [start.time]
        return max(times) if times else None

    @property
    def phase(self) -> str | None:
        """What the ranks went on to do after their last update (the newest beat's word)."""
        return max(self.beats, key=lambda b: b.time).phase if self.beats else None

    def _submitted(self) -> ledger.Event | None:
        submitted = [e for e in self.events if e.kind == Kind.SUBMITTED]
        return submitted[-1] if submitted else None

    @property
    def hang_limits(self) -> HangLimits:
        """The run's own ``--hang-*`` allowances, as submit recorded them, with or without the
        in-job watchdog; a run recorded before they were (or a ``--no-watchdog`` run recorded
        without them): the defaults."""
        submitted = self._submitted()
        recorded = submitted.get("hang_limits") if submitted is not None else None
        return HangLimits(**recorded) if isinstance(recorded, dict) else DEFAULT_HANG

    @property
    def watched(self) -> bool:
        """Does an in-job watchdog act on this run's hangs (not ``--no-watchdog``)? Older
        ledgers said "none" by ``hang_limits: null``."""
        submitted = self._submitted()
        if submitted is None:
            return True
        if "watchdog" in submitted.data:
            return bool(submitted.get("watchdog"))
        return "hang_limits" not in submitted.data or submitted.get("hang_limits") is not None

    def hang_allowance_s(self) -> float:
        """The allowance now (``watch.hangs.allowance``, the monitor's own rule) for the ranks'
        newest beats under the run's limits."""
        limits = self.hang_limits
        return max((hangs.allowance(b, limits) for b in self.beats), default=limits.startup_s)

    def judged_allowance_s(self) -> tuple[float, bool]:
        """(the allowance a stall is judged by from outside the job, is an in-job watchdog
        acting on it): a ``--no-watchdog`` run is judged by its own limits (the defaults unless
        it gave ``--hang-*``), so the alert and the doctor still see it stall; the flag tells that
        nothing inside the job will act on it."""
        return self.hang_allowance_s(), self.watched

    @property
    def checkpoints(self) -> list[ledger.Event]:
        return [e for e in self.events if e.kind == Kind.CHECKPOINT]

    def checkpoint_interval_s(self) -> float | None:
        """The median time between saves: the current start's once it has saved twice (its
        pace now), else the run's across all its starts, so a resumed run is held to the pace
        it had (else the stale-checkpoint alert is blind after every requeue until two new
        saves). Only gaps inside one start count: one across a restart holds a queue wait."""
        starts = sorted(e.time for e in self.events if e.kind == Kind.STARTED)
        by_start: dict[int, list[float]] = {}
        for e in self.checkpoints:
            by_start.setdefault(bisect.bisect_right(starts, e.time), []).append(e.time)

        def gaps(times: list[float]) -> list[float]:
            return [b - a for a, b in itertools.pairwise(sorted(times)) if b > a]

        current = gaps(by_start.get(len(starts), []))
        every = current or [g for times in by_start.values() for g in gaps(times)]
        return statistics.median(every) if every else None

    def checkpoint_age_s(self) -> float | None:
        """Seconds the run has gone without a save while it could save: since the last save,
        or since the current start if that is later (a resume's queue wait is not a stale
        checkpoint). None: never saved."""
        saved = self.last_checkpoint_time()
        if saved is None:
            return None
        start = self.current_start
        return max(0.0, self.now - max(saved, start.time if start is not None else saved))

    def last_checkpoint_time(self) -> float | None:
        saves = self.checkpoints
        if saves:
            return saves[-1].time
        try:
            return RunDir(self.run.save_dir).checkpoint_last.stat().st_mtime
        except OSError:
            return None

    def pending_since(self) -> float | None:
        """When the job last went back to the queue (its submission, a requeue, a stop)."""
        if self.job_state is None or self.job_state.state != "PENDING":
            return None
        marks = [
            e.time for e in self.events if e.kind in (Kind.SUBMITTED, Kind.REQUEUED, Kind.STOPPED)
        ]
        return max(marks) if marks else None

    def goodput(self) -> goodput.Goodput | None:
        if not self.events:
            return None
        end = self.now if self.alive else max(e.time for e in self.events)
        return goodput.account(self.events, end)

    def nodes_named(self) -> list[NodeNote]:
        return node_notes(self.events)


def current_beats(run: RunDir, start: ledger.Event | None) -> list[Beat]:
    """Every rank's latest heartbeat in ``start`` (each node's directory of it)."""
    if start is None:
        return []
    base = run.state / "heartbeats" / f"{start.job}-{start.restart}"
    try:
        nodes = sorted(p for p in base.iterdir() if p.is_dir())
    except OSError:
        return []
    return [beat for node in nodes for beat in read_beats(node)]


def observe(run: index.Run, job_state: slurm.JobState | None, now: float) -> RunView:
    """Everything one scrape (or one doctor pass) knows of ``run``; never raises on a bad file:
    a corrupt ledger line, an unreadable save dir are ``problems``, a vanished one ``missing``."""
    problems: list[str] = []
    rd = run.dir
    view = RunView(run, "UNKNOWN", job_state, problems=problems, now=now)
    try:
        rd.root.stat()
        if not rd.root.is_dir():
            view.missing = True
            problems.append(f"save dir {rd.root} is not a directory")
        else:
            next(iter(rd.root.iterdir()), None)  # an unreadable directory raises here
    except FileNotFoundError:
        view.missing = True
        problems.append(f"save dir {rd.root} is gone")
    except OSError as err:
        view.missing = True
        problems.append(f"save dir {rd.root} cannot be read: {err.strerror or err}")
    if not view.missing:
        try:
            view.events = ledger.read(rd.ledger, problems.append)
        except OSError as err:
            problems.append(f"ledger {rd.ledger} cannot be read: {err.strerror or err}")
        try:
            view.summary = follow.run_summary(rd, run.max_update)
        except OSError as err:
            problems.append(f"train.log {rd.train_log} cannot be read: {err.strerror or err}")
        view.beats = current_beats(rd, view.current_start)
        view.room = storage.measure(rd)
    if job_state is not None and job_state.state != "GONE":
        view.state = job_state.state
    else:
        view.state = index.ledger_state(view.events) if not view.missing else "MISSING"
    return view


Source = Callable[[], tuple[list[index.Run], dict[str, slurm.JobState] | None]]


def observe_all(
    runs: Sequence[index.Run],
    now: float | None = None,
    warn: Callable[[str], None] | None = None,
    states: dict[str, slurm.JobState] | None = None,
) -> tuple[list[RunView], bool]:
    """Every run's view, with Slurm asked once for all their jobs (unless ``states`` already
    says); (views, Slurm answered)."""
    now = time.time() if now is None else now
    jobs = [r.job for r in runs]
    said = index.slurm_states(jobs, warn) if states is None else states
    answered = bool(said) or not any(jobs)
    return [observe(r, said.get(r.job or ""), now) for r in runs], answered


def job_records() -> list[dict[str, str]]:
    """Every job Slurm remembers, every user's, in one query (``scontrol show job -o``)."""
    out = slurm.run(["scontrol", "show", "job", "-o"])
    return [slurm.parse_record(line) for line in out.splitlines() if line.startswith("JobId=")]


def all_jobs_runs(records: Sequence[dict[str, str]]) -> list[tuple[index.Run, slurm.JobState]]:
    """Runs of this toolkit among Slurm's jobs (every user's): ``submit`` sends a job's logs to
    ``<save dir>/slurm/``, so a StdOut there names the save dir, if that dir is a run's (its
    ``.hpc-train`` state dir is there: many jobs log to some ``slurm/`` dir)."""
    out = []
    for rec in records:
        stdout = Path(rec.get("StdOut", "") or "/")
        if stdout.parent.name != RunDir(Path("/")).slurm_logs.name:
            continue
        if not maybe_run(stdout.parent.parent):
            continue
        job = rec.get("JobId", "")
        run = index.Run(stdout.parent.parent, job, rec.get("JobName", ""))
        state = slurm.JobState(job, rec.get("JobState", "UNKNOWN").split()[0],
                               int(rec.get("Restarts", "0") or 0), rec.get("NodeList", ""),
                               rec.get("Reason", ""))  # fmt: skip
        out.append((run, state))
    return out


def maybe_run(save: Path) -> bool:
    """Is ``save`` a run's save dir, or one whose word is lost (gone, or not ours to look
    into: the doctor says so, as a finding)? False only for a dir that is there, readable,
    without ``.hpc-train``."""
    try:
        save.stat()
    except OSError:
        return True  # gone or unreadable: observe() makes it a problem, not a silent skip
    try:
        RunDir(save).state.stat()
    except (FileNotFoundError, NotADirectoryError):
        return False
    except OSError:
        return True  # cannot look into it (permissions): as above
    return True


def everyone(mine: Callable[[], list[index.Run]]) -> Source:
    """Every user's runs that Slurm still knows (one query), and ``mine`` (their states from
    the same query: a job it does not list is GONE)."""

    def source() -> tuple[list[index.Run], dict[str, slurm.JobState] | None]:
        found = all_jobs_runs(job_records())
        seen = {r.job for r, _ in found}
        own = [r for r in mine() if r.job not in seen]
        states = {s.job_id: s for _, s in found}
        for r in own:
            if r.job:
                states[r.job] = slurm.JobState(r.job, "GONE", 0, "", "")
        return [*(r for r, _ in found), *own], states

    return source


# --- the exposition -------------------------------------------------------------------------


@dataclass
class Family:
    """One metric family: its samples as (label values, value)."""

    name: str
    kind: str  # gauge or counter
    help: str
    labels: tuple[str, ...] = LABELS
    samples: list[tuple[tuple[str, ...], float]] = field(default_factory=list)

    def add(self, labels: Iterable[str], value: float | None) -> None:
        if value is not None:
            self.samples.append((tuple(labels), float(value)))


def families(views: Sequence[RunView], slurm_up: bool, scrape_s: float = 0.0) -> list[Family]:
    """The metric families of these runs (pure: ``views`` say everything)."""
    f = _run_families()
    for v in views:
        _add_run(f, v)
    return [*f.values(), *_scrape_families(views, slurm_up, scrape_s)]


def _run_families() -> dict[str, Family]:
    """The per-run families, empty, by a short key."""
    return {
        "info": Family("run_info", "gauge", "a run the toolkit knows (value 1)",
                       (*LABELS, "max_update")),
        "state": Family("run_state", "gauge", "the run's state (Slurm's, else its ledger's): 1",
                        (*LABELS, "state")),
        "update": Family("run_update", "gauge", "the highest update trained (train.log)"),
        "max_update": Family("run_max_update", "gauge", "the update the run trains to"),
        "loss": Family("run_loss", "gauge", "the training loss at the last logged update"),
        "wps": Family("run_words_per_second", "gauge", "words/s of the last log interval"),
        "progress": Family("run_last_progress_timestamp_seconds", "gauge",
                           "when the run last completed an update (heartbeats, else train.log)"),
        "since_progress": Family("run_seconds_since_progress", "gauge",
                                 "seconds since the run last completed an update (alive runs)"),
        "allowance": Family("run_hang_allowance_seconds", "gauge",
                            "the in-job watchdog's allowance for the ranks' phase (the run's --hang-* limits; "
                            "watchdog=off: the default limits', nothing in the job acts)",
                            (*LABELS, "watchdog")),
        "since_ckpt": Family("run_seconds_since_checkpoint", "gauge",
                             "seconds since the last durable checkpoint or the current start, "
                             "the later (running jobs)"),
        "ckpt_interval": Family("run_checkpoint_interval_seconds", "gauge",
                                "median seconds between the saves of the current start, else "
                                "of the run's starts"),
        "ckpt_update": Family("run_checkpoint_update", "gauge", "the update of the last checkpoint"),
        "pending": Family("run_pending_seconds", "gauge",
                          "seconds the job has waited in the queue since it last went back to it"),
        "restarts": Family("run_restarts_total", "counter", "restarts of the run by the cause of "
                           "the start before", (*LABELS, "cause")),
        "ettr": Family("run_ettr_ratio", "gauge", "productive training time / wall time"),
        "wall": Family("run_wall_seconds_total", "counter", "wall time from submission"),
        "productive": Family("run_productive_seconds_total", "counter",
                             "productive training time"),
        "lost": Family("run_lost_seconds_total", "counter", "wall time not training, by cause",
                       (*LABELS, "cause")),
        "blamed": Family("node_blamed_total", "counter", "times the run blamed a node",
                         (*LABELS, "node")),
        "quarantined": Family("node_quarantined", "gauge",
                              "a node the run quarantined (blamed twice within a day): 1",
                              (*LABELS, "node")),
        "problems": Family("run_problems", "gauge",
                           "unreadable things in the run (corrupt ledger lines, a missing dir)"),
    }  # fmt: skip


def _add_run(f: dict[str, Family], v: RunView) -> None:
    """One run's samples into the per-run families ``f``."""
    lab = v.labels
    f["info"].add((*lab, str(v.max_update or "")), 1)
    f["state"].add((*lab, v.state), 1)
    f["problems"].add(lab, len(v.problems))
    if v.missing:
        return
    s = v.summary
    f["update"].add(lab, s.updates)
    f["max_update"].add(lab, v.max_update)
    f["loss"].add(lab, s.final_loss)
    f["wps"].add(lab, s.wps[-1] if s.wps else None)
    progress = v.last_progress
    f["progress"].add(lab, progress)
    if v.alive and v.job_state is not None and v.job_state.state == "RUNNING":
        f["since_progress"].add(lab, None if progress is None else max(0.0, v.now - progress))
        allowance, own = v.judged_allowance_s()
        f["allowance"].add((*lab, "on" if own else "off"), allowance)
        f["since_ckpt"].add(lab, v.checkpoint_age_s())  # a pending job saves nothing
    f["ckpt_interval"].add(lab, v.checkpoint_interval_s())
    if v.checkpoints:
        f["ckpt_update"].add(lab, float(v.checkpoints[-1].get("update", 0)))
    since = v.pending_since()
    f["pending"].add(lab, None if since is None else max(0.0, v.now - since))
    _add_restarts_and_goodput(f, v)
    _add_nodes(f, v)


def _add_restarts_and_goodput(f: dict[str, Family], v: RunView) -> None:
    """The run's restarts by cause and its goodput (ETTR, wall, productive, lost by cause)."""
    lab = v.labels
    causes: dict[str, int] = {}
    for _, why in goodput.restarts(v.events):
        cause = goodput.short_cause(why)
        causes[cause] = causes.get(cause, 0) + 1
    for cause, n in sorted(causes.items()):
        f["restarts"].add((*lab, cause), n)
    g = v.goodput()
    if g is None:
        return
    f["ettr"].add(lab, g.ettr)
    f["wall"].add(lab, g.wall_s)
    f["productive"].add(lab, g.productive_s)
    for cause, seconds in g.parts.items():
        if cause != "productive":
            f["lost"].add((*lab, cause.replace(" ", "_").replace("-", "")), seconds)


def _add_nodes(f: dict[str, Family], v: RunView) -> None:
    """The nodes the run blamed (times each) and those it quarantined."""
    blamed: dict[str, int] = {}
    held = set()
    for note in v.nodes_named():
        if note.kind == Kind.BLAMED:
            blamed[note.node] = blamed.get(note.node, 0) + 1
            if note.quarantined:
                held.add(note.node)
    for node, n in sorted(blamed.items()):
        f["blamed"].add((*v.labels, node), n)
    for node in sorted(held):
        f["quarantined"].add((*v.labels, node), 1)


def _scrape_families(views: Sequence[RunView], slurm_up: bool, scrape_s: float) -> list[Family]:
    """The scrape's own families: Slurm up, runs by state, the scrape's duration."""
    up = Family("slurm_up", "gauge", "1 when slurmctld answered this scrape", ())
    up.add((), 1 if slurm_up else 0)
    runs = Family("runs", "gauge", "runs the toolkit knows, by state", ("state",))
    by_state: dict[str, int] = {}
    for v in views:
        by_state[v.state] = by_state.get(v.state, 0) + 1
    for state, n in sorted(by_state.items()):
        runs.add((state,), n)
    took = Family("scrape_duration_seconds", "gauge", "seconds this scrape took to read", ())
    took.add((), scrape_s)
    return [up, runs, took]


class RunsCollector:
    """A prometheus_client collector: every ``collect`` reads the runs afresh."""

    def __init__(self, source: Source, warn: Callable[[str], None] | None = None) -> None:
        self.source = source
        self.warn = warn

    def families(self) -> list[Family]:
        began = time.monotonic()
        try:
            runs, states = self.source()
        except slurm.SlurmError as err:  # --all-users: no job list, no runs to show
            if self.warn is not None:
                self.warn(f"Slurm's job list not read: {err}")
            return families([], False, time.monotonic() - began)
        views, up = observe_all(runs, warn=self.warn, states=states)
        return families(views, up, time.monotonic() - began)

    def collect(self) -> Iterator[object]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        for fam in self.families():
            name = f"{PREFIX}_{fam.name}"
            if fam.kind == "counter":
                metric: CounterMetricFamily | GaugeMetricFamily = CounterMetricFamily(
                    name.removesuffix("_total"), fam.help, labels=fam.labels
                )
            else:
                metric = GaugeMetricFamily(name, fam.help, labels=fam.labels)
            for labels, value in fam.samples:
                metric.add_metric(list(labels), value)
            yield metric

    def describe(self) -> list[object]:
        return []  # unchecked collector: the families depend on the runs at scrape time


def exposition(collector: RunsCollector) -> bytes:
    """The text format of one collection (what ``write`` puts in the textfile)."""
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)  # type: ignore[arg-type]
    return generate_latest(registry)


def serve(collector: RunsCollector, address: str, port: int) -> None:
    """Serve /metrics until interrupted (prometheus_client's threaded HTTP server)."""
    from prometheus_client import CollectorRegistry, start_http_server

    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)  # type: ignore[arg-type]
    server, thread = start_http_server(port, addr=address, registry=registry)
    print(f"hpc-train metrics: serving http://{address}:{server.server_port}/metrics", flush=True)
    try:
        while thread.is_alive():
            thread.join(1.0)
    except KeyboardInterrupt:
        pass
    finally:
        server.shutdown()


# --- the command line -----------------------------------------------------------------------


def runs_source(save_dirs: Sequence[str], all_users: bool = False) -> Source:
    """The runs to report: the given save dirs or job ids, else the user's runs index; with
    ``all_users``, every user's runs Slurm knows too."""
    mine = chosen_runs(save_dirs)
    return everyone(mine) if all_users else lambda: (mine(), None)


def chosen_runs(save_dirs: Sequence[str]) -> Callable[[], list[index.Run]]:
    if not save_dirs:
        return lambda: index.user_runs()

    def chosen() -> list[index.Run]:
        found = []
        for arg in save_dirs:
            try:
                found.append(index.resolve(arg))
            except index.RunNotFound:
                found.append(index.Run(Path(arg).expanduser().absolute(), None, Path(arg).name))
        return found

    return chosen


def build_parser() -> argparse.ArgumentParser:
    p = cli.Parser(
        prog="hpc-train metrics",
        description=(__doc__ or "").split("\n\n")[0],
        epilog=cli.examples(__doc__, "hpc-train metrics"),
    )
    sub = p.add_subparsers(dest="action", required=True, metavar="{serve,write}")
    s = sub.add_parser("serve", help="serve /metrics over HTTP (the head node)",
                       formatter_class=cli.HelpFormatter)  # fmt: skip
    s.add_argument("--address", default="127.0.0.1", help="address to listen on")
    s.add_argument("--port", type=int, default=DEFAULT_PORT, help="TCP port (0: any free one)")
    w = sub.add_parser("write", help="write DIR/hpc_train.prom for node_exporter (atomic)",
                       formatter_class=cli.HelpFormatter)  # fmt: skip
    w.add_argument("dir", metavar="DIR", help="node_exporter's --collector.textfile.directory "
                   "(- : print to stdout)")  # fmt: skip
    for q in (s, w):
        q.add_argument(
            "--save-dir",
            action="append",
            default=[],
            metavar="RUN",
            help="a run's save dir or job id (repeatable; default: your runs index)",
        )
        q.add_argument("--all-users", action="store_true",
                       help="also every user's runs in Slurm's job list (the head node)")  # fmt: skip
    return p


def main(argv: list[str] | None = None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    if args.action == "serve" and not 0 <= args.port <= 65535:
        p.error(f"--port {args.port}: not a TCP port (0-65535)")

    def warn(msg: str) -> None:
        print(f"hpc-train metrics: warning: {msg}", file=sys.stderr)

    collector = RunsCollector(runs_source(args.save_dir, args.all_users), warn)
    if args.action == "serve":
        try:
            serve(collector, args.address, args.port)
        except OSError as err:
            p.error(f"cannot listen on {args.address}:{args.port}: {err.strerror or err}")
        return 0
    if args.dir == "-":
        sys.stdout.write(exposition(collector).decode())
        return 0
    out = Path(args.dir)
    if not out.is_dir():
        p.error(f"{out}: not a directory (node_exporter's --collector.textfile.directory)")
    text = exposition(collector)
    try:
        atomic_write(out / TEXTFILE, text)
    except OSError as err:  # not writable, full: the operator's to fix, not a traceback
        p.error(f"cannot write {out / TEXTFILE}: {err.strerror or err}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

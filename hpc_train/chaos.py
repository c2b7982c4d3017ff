"""Interrupt a running training job on purpose, to rehearse failure.

    python -m hpc_train.chaos JOBID preempt [--hold 30]   # a high-priority job takes its nodes
    python -m hpc_train.chaos JOBID notice                 # USR2 now: save on notice, requeue
    python -m hpc_train.chaos JOBID requeue                # scontrol requeue: no notice at all
    python -m hpc_train.chaos JOBID kill-node [--node N]   # SIGKILL the ranks on one (random) node
    python -m hpc_train.chaos JOBID kill-node --stop-slurmd  # local cluster: the node fails too
    python -m hpc_train.chaos JOBID hang [--node N]        # SIGSTOP one rank: the job hangs
    python -m hpc_train.chaos JOBID stuck-agent [--node N] # SIGSTOP one node's torchrun agent
    python -m hpc_train.chaos JOBID stuck-launcher [--node N]  # SIGSTOP one node's launcher
    python -m hpc_train.chaos JOBID crash --at-update 30   # rank 0 raises there, every start
    python -m hpc_train.chaos JOBID slow --node n2 --factor 0.5  # one node's ranks at half speed
    python -m hpc_train.chaos JOBID slow-save --seconds 8  # every checkpoint write 8 s slower
    python -m hpc_train.chaos JOBID pace --seconds 0.1     # at most 10 updates/s (0: unpaced)

Every action is real Slurm: preemption through the higher-priority partition, signals through
scancel, a node's processes killed on that node through ``srun --overlap``; an injected crash
is a file in the run's state dir the workers look for at every update (``hpc_train.worker.crash``);
a slow save (the rehearsal of a slow FSx) one the checkpoint writer looks for at every save
(``hpc_train.worker.async_save``); a pace (a run slowed so a fault's allowance ends mid-run) one
the workers look for at every update (``hpc_train.worker.pace``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import signal
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from hpc_core import procs, slurm
from hpc_core.slurm_env import JOB_ID, SlurmEnv
from hpc_core.wait import FAST, process_exited, wait_until
from hpc_train import cli, contract
from hpc_train.contract import CrashRequest, write_crash_request
from hpc_train.job import command_lines
from hpc_train.runs import index

# Processes of a training job on a node: the torchrun agent and the workers (or hollow ranks).
TARGETS = (*command_lines.WORKER_MODULES, "torch.distributed.run", "bin/torchrun")


def running_nodes(job_id: str) -> list[str]:
    state = slurm.job_state(job_id)
    if state.state != "RUNNING":
        raise slurm.SlurmError(f"job {job_id} is {state.state}, not RUNNING")
    return slurm.hostnames(state.nodes)


def preempt(job_id: str, partition: str, hold_s: int) -> str:
    """Submit a job to ``partition`` on exactly the job's nodes; returns its job id."""
    nodes = running_nodes(job_id)
    return slurm.sbatch([
        f"--partition={partition}", f"--nodes={len(nodes)}", f"--nodelist={','.join(nodes)}",
        "--exclusive", "--job-name=hpc-train-chaos", "--output=/dev/null", f"--wrap=sleep {hold_s}",
    ])  # fmt: skip


def notice(job_id: str) -> None:
    slurm.signal(job_id, "USR2")


def _processes(
    job_id: str, node: str, targets: Sequence[str] = TARGETS
) -> Iterator[tuple[int, str]]:
    """(pid, cmdline) of this job's training processes (``targets``) on this host, for ``node``
    (``hpc_core.procs``: by ``SLURM_JOB_ID`` and the node in their environment)."""
    me = {os.getpid(), os.getppid()}
    for process in procs.carrying({JOB_ID: job_id}, node, skip=me):
        cmd = process.cmdline()
        if cmd is not None and any(t in cmd for t in targets):
            yield process.pid, cmd


def kill_here(job_id: str, node: str) -> int:
    """SIGKILL the job's torchrun agent and workers on this host; returns how many."""
    killed = 0
    for pid, _ in _processes(job_id, node):
        try:
            os.kill(pid, signal.SIGKILL)
            killed += 1
        except ProcessLookupError:
            pass
    return killed


def ranks_here(job_id: str, node: str) -> list[int]:
    """The job's training ranks on this host for ``node`` (not the torchrun agent, whose command
    line names the module too, nor their DataLoader workers, which run the same command line as
    children of a rank), lowest pid first."""
    agents = ("torch.distributed.run", "bin/torchrun")
    found = {
        pid: cmd
        for pid, cmd in _processes(job_id, node)
        if any(m in cmd for m in command_lines.WORKER_MODULES) and not any(a in cmd for a in agents)
    }
    return sorted(pid for pid in found if _parent(pid) not in found)


def _parent(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def agent_here(job_id: str, node: str) -> int | None:
    """The job's torchrun agent on this host for ``node`` (None: none here)."""
    agents = ("torch.distributed.run", "bin/torchrun")
    found = [pid for pid, cmd in _processes(job_id, node) if any(a in cmd for a in agents)]
    return min(found) if found else None


def launcher_here(job_id: str, node: str) -> int | None:
    """The job's launcher on this host for ``node``: submitit's task process (not the batch
    step's ``srun`` client, whose command line names the module too)."""
    found = [pid for pid, cmd in _processes(job_id, node, (LAUNCHER,))
             if not cmd.split(" ", 1)[0].endswith("srun")]  # fmt: skip
    return min(found) if found else None


def stop_launcher_here(job_id: str, node: str) -> int | None:
    """SIGSTOP the job's launcher on this host: its torchrun and ranks train on, but it can
    neither end its part nor act on a notice. Returns its pid (None: none here)."""
    pid = launcher_here(job_id, node)
    if pid is not None:
        os.kill(pid, signal.SIGSTOP)
    return pid


def stop_agent_here(job_id: str, node: str) -> int | None:
    """SIGSTOP the job's torchrun agent on this host: its ranks train on; at their exit it
    reaps nothing and never exits by itself. Returns its pid (None: no agent here)."""
    pid = agent_here(job_id, node)
    if pid is not None:
        os.kill(pid, signal.SIGSTOP)
    return pid


def stop_here(job_id: str, node: str) -> int | None:
    """SIGSTOP one of the job's ranks on this host: it stops mid-update and its peers wait for
    it in the next collective. Returns its pid (None: no rank here)."""
    ranks = ranks_here(job_id, node)
    if not ranks:
        return None
    os.kill(ranks[0], signal.SIGSTOP)
    return ranks[0]


def _on_node(
    job_id: str, node: str | None, action: str, extra: list[str] | None = None, timeout: float = 60
) -> str:
    """Run ``action`` (KILL_HERE, STOP_HERE, SLOW_HERE) on one of the job's nodes; returns the
    node."""
    nodes = running_nodes(job_id)
    target = node or random.choice(nodes)
    if target not in nodes:
        raise slurm.SlurmError(f"node {target} is not one of job {job_id}'s nodes {nodes}")
    slurm.run(
        [
            "srun", f"--jobid={job_id}", "--overlap", f"--nodelist={target}", "-N1", "-n1",
            sys.executable, "-m", "hpc_train.chaos", job_id, action, "--node", target,
            *(extra or []),
        ],
        timeout=timeout,
    )  # fmt: skip
    return target


def hang(job_id: str, node: str | None) -> str:
    """SIGSTOP one rank on ``node`` (default: a random node of the job); returns the node."""
    return _on_node(job_id, node, STOP_HERE)


def stuck_agent(job_id: str, node: str | None) -> str:
    """SIGSTOP the torchrun agent on ``node`` (default: a random node of the job)."""
    return _on_node(job_id, node, STOP_AGENT_HERE)


def stuck_launcher(job_id: str, node: str | None) -> str:
    """SIGSTOP the launcher on ``node`` (default: a random node of the job)."""
    return _on_node(job_id, node, STOP_LAUNCHER_HERE)


def kill_node(job_id: str, node: str | None, stop_slurmd: bool) -> str:
    target = _on_node(job_id, node, KILL_HERE)
    if stop_slurmd:
        stop_local_slurmd(target)
    return target


def _local_pidfile(name: str) -> Path:
    """The pid file of the local cluster's daemon ``name`` (``slurm/local/cluster.sh``)."""
    cluster = os.environ.get("HPC_TRAIN_CLUSTER_DIR") or str(
        Path(SlurmEnv().conf or "").resolve().parent.parent
    )
    pidfile = Path(cluster) / "run" / f"{name}.pid"
    if not pidfile.exists():
        raise slurm.SlurmError(f"works on the local cluster only ({pidfile} missing)")
    return pidfile


def stop_local_slurmd(node: str) -> None:
    """Local emulated cluster only: kill the node's slurmd so Slurm declares it failed."""
    os.kill(int(_local_pidfile(f"slurmd-{node}").read_text()), signal.SIGKILL)


def stop_local_slurmctld(timeout: float = 60.0) -> int:
    """Local emulated cluster only: stop slurmctld (SIGTERM: it saves its state and exits, as
    a restart by ``pcluster update-cluster`` or a head node's reboot does), and wait for it to
    exit; its pid. Slurm is silent until ``cluster.sh up`` starts it again."""
    pid = int(_local_pidfile("slurmctld").read_text())
    os.kill(pid, signal.SIGTERM)
    wait_until(lambda: process_exited(pid) or None, "slurmctld's exit", timeout, FAST)
    return pid


KILL_HERE = "_kill-here"  # the step kill-node runs on the target node (not for users)
STOP_HERE = "_stop-here"  # the step hang runs on the target node (not for users)
SLOW_HERE = "_slow-here"  # the step slow runs on the target node (not for users)
STOP_AGENT_HERE = "_stop-agent-here"  # the step stuck-agent runs on the target node
STOP_LAUNCHER_HERE = "_stop-launcher-here"  # the step stuck-launcher runs on the target node
LAUNCHER = "submitit.core._submit"  # what a launcher's command line runs
SLOW_PERIOD_S = 0.02  # one stop-and-continue cycle: shorter than an update's compute
SLOW_REFRESH_S = 5.0  # how often the throttle looks for the job's ranks again


def throttle_here(
    job_id: str,
    node: str,
    factor: float,
    seconds: float | None,
    period: float = SLOW_PERIOD_S,
    find: Callable[[str, str], list[int]] | None = None,
) -> int:
    """Throttle the job's ranks on this host (``find``: the pids; default ``ranks_here``): in
    every ``period`` they run ``factor`` of the time and are stopped (SIGSTOP) the rest, until
    ``seconds`` (None: as long as the job has ranks here; the step ends with the job) or
    SIGTERM. The ranks always get SIGCONT at the end. Returns the cycles done (0: no rank of
    the job here)."""
    find = find or ranks_here
    end = time.monotonic() + seconds if seconds else float("inf")
    ranks: list[int] = []
    looked = -SLOW_REFRESH_S
    cycles = 0

    def resume(*_: object) -> None:
        for pid in ranks:
            _signal(pid, signal.SIGCONT)

    def stop(signum: int, _frame: object) -> None:
        resume()
        raise SystemExit(0)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        while time.monotonic() < end:
            if time.monotonic() - looked >= SLOW_REFRESH_S:
                ranks, looked = find(job_id, node), time.monotonic()
                if not ranks:
                    break
            for pid in ranks:
                _signal(pid, signal.SIGSTOP)
            time.sleep(period * (1 - factor))
            resume()
            time.sleep(period * factor)
            cycles += 1
    finally:
        resume()
        signal.signal(signal.SIGTERM, previous)
    return cycles


def _signal(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def slow(job_id: str, node: str | None, factor: float, seconds: float | None) -> str:
    """Throttle ``node``'s ranks (default: a random node of the job) to ``factor`` of the
    time, on that node (``srun --overlap``); returns when done: after ``seconds``, or when the
    job ends or is requeued (None)."""
    extra = ["--factor", str(factor)] + (["--seconds", str(seconds)] if seconds else [])
    timeout = seconds + 60 if seconds else 7 * 86400.0  # (subprocess: < 2**31 ms)
    return _on_node(job_id, node, SLOW_HERE, extra, timeout)


def _seconds(text: str) -> float:
    value = float(text)
    if not 0 <= value < 3600:
        raise argparse.ArgumentTypeError(f"{text}: expected seconds, 0 to 3600")
    return value


def _fraction(text: str) -> float:
    value = float(text)
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"{text}: expected a fraction between 0 and 1")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = cli.Parser(
        prog="python -m hpc_train.chaos",
        description="Interrupt a running training job on purpose (real Slurm actions).",
        epilog=cli.examples(__doc__, "python -m hpc_train.chaos"),
    )
    parser.add_argument("job_id", help="Slurm job id of the training job")
    sub = parser.add_subparsers(dest="action", required=True)
    pre = sub.add_parser("preempt", help="preempt through the high-priority partition")
    pre.add_argument("--partition", default="high", help="the preemptor's partition")
    pre.add_argument("--hold", type=int, default=20, help="seconds the preemptor holds the nodes")
    sub.add_parser("notice", help="send USR2 now (save on notice, then requeue)")
    sub.add_parser("requeue", help="scontrol requeue: restart without a notice")
    kill = sub.add_parser("kill-node", help="SIGKILL the ranks on one node")
    kill.add_argument("--node", help="node name (default: a random node of the job)")
    kill.add_argument("--stop-slurmd", action="store_true", help="local cluster: fail the node")
    stop = sub.add_parser("hang", help="SIGSTOP one rank on one node (the watchdog's rehearsal)")
    stop.add_argument("--node", help="node name (default: a random node of the job)")
    agent = sub.add_parser(
        "stuck-agent", help="SIGSTOP one node's torchrun agent (the stuck-agent rehearsal)"
    )
    agent.add_argument("--node", help="node name (default: a random node of the job)")
    stuck = sub.add_parser(
        "stuck-launcher", help="SIGSTOP one node's launcher (the launcher watch's rehearsal)"
    )
    stuck.add_argument("--node", help="node name (default: a random node of the job)")
    slow = sub.add_parser(
        "slow", help="throttle one node's ranks (SIGSTOP/SIGCONT): the straggler check's rehearsal"
    )
    slow.add_argument("--node", help="node name (default: a random node of the job)")
    slow.add_argument(
        "--factor", type=_fraction, default=0.5,
        help="the share of time its ranks run (0.5: half speed)",
    )  # fmt: skip
    slow.add_argument(
        "--seconds", type=float, default=None, help="stop after this long (default: job's end)"
    )
    crash = sub.add_parser(
        "crash", help="make a rank raise at an update, in this start and every later one"
    )
    crash.add_argument("--at-update", type=int, required=True, metavar="N", help="the update")
    crash.add_argument("--rank", type=int, default=0, help="the rank that raises (default: 0)")
    slow_save = sub.add_parser(
        "slow-save", help="every background checkpoint write sleeps first (a slow FSx's rehearsal)"
    )
    slow_save.add_argument(
        "--seconds", type=_seconds, required=True, metavar="S", help="the sleep (0: stop)"
    )
    pace = sub.add_parser(
        "pace", help="every update takes at least S seconds (a fast run slowed for a rehearsal)"
    )
    pace.add_argument(
        "--seconds", type=_seconds, required=True, metavar="S", help="the least (0: stop)"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        here = _run_here(argv)
        if here is not None:
            return here
        _act(build_parser().parse_args(argv))
    except (slurm.SlurmError, index.RunNotFound) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


def _run_here(argv: list[str]) -> int | None:
    """The node-local forms (`JOB <here-action> --node NODE`, run by srun on that node): their
    exit code, or None when argv is none of them."""
    if len(argv) == 4 and argv[1] == KILL_HERE and argv[2] == "--node":
        print(f"killed {kill_here(argv[0], argv[3])} process(es)")
        return 0
    if len(argv) >= 4 and argv[1] == SLOW_HERE and argv[2] == "--node":
        here = build_parser().parse_args([argv[0], "slow", *argv[2:]])
        cycles = throttle_here(argv[0], argv[3], here.factor, here.seconds)
        print(f"throttled for {cycles} cycle(s)" if cycles else "no rank of the job here")
        return 0 if cycles else 1
    if len(argv) == 4 and argv[1] in STOPS_HERE and argv[2] == "--node":
        stop, what = STOPS_HERE[argv[1]]
        pid = stop(argv[0], argv[3])
        print(f"stopped {what} pid {pid}" if pid else f"no {what} of the job here")
        return 0 if pid else 1
    return None


# the node-local SIGSTOPs: what each stops, as _run_here says it
STOPS_HERE: dict[str, tuple[Callable[[str, str], int | None], str]] = {
    STOP_LAUNCHER_HERE: (stop_launcher_here, "launcher"),
    STOP_AGENT_HERE: (stop_agent_here, "torchrun"),
    STOP_HERE: (stop_here, "rank"),
}


def _act(args: argparse.Namespace) -> None:
    """Carry out one chaos action on the job and say what was done."""
    if args.action == "preempt":
        print(f"preemptor job {preempt(args.job_id, args.partition, args.hold)} submitted")
    elif args.action == "notice":
        notice(args.job_id)
        print(f"USR2 sent to job {args.job_id}")
    elif args.action == "requeue":
        slurm.requeue(args.job_id)
        print(f"job {args.job_id} requeued")
    elif args.action == "crash":
        run = index.resolve(args.job_id).dir
        write_crash_request(run, CrashRequest(args.at_update, args.rank))
        print(f"rank {args.rank} of job {args.job_id} will raise at update {args.at_update}")
    elif args.action == "slow-save":
        contract.ask_slow_saves(index.resolve(args.job_id).dir, args.seconds)
        print(f"job {args.job_id}'s checkpoint writes sleep {args.seconds:g} s first")
    elif args.action == "pace":
        contract.ask_pace(index.resolve(args.job_id).dir, args.seconds)
        print(f"job {args.job_id}'s updates take at least {args.seconds:g} s each")
    elif args.action == "slow":
        until = f"{args.seconds:g} s" if args.seconds else "the job ends or is requeued"
        print(
            f"throttling job {args.job_id}'s ranks on {args.node or 'a random node'} to "
            f"{args.factor:.0%} of the time until {until}",
            flush=True,
        )
        node = slow(args.job_id, args.node, args.factor, args.seconds)
        print(f"throttle on {node} ended")
    elif args.action == "hang":
        node = hang(args.job_id, args.node)
        print(f"stopped one of job {args.job_id}'s ranks on {node} (SIGSTOP)")
    elif args.action == "stuck-agent":
        node = stuck_agent(args.job_id, args.node)
        print(f"stopped job {args.job_id}'s torchrun agent on {node} (SIGSTOP)")
    elif args.action == "stuck-launcher":
        node = stuck_launcher(args.job_id, args.node)
        print(f"stopped job {args.job_id}'s launcher on {node} (SIGSTOP)")
    else:
        node = kill_node(args.job_id, args.node, args.stop_slurmd)
        print(f"killed job {args.job_id}'s ranks on {node}")


if __name__ == "__main__":
    sys.exit(main())

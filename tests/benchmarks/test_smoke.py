"""Every ``make bench-*`` in its smoke mode (``SMOKE=1``: ``--smoke``, the same code path with
every size and duration shrunk), run as make runs it: the command is the one ``make -n`` prints
for the target, so a benchmark that a rename broke, or a Makefile line that drifted from its
module, fails here (issue 31: ``make bench-preempt`` crashed at its last line and nothing
noticed). Each test checks the JSON the run wrote, in a temporary directory, never in
``benchmarks/results/``.

The Slurm benchmarks (preempt, hang, grow, soak) need the local cluster (``slurm_cluster``);
the GPU ones run their no-GPU path here: they say so and invent no figure, and
``bench-gpu-restart --cpu`` runs its whole sequence on one CPU rank.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from benchmarks import checkpoint_cost, gpu, gpu_restart, report
from hpc_train.contract import Cause

REPO = Path(__file__).resolve().parents[2]
COVERED: set[str] = set()  # the make targets a smoke test below runs


def smoke(target: str) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Register a test as ``target``'s smoke test (every bench-* target must have one)."""

    def register(test: Callable[..., None]) -> Callable[..., None]:
        COVERED.add(target)
        return test

    return register


def bench_targets() -> list[str]:
    """The targets ``make bench`` runs (the Makefile's ``bench:`` line)."""
    text = (REPO / "Makefile").read_text()
    found = re.search(r"^bench:(.*)$", text, re.M)
    assert found, "the Makefile has no bench: target"
    return found.group(1).split()


def make_command(target: str, tmp: Path, corpus: Path | None) -> tuple[list[str], Path]:
    """The benchmark command ``make TARGET SMOKE=1`` runs (``make -n``: nothing is run), with
    the demo corpus at ``corpus`` and the results in ``tmp/out``; and that results dir."""
    state, out = tmp / "state", tmp / "out"
    (state / "data").mkdir(parents=True)
    if corpus is not None:
        (state / "data" / "demo-bin").symlink_to(corpus)
    printed = subprocess.run(
        ["make", "-n", "-s", "--no-print-directory", target, "SMOKE=1", f"STATE={state}",
         f"SMOKE_OUT={out}", f"PY={sys.executable}"],
        cwd=REPO, capture_output=True, text=True, check=True, timeout=60,
    ).stdout.replace("\\\n", " ")  # fmt: skip
    line = next(s for s in printed.splitlines() if " -m benchmarks." in s)
    words = shlex.split(line)
    begin = words.index(sys.executable)
    end = next((i for i, w in enumerate(words[begin:], begin) if w in ("||", "&&", ";")), None)
    command = words[begin:end]
    assert "--smoke" in command, command
    assert not any("benchmarks/results" in w for w in command), command
    return command, out


def run_bench(command: list[str], timeout: float) -> tuple[subprocess.CompletedProcess[str], float]:
    """Run a benchmark's command from the repository; (the process, its seconds)."""
    started = time.monotonic()
    proc = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=timeout)
    return proc, time.monotonic() - started


def result(proc: subprocess.CompletedProcess[str], path: Path) -> dict[str, Any]:
    """The JSON a run wrote; its output in the failure message if it wrote none."""
    assert path.exists(), f"no {path.name} (exit {proc.returncode}):\n" + (
        proc.stdout[-3000:] + proc.stderr[-3000:]
    )
    data: dict[str, Any] = json.loads(path.read_text())
    return data


# --- the Makefile and the mode ------------------------------------------------------------------


def test_every_bench_target_has_a_smoke_test() -> None:
    assert set(bench_targets()) == COVERED


def test_a_smoke_run_never_writes_into_the_results(capsys: pytest.CaptureFixture[str]) -> None:
    from benchmarks import data

    with pytest.raises(SystemExit) as exit_:
        data.main(["--smoke", "--out", str(report.RESULTS / "data.json")])
    assert exit_.value.code == 2
    assert "--smoke writes no result under" in capsys.readouterr().err


def test_smoke_shrinks_the_defaults_and_an_option_given_still_wins() -> None:
    args = report.parse(
        checkpoint_cost_parser(), ["--smoke"], "checkpoint_cost", checkpoint_cost.SMOKE
    )
    assert (args.preset, args.updates, args.every) == ("tiny", 6, 2)
    assert args.out == report.smoke_out("checkpoint_cost")
    given = report.parse(
        checkpoint_cost_parser(), ["--smoke", "--updates", "9"], "x", checkpoint_cost.SMOKE
    )
    assert given.updates == 9 and given.every == 2
    real = report.parse(checkpoint_cost_parser(), [], "x", checkpoint_cost.SMOKE)
    assert (real.preset, real.updates, real.smoke) == ("roberta-base", 34, False)


def checkpoint_cost_parser() -> Any:
    import argparse

    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path)
    p.add_argument("--updates", type=int, default=34)
    p.add_argument("--every", type=int, default=8)
    p.add_argument("--preset", default=checkpoint_cost.PRESET)
    return p


# --- no cluster ---------------------------------------------------------------------------------


@pytest.mark.fairseq  # runs fairseq's own BPE script, ~35 s: not in the fast tier
@smoke("bench-data")
def test_bench_data_smoke(tmp_path: Path) -> None:
    command, out = make_command("bench-data", tmp_path, None)
    proc, took = run_bench([*command, "--work-dir", str(tmp_path / "work")], 300)
    r = result(proc, out / "data.json")
    assert proc.returncode == 0
    assert r["outputs_identical"] is True  # every command's output equal to fairseq's
    assert set(r["lines_per_s"]) == {"fairseq_1", "fairseq_2", "ours_1", "ours_2"}
    assert all(v > 0 for v in r["lines_per_s"].values())
    assert r["speedup_1_worker"] > 0 and r["coordinator_mb_per_s"] > 0
    assert r["text"]["articles"] == 40 and r["text"]["lines"] > 100
    assert r["settings"]["repeats"] == 1
    print(f"bench-data smoke: {took:.1f} s")


@smoke("bench-levers")
def test_bench_levers_smoke(tmp_path: Path, corpus: Path) -> None:
    """The tiny preset: the defaults and every lever, each profiled by the rank (~20 s)."""
    command, out = make_command("bench-levers", tmp_path, corpus)
    proc, took = run_bench([*command, "--work-dir", str(tmp_path / "work")], 300)
    r = result(proc, out / "levers_cpu.json")
    assert (
        proc.returncode == 0 and r["preset"] == "tiny" and set(r["variants"]) == {"defaults", "all"}
    )
    before, after = (r["variants"][n]["per_update"] for n in ("defaults", "all"))
    # the truth the test knows: fairseq reads the padding once per layer (2 in tiny), the
    # token count twice, the per-update stats twice; the levers take those away
    sites = r["variants"]["defaults"]["host_sync_sites"]
    assert (
        sites["fairseq/models/transformer/transformer_encoder.py:231"] == 2 * 2
    )  # 2 micro-batches
    assert r["figures"]["host_syncs_all_levers"] == after["host_syncs_gpu_path"] <= 2
    assert after["ops_launched"] < before["ops_launched"]
    print(f"bench-levers smoke: {took:.1f} s")


@smoke("bench-ckpt")
def test_bench_ckpt_smoke(tmp_path: Path, corpus: Path) -> None:
    command, out = make_command("bench-ckpt", tmp_path, corpus)
    proc, took = run_bench([*command, "--work-dir", str(tmp_path / "work")], 300)
    r = result(proc, out / "checkpoint_cost.json")
    assert proc.returncode == 0
    assert r["preset"] == "tiny" and r["updates"] == 6 and r["save_every"] == 2
    assert set(r["seconds_per_100_updates"]) == set(checkpoint_cost.MODES)
    assert all(v > 0 for v in r["seconds_per_100_updates"].values())
    assert all(s["bytes"] == 0 for s in r["runs"]["none"]["saves"])  # --no-save: none written
    for mode in ("sync", "async"):
        saved = {s["update"]: s["bytes"] for s in r["runs"][mode]["saves"]}
        assert {2, 4} <= set(saved) and all(saved.values()), (mode, saved)
    assert r["saves_in_span"] == 2 and r["checkpoint_bytes"] > 0
    assert r["sync_save_s_median"] > 0 and r["async_snapshot_s_median"] is not None
    assert not (tmp_path / "work").exists()  # its save dirs removed
    print(f"bench-ckpt smoke: {took:.1f} s")


@smoke("bench-tracking")
@pytest.mark.slow  # W&B's service processes: ~7 s
def test_bench_tracking_smoke(tmp_path: Path) -> None:
    """The real writers (TensorBoard, W&B offline), a few calls each: every step read back
    once, and the update it is weighed against is the GPU results' (256 x 512 tokens at the
    toolkit's words/s)."""
    command, out = make_command("bench-tracking", tmp_path, None)
    proc, _ = run_bench(command, 300)
    r = result(proc, out / "tracking.json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert r["sizes"]["smoke"] and set(r["call_ms"]) == {"none", "tensorboard", "wandb", "both"}
    assert r["checked"] == dict.fromkeys(r["call_ms"], True)
    gpu_run = json.loads((REPO / "benchmarks/results/gpu.json").read_text())
    large = gpu_run["presets"]["roberta-large"]
    seconds = large["lengths"]["global_batch"] * 512 / large["runs"]["toolkit"]["words_per_s"]
    assert r["update_s"] == pytest.approx(seconds, abs=1e-4)
    share = r["call_ms"]["both"]["median"] / 1e3 / r["update_s"]
    assert r["goal"]["call_over_update"] == pytest.approx(share, rel=1e-3)


@pytest.mark.fairseq  # builds fairseq's model (the tiny preset's dimensions): not fast tier
@smoke("bench-verify")
def test_bench_verify_smoke(tmp_path: Path) -> None:
    """The tiny preset's checkpoint (~50 MB), one repeat: every figure there, the file the size
    the preset's estimate says, its digest verified, a flipped bit caught, the file removed."""
    command, out = make_command("bench-verify", tmp_path, None)
    work = Path(command[command.index("--work-dir") + 1])
    proc, took = run_bench(command, 300)
    r = result(proc, out / "verify_cost.json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert r["preset"] == "tiny" and r["repeat"] == 1
    assert abs(r["file_bytes"] / r["estimate_bytes"] - 1) < 0.05
    assert r["digest_verified"] and r["flipped_bit_caught"] and r["task0_check_ok"]
    for mode in ("warm", "cold"):
        median = r[mode]["median_s"]
        assert set(median) == {"load", "verify", "verify_beside_load"}
        assert all(v > 0 for v in median.values())
        assert r[mode]["overhead_serial"] == round(median["verify"] / median["load"], 3)
    assert not any((REPO / work).glob("verify_cost-*"))  # the checkpoint removed
    print(f"bench-verify smoke: {took:.1f} s")


@pytest.mark.fairseq  # the training environment's imports under strace, ~35 s: not fast tier
@smoke("bench-import")
def test_bench_import_smoke(tmp_path: Path) -> None:
    if shutil.which("strace") is None:
        pytest.skip("strace is not installed (make bench-import installs it)")
    command, out = make_command("bench-import", tmp_path, None)
    proc, took = run_bench(command, 300)
    r = result(proc, out / "import_files.json")
    assert proc.returncode == 0
    assert set(r["imports"]) == {"torch"}  # --smoke traces one import
    torch = r["imports"]["torch"]
    assert torch["opened_ok_in_env"] > 100 and torch["wall_s"] > 0
    assert 0 < torch["distinct_files_opened_in_env"] <= torch["distinct_paths_in_env"]
    total = torch["calls_total"]["total"]
    assert total == torch["calls_total"]["ok"] + torch["calls_total"]["failed"]
    assert torch["cluster"]["ranks"] == 64 * 8
    assert torch["cluster"]["calls_total"] == total * 64 * 8
    print(f"bench-import smoke: {took:.1f} s")


@smoke("bench-decision")
def test_bench_decision_smoke(tmp_path: Path) -> None:
    """The policy's table timed (no cluster, no file): every end decided, each end's Slurm
    look-ups listed (a finish asks none, a signal kill's requeue the most)."""
    command, out = make_command("bench-decision", tmp_path, None)
    proc, took = run_bench(command, 120)
    r = result(proc, out / "end_decision.json")
    assert proc.returncode == 0 and r["repeats"] == 3 and r["decisions"] == len(Cause) * 3
    assert 0 < r["table_s"]["min"] <= r["table_s"]["median"] <= r["table_s"]["max"]
    looks = r["slurm_look_ups"]
    assert looks["finished/spares"] == [] and looks["no progress/requeue"] == []
    assert "srun --overlap on n2" in looks["crash/requeue"] and "sinfo -N" in looks["crash/requeue"]
    assert r["slurm_look_ups_most"] == max(len(v) for v in looks.values())
    assert looks["crash/requeue"].count("scontrol show job") == 1  # its ExcNodeList with it
    waits = r["slurm_waits"]  # a crash's and a hang's look-ups asked at once (issue 46)
    assert all(waits[f"{c}/{m}"] == 1 for c in ("crash", "hang") for m in ("requeue", "in-job"))
    assert r["slurm_waits_most"] == max(waits.values())
    print(f"bench-decision smoke: {took:.1f} s")


@pytest.mark.nogpu
@smoke("bench-gpu")
def test_bench_gpu_smoke_without_a_gpu_plans_every_run_and_measures_nothing(
    tmp_path: Path, corpus: Path
) -> None:
    command, out = make_command("bench-gpu", tmp_path, corpus)
    proc, took = run_bench(command, 120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "no GPU visible here: nothing measured" in proc.stdout
    assert f"the runs planned: roberta-base: {', '.join(gpu.RUNS)}" in proc.stdout
    assert not (out / "gpu.json").exists()  # no figure invented
    print(f"bench-gpu smoke (no GPU): {took:.1f} s")


@pytest.mark.nogpu
@smoke("bench-gpu-restart")
def test_bench_gpu_restart_smoke_without_a_gpu_says_so(tmp_path: Path, corpus: Path) -> None:
    command, out = make_command("bench-gpu-restart", tmp_path, corpus)
    proc, took = run_bench([*command, "--work-dir", str(tmp_path / "work")], 120)
    r = result(proc, out / "gpu-restart.json")
    assert proc.returncode == 0
    assert "no GPU visible here: nothing measured" in proc.stdout
    assert set(r) == {"gpu", "date"} and r["gpu"] is False  # no figure invented
    print(f"bench-gpu-restart smoke (no GPU): {took:.1f} s")


def test_bench_gpu_restart_smoke_on_a_cpu_rank_crashes_and_restarts_twice(
    tmp_path: Path, corpus: Path
) -> None:
    """Its non-GPU path (``--cpu``): the whole sequence, the tiny preset on one CPU rank."""
    command, out = make_command("bench-gpu-restart", tmp_path, corpus)
    proc, took = run_bench([*command, "--cpu", "--work-dir", str(tmp_path / "work")], 300)
    r = result(proc, out / "gpu-restart.json")
    assert proc.returncode == 0 and "error" not in r, r.get("error")
    assert (r["gpu"], r["device"], r["preset"], r["smoke"]) == (False, "cpu", "tiny", True)
    assert r["settings"]["save_every"] == gpu_restart.SMOKE_PLANS["cpu"].save_every
    assert r["cold_start"]["start_to_first_update_s"] > 0
    assert len(r["crashes"]) == gpu_restart.CRASHES
    for crash in r["crashes"]:
        restart = crash["restart"]
        assert crash["killed_at_update"] >= crash["checkpoint_update"] > 0
        assert restart["resumed_at"] >= crash["checkpoint_update"]
        assert restart["updates_recomputed"] >= 0 and restart["kill_to_first_update_s"] > 0
    assert len(r["logparse"]["recomputed_updates"]) == gpu_restart.CRASHES
    assert r["checkpoint"]["bytes"] > 0 and r["seconds_per_update"] > 0
    assert set(r["startup_parts"]) == {name for name, _ in gpu_restart.STARTUP_PARTS}
    assert all("returncode" not in part for part in r["startup_parts"].values())
    print(f"bench-gpu-restart smoke (--cpu): {took:.1f} s")


# --- on the local Slurm cluster -----------------------------------------------------------------


@smoke("bench-preempt")
def test_bench_preempt_smoke(slurm_cluster: Path, tmp_path: Path, corpus: Path) -> None:
    command, out = make_command("bench-preempt", tmp_path, corpus)
    proc, took = run_bench([*command, "--work-dir", str(tmp_path / "work")], 600)
    r = result(proc, out / "preemption.json")
    assert proc.returncode == 0
    runs = r["runs"]
    assert set(runs) == {"sleep", "save_on_notice", "without_notice"}
    for name in ("save_on_notice", "without_notice"):
        run = runs[name]
        assert run["state"] == "COMPLETED" and run["restarts"] >= 1, run
        assert run["updates_missing"] == [] and run["recovery_s"] > 0
    assert runs["sleep"]["recovery_s"] > 0 and len(runs["sleep"]["starts"]) >= 2
    assert r["recovery_ratio"] > 0 and r["save_ratio"] > 0
    assert r["save_s"]["repeats"] == 2 and r["settings"]["max_update"] == 80
    assert r["settings"]["pace_s"] == 0.1  # the updates after the interrupt outlast the notice
    assert isinstance(r["interference"], dict)
    print(f"bench-preempt smoke: {took:.1f} s")


@smoke("bench-hang")
def test_bench_hang_smoke(slurm_cluster: Path, tmp_path: Path, corpus: Path) -> None:
    command, out = make_command("bench-hang", tmp_path, corpus)
    proc, took = run_bench([*command, "--work-dir", str(tmp_path / "work")], 600)
    r = result(proc, out / "hang.json")
    hang, free = r["hang"], r["fault_free"]
    assert hang["cause"] == "hang" and hang["state"] == "COMPLETED"
    assert hang["allowance_s"] > 0 and 0 < hang["detect_s"] < hang["resume_s"]
    assert hang["stopped_node"] in hang["blamed"]
    assert free["minutes"] == 0.2 and free["updates"] > 0
    assert r["settings"]["pace_s"] == 0.1 and r["settings"]["max_update"] == 60
    # the benchmark's own verdict: exit 0 only without a false positive
    assert proc.returncode == (0 if free["false_positives"] == 0 else 1)
    print(f"bench-hang smoke: {took:.1f} s")


@smoke("bench-grow")
def test_bench_grow_smoke(slurm_cluster: Path, tmp_path: Path, corpus: Path) -> None:
    command, out = make_command("bench-grow", tmp_path, corpus)
    proc, took = run_bench([*command, "--work-dir", str(tmp_path / "work")], 600)
    r = result(proc, out / "grow.json")
    assert proc.returncode == 0
    for run in r["runs"].values():
        assert run["state"] == "COMPLETED" and run["updates_missing"] == [], run
        assert run["starts"] and run["node_s"]["used"] > 0 and run["node_s"]["open"] > 0
    assert r["settings"]["blocked_s"] == 10 and r["updates_recomputed"] >= 0
    assert set(r["used_ratio"]) == {"grow", "no_grow"}
    print(f"bench-grow smoke: {took:.1f} s")


@smoke("bench-soak")
def test_bench_soak_smoke(slurm_cluster: Path, tmp_path: Path, corpus: Path) -> None:
    command, out = make_command("bench-soak", tmp_path, corpus)
    proc, took = run_bench([*command, "--work-dir", str(tmp_path / "work")], 600)
    r = result(proc, out / "soak.json")
    assert proc.returncode == 0
    ways = r["ways"]
    assert set(ways) == {"in_job", "requeue", "bare"}
    kinds = {kind for _, kind in r["settings"]["schedule"]}
    for way in ways.values():
        landed = [f["kind"] for f in way["failures"]] + way["skipped"]
        assert set(landed) <= kinds and len(landed) <= len(kinds), way
        assert way["updates_reached"] >= 0 and "goodput" in way
    assert sum(w["updates_reached"] for w in ways.values()) > 0
    assert r["settings"]["budget_s"] == 25 and len(r["settings"]["schedule"]) == 6
    print(f"bench-soak smoke: {took:.1f} s")


@smoke("bench-scale")
def test_bench_scale_smoke(slurm_cluster: Path, tmp_path: Path, corpus: Path) -> None:
    """2 hollow nodes on a cluster of the benchmark's own: every event, each figure there."""
    command, out = make_command("bench-scale", tmp_path, corpus)
    proc, took = run_bench([*command, "--work-dir", str(tmp_path / "work")], 900)
    r = result(proc, out / "scale.json")
    assert proc.returncode == 0 and r["smoke"] is True and r["real"] == {}
    size = r["hollow"]["2"]
    rounds, requeue = size["rounds"], size["requeue"]
    for end in (rounds["end"], requeue["end"]):
        assert end["state"] == "COMPLETED" and end["missing_updates"] == 0, end
    for event in (rounds["kill_round"], rounds["hang"], requeue["kill_requeue"]):
        at = event["at"]
        assert at["seen"] <= at["decided"] <= at["last_torchrun"] <= at["first_update"], at
        whole = round(event["decide_s"] + event["relaunch_s"], 2)
        kept = next((k for k in event if k.startswith("toolkit_with_")), "toolkit_s")
        assert event[kept] == whole, event  # the whole, where start-up or shutdown was taken out
        apart = [
            k[len("toolkit_with_") : -len("_s")] for k in event if k.startswith("toolkit_with_")
        ]
        assert "torchruns_up" in apart and all(event[f"{n}_s"] >= 0 for n in apart), event
        left = whole - sum(event[f"{name}_s"] for name in apart)  # each said apart once
        assert abs(event["toolkit_s"] - left) < 0.006, (left, event)
        assert event["slurm_calls"]["rpc"] >= 1  # task 0's own look-ups at least
    assert "agents_down_s" in rounds["kill_round"] and "agents_down_s" in requeue["kill_requeue"]
    (kill,) = rounds["kill_rounds"]  # --kills 3, one a node but task 0's: one at 2 nodes
    assert rounds["kill_round"] == {**kill, "toolkit_s_each": [kill["toolkit_s"]]}
    for event, weighed_as in ((*((k, "InJobRound") for k in rounds["kill_rounds"]),
                               (rounds["hang"], "InJobRound"), (requeue["kill_requeue"], "Requeue"))):  # fmt: skip
        w = event["weighed"]  # task 0's own account fits the decision timed from outside
        assert w["transition"] == weighed_as and w["questions"] >= 1, w
        assert w["read_s"] + w["slurm_s"] <= w["total_s"] + 0.01 <= event["decide_s"] + 0.02, event
        assert event["decision_cpu_s"] == w["cpu_s"] and w["cpu_s"] > 0, w  # its work, apart
    hang = rounds["hang"]  # its nodes' agents going down, within seen -> decided, said apart
    assert hang["teardown_s"] is not None and 0 <= hang["teardown_s"] <= hang["decide_s"], hang
    assert 0 < rounds["hang"]["detect_over_T"] < 3 and rounds["hang"]["allowance_s"] == 10
    assert rounds["notice"]["saved_s"] <= rounds["notice"]["stopped_s"]
    assert requeue["kill_requeue"]["slurm_calls"]["by_kind"].get("scontrol requeue") == 1
    requeued = requeue["kill_requeue"]  # its launchers starting, within the relaunch, said apart
    assert 0 <= requeued["launchers_up_s"] <= requeued["relaunch_s"], requeued
    notice = rounds["notice"]  # its ranks finishing the update in flight and saving, said apart
    assert (
        notice["ranks_save_s"] == notice["saved_s"]
        and notice["toolkit_with_ranks_save_s"] >= notice["ranks_save_s"]
    )
    memory = rounds["steady"]["memory"]["last"]
    assert abs(memory["node_mb"] - sum(v for k, v in memory.items() if k != "node_mb")) < 0.5
    assert r["memory"]["most_nodes"] >= 2 and r["compared"]["hollow"]["2"]
    assert rounds["steady"]["file_ops_per_update"]["last"]["updates"] > 0
    assert rounds["steady"]["file_ops_per_second"]["last"]["seconds"] > 0
    assert r["compared"]["hollow"]["2"]["steady.file_ops_per_second.last"][0] > 0
    paced = rounds["steady"]["file_ops_by_pace"]["last"]
    assert paced["per_update"] > 0 and paced["polls_per_second"] > 0  # its beats; the monitors'
    # --reanalyze derives the same figures from the files the run left
    again = subprocess.run([sys.executable, "-m", "benchmarks.scale", "--reanalyze", str(out / "scale.json"),
                            "--work-dir", str(tmp_path / "work"), "--trace-s", "4"],
                           capture_output=True, text=True, cwd=REPO, timeout=120)  # fmt: skip
    assert again.returncode == 0, again.stderr
    redone = json.loads((out / "scale.json").read_text())
    assert redone["hollow"] == r["hollow"]  # every figure, each whole kept beside its part too
    assert redone["compared"] == r["compared"] and "reanalyzed" in redone
    print(f"bench-scale smoke: {took:.1f} s")


@smoke("bench-step-probe")
def test_bench_step_probe_smoke(slurm_cluster: Path, tmp_path: Path) -> None:
    """A kill's three look-ups timed on a 2-node sleep job, idle and beside 4 busy processes."""
    command, out = make_command("bench-step-probe", tmp_path, None)
    proc, took = run_bench(command, 300)
    r = result(proc, out / "step_probe.json")
    assert proc.returncode == 0 and r["asks"] == 2 and set(r["by_busy"]) == {"0", "4"}
    for found in r["by_busy"].values():
        assert len(found) == 3 and all(0 < t["median_s"] <= t["max_s"] for t in found.values())
        assert all(t["answered"] == 2 for t in found.values()), found  # every step started
    assert r["node"] and r["job"]
    print(f"bench-step-probe smoke: {took:.1f} s")


def test_bench_step_probe_refuses_a_bad_count_in_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from benchmarks import step_probe

    with pytest.raises(SystemExit) as exit_:
        step_probe.main(["--busy", "0,many", "--out", "/dev/null"])
    assert exit_.value.code == 2
    assert "expected counts >= 0 such as 0,78, got '0,many'" in capsys.readouterr().err

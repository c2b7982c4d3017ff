"""The GPU session script (benchmarks.gpu_session): its plan, its runs' command lines, its
timeouts and OOM stop (real processes), and its CPU rehearsal, so the script a lent GPU runs
cannot rot between leases (real fairseq on the tiny preset, the same stages and schema)."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from benchmarks import gpu, gpu_results, gpu_session
from benchmarks import gpu_session_runs as runs
from hpc_core import procs
from hpc_core.wait import wait_until
from hpc_train.job import levers
from hpc_train.job.levers import LeverName


def session(gpu_run: bool, tmp_path: Path) -> gpu_session.Session:
    return gpu_session.Session(
        gpu_run, tmp_path / "out.json", tmp_path, time.monotonic() + 60, None
    )


def test_the_stages_run_in_the_order_of_their_value(tmp_path):
    s = session(True, tmp_path)
    assert gpu_session.STAGES == ("setup", "profile", "levers", "bare", "p3dn", "base")
    profile = gpu_session.stage_runs("profile", s)
    assert [r.name for r in profile] == ["defaults", "levers"] and all(r.profile for r in profile)
    names = [r.name for r in gpu_session.stage_runs("levers", s)]
    assert names[:3] == ["levers_pack", "levers_pack_b128", "levers_b128"]
    assert names[-1] == "levers_pack_compile"
    # twice the batch on the masked path (the H200's device waited 23 % of its update there)
    masked = gpu_session.stage_runs("levers", s)[2]
    assert LeverName.PACK not in masked.speed.asked() and masked.per_gpu == 128
    assert set(masked.speed.asked()) == set(runs.EXACT_LEVERS)
    assert [r.stop_on_oom for r in gpu_session.stage_runs("p3dn", s)] == [True]
    assert {r.preset for r in gpu_session.stage_runs("base", s)} == {"roberta-base"}
    rehearsal = session(False, tmp_path)
    assert "levers_pack_compile" not in [
        r.name for r in gpu_session.stage_runs("levers", rehearsal)
    ]
    assert gpu_session.stage_runs("base", rehearsal) == []  # one preset rehearsed


def test_each_runs_command_line(tmp_path):
    lengths = gpu_session.GPU_LENGTHS["roberta-large"]

    def argv(run: runs.Run) -> list[str]:
        return runs.argv_of(run, Path("/d"), tmp_path / run.name, lengths, gpu_run=True)

    def arg(a: list[str], flag: str) -> str:
        return a[len(a) - 1 - a[::-1].index(flag) + 1]

    pack = argv(
        runs.Run("p", "roberta-large", speed=runs.levers_on(*runs.EXACT_LEVERS, LeverName.PACK))
    )
    assert arg(pack, "--sample-break-mode") == "none"
    assert set(arg(pack, levers.WORKER_FLAG).split(",")) >= {*runs.EXACT_LEVERS, "pack"}
    bare = argv(runs.Run("b", "roberta-large", kind="bare"))
    assert bare[1:3] == ["-m", "fairseq_cli.train"] and "--fp16" in bare
    # fairseq's README settings at the session's global batch: 16 sequences x update_freq
    assert (
        int(arg(bare, "--max-sentences")) * int(arg(bare, "--update-freq")) == lengths.global_batch
    )
    p3dn = argv(runs.Run("c", "roberta-large", kind="p3dn"))
    assert p3dn[1] == "-c" and "set_per_process_memory_fraction" in p3dn[2]
    assert "--fp16" in p3dn and arg(p3dn, "--batch-size") == "32"  # devices' p3dn row
    assert "flash" not in arg(p3dn, levers.WORKER_FLAG).split(",")  # sm70


@pytest.mark.slow  # a run and its children waited out to the timeout: ~2 s
def test_a_run_is_killed_with_its_children_at_its_timeout(tmp_path):
    child = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); print('started', flush=True); time.sleep(60)"
    mark = {"HPC_TEST_RUN": str(tmp_path)}
    began = time.monotonic()
    done = runs.execute([sys.executable, "-c", child], {**os.environ, **mark}, tmp_path / "log",
                        2.0, stop_on_oom=False, sample_gpu=False)  # fmt: skip
    assert done.status == "timeout" and time.monotonic() - began < 15
    assert done.lines == ["started"] and (tmp_path / "log").read_text() == "started\n"
    # the grandchild went with the group: SIGKILL lands at once, its reaping takes a moment
    wait_until(lambda: not list(procs.carrying(mark)), "the grandchild gone", timeout=10)


def test_a_run_stops_at_its_first_out_of_memory_line(tmp_path):
    oom = "print('torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB', flush=True); import time; time.sleep(60)"
    began = time.monotonic()
    done = runs.execute([sys.executable, "-c", oom], dict(os.environ), tmp_path / "log", 60.0,
                        stop_on_oom=True, sample_gpu=False)  # fmt: skip
    assert done.status == "oom" and "Tried to allocate" in (done.oom_line or "")
    assert time.monotonic() - began < 15  # not the 60 s the run would have slept


def test_without_a_gpu_it_prints_the_plan_and_exits_0(tmp_path, capsys, corpus):
    pytest.importorskip("torch")
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: the session would run")
    assert gpu_session.main(["--data", str(corpus), "--out", str(tmp_path / "o.json")]) == 0
    text = capsys.readouterr().out
    assert "no GPU visible here" in text and "profile: defaults, levers" in text
    assert "levers_pack_compile" in text and "base: defaults, levers_pack, bare_readme" in text
    assert not (tmp_path / "o.json").exists()  # no figure invented
    # a GPU run's name is one here too (the plan a lent GPU would follow)
    argv = [
        "--data",
        str(corpus),
        "--out",
        str(tmp_path / "o.json"),
        "--run",
        "roberta-base/defaults",
    ]
    assert gpu_session.main(argv) == 0
    assert capsys.readouterr().out.rstrip().endswith("levers: -; bare: -; p3dn: -; base: defaults")


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--kit", "/nonexistent"], "not a device kit"),
        (["--data", "/nonexistent"], "not a binarized corpus"),
        (["--deadline-s", "0"], "--deadline-s must be > 0"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(argv, says, capsys):
    with pytest.raises(SystemExit) as exit_:
        gpu_session.main(argv)
    assert exit_.value.code == 2 and says in capsys.readouterr().err


@pytest.mark.parametrize("text", [None, "{}", '{"presets": []}', "not json"])
def test_after_a_file_that_is_not_a_session_s_results_is_one_line_and_exit_2(
    text, corpus, tmp_path, capsys
):
    after = tmp_path / "first.json"
    if text is not None:
        after.write_text(text)
    with pytest.raises(SystemExit) as exit_:
        gpu_session.main(["--data", str(corpus), "--after", str(after)])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "not a GPU session's results" in err
    assert len(err.strip().splitlines()) == 1


def rehearse(corpus: Path, tmp_path: Path, *options: str) -> dict:
    """The CPU rehearsal with ``options``; its results file."""
    out = tmp_path / "rehearsal.json"
    argv = ["--rehearse", "--data", str(corpus), "--out", str(out),
            "--work-dir", str(tmp_path / "work"), *options]  # fmt: skip
    assert gpu_session.main(argv) == 0
    return json.loads(out.read_text())


def test_the_rehearsal_runs_every_stage_on_the_cpu_in_the_one_schema(corpus, tmp_path):
    """Two runs per stage (about a minute on 2 cores): the script's whole path, real fairseq."""
    result = rehearse(corpus, tmp_path, "--runs-per-stage", "2", "--repeat", "4")
    assert list(result["stages"]) == list(gpu_session.STAGES) and result["rehearsal"] is True
    assert all(st["status"] in ("done", "nothing to run here") for st in result["stages"].values())
    tiny = result["presets"]["tiny"]["runs"]
    assert set(tiny) == {"defaults", "levers", "levers_pack", "levers_pack_b128", "bare_readme",
                         "p3dn_limits"}  # fmt: skip
    for name, run in tiny.items():
        assert set(gpu_results.RUN_KEYS) <= set(run), name
        assert run["status"] == "ok" and run["words_per_s"] > 0 and run["exit_s"] is not None, name
    before, after = (tiny[n]["profile"]["per_update"] for n in ("defaults", "levers"))
    assert after["host_syncs_gpu_path"] < before["host_syncs_gpu_path"]
    assert after["ops_launched"] < before["ops_launched"]
    assert any("host syncs by site" in line for line in tiny["defaults"]["profile_table"])
    ratio = result["figures"]["toolkit_over_bare"]["tiny"]
    assert ratio == round(tiny["defaults"]["words_per_s"] / tiny["bare_readme"]["words_per_s"], 3)
    assert tiny["levers_pack_b128"]["batch"] == gpu_session.BIG_BATCH["tiny"]


def test_a_deadline_cuts_the_session_and_keeps_what_it_did(corpus, tmp_path):
    result = rehearse(corpus, tmp_path, "--deadline-s", "20", "--repeat", "2")
    assert list(result["stages"]) == list(gpu_session.STAGES)  # every stage said, none dropped
    assert result["stages"]["p3dn"]["status"] == "skipped: the deadline"
    ran = result["presets"]["tiny"]["runs"]  # the first run had its time: done, or timed out
    assert ran["defaults"]["status"] in ("ok", "timeout")
    assert all(r["status"] in ("ok", "timeout", "skipped: no time left") for r in ran.values())


def test_the_lengths_leave_intervals_after_the_warm_up():
    """A run's words/s is the median after ``gpu.WARMUP_INTERVALS``: each length leaves some,
    and each profile window closes before the run ends."""
    for table, gpu_run in ((gpu_session.GPU_LENGTHS, True), (gpu_session.CPU_LENGTHS, False)):
        for lengths in table.values():
            assert lengths.max_update // lengths.log_interval > gpu.WARMUP_INTERVALS + 1
            assert sum(gpu_session.PROFILE[gpu_run]) < lengths.max_update


def test_a_second_call_after_the_first_keeps_its_runs_and_runs_the_rest(corpus, tmp_path):
    """The H200 lease of 2026-11-29: a second call asked for stages the first had half done and
    ran its levers again from the start (250 s of a 15-minute lease); ``--after`` keeps them."""
    first = {"presets": {"tiny": {"runs": {
        "levers_pack": gpu_results.run_record("ok", words_per_s=12345.0, kind="toolkit"),
        "levers_pack_b128": gpu_results.run_record("timeout", kind="toolkit"),
    }, "figures": {}}}}  # fmt: skip
    earlier = tmp_path / "first.json"
    earlier.write_text(json.dumps(first))
    result = rehearse(corpus, tmp_path, "--after", str(earlier), "--stage", "levers",
                      "--runs-per-stage", "2", "--repeat", "2")  # fmt: skip
    ran = result["presets"]["tiny"]["runs"]
    assert ran["levers_pack"]["words_per_s"] == 12345.0  # kept, not run again
    assert not (tmp_path / "work" / "tiny-levers_pack.log").exists()
    assert ran["levers_pack_b128"]["status"] == "ok"  # not finished before: run now
    assert (tmp_path / "work" / "tiny-levers_pack_b128.log").exists()
    assert result["after"] == str(earlier) and result["stages"]["levers"]["status"] == "done"


def test_run_names_the_runs_a_second_call_wants_and_nothing_else(corpus, tmp_path):
    """A second call in a lease aims at what is unmeasured (2026-11-30: compile, two levers
    alone, roberta-base): ``--run`` runs those and no other, a stage's time box aside."""
    result = rehearse(corpus, tmp_path, "--run", "only_gelu", "--run", "tiny/levers_pack_b128",
                      "--repeat", "2")  # fmt: skip
    logs = sorted(p.name for p in (tmp_path / "work").glob("tiny-*.log"))
    assert logs == ["tiny-levers_pack_b128.log", "tiny-only_gelu.log"]
    ran = result["presets"]["tiny"]["runs"]
    assert set(ran) == {"only_gelu", "levers_pack_b128"}
    assert all(r["status"] == "ok" for r in ran.values())
    assert result["stages"]["profile"]["status"] == "nothing to run here"


def test_run_of_no_such_run_is_one_line_and_exit_2(corpus, tmp_path, capsys):
    code = gpu_session.main(["--rehearse", "--data", str(corpus), "--out",
                             str(tmp_path / "o.json"), "--run", "only_nothing"])  # fmt: skip
    err = capsys.readouterr().err.strip()
    assert code == 2 and "--run only_nothing: no such run here" in err and "\n" not in err
    assert "tiny/levers_pack_b128" in err  # the runs there are, to pick from
    assert not (tmp_path / "o.json").exists()


def test_again_measures_a_run_the_after_file_holds_and_only_once(corpus, tmp_path):
    """The next lease profiles the defaults again (the profile counts kernels only since the
    second H200 lease): ``--again`` runs what ``--after`` holds, once in the call, though the
    bare stage names the defaults too."""
    first = {"presets": {"tiny": {"runs": {
        "defaults": gpu_results.run_record("ok", words_per_s=12345.0, kind="toolkit"),
    }, "figures": {}}}}  # fmt: skip
    earlier = tmp_path / "first.json"
    earlier.write_text(json.dumps(first))
    result = rehearse(corpus, tmp_path, "--after", str(earlier), "--again", "tiny/defaults",
                      "--repeat", "2")  # fmt: skip
    ran = result["presets"]["tiny"]["runs"]
    assert set(ran) == {"defaults"} and ran["defaults"]["words_per_s"] != 12345.0
    assert ran["defaults"]["profile"]["updates"] > 0  # the profile stage's run, not the bare's
    assert [p.name for p in (tmp_path / "work").glob("tiny-*.log")] == ["tiny-defaults.log"]

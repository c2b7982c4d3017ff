"""The profile mode (issue 36): the host-read counter, the table's arithmetic, and a real tiny
run with HPC_TRAIN_PROFILE whose table and JSON say what the rank did."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from hpc_train import contract
from hpc_train.worker import host_reads, profile_table
from hpc_train.worker.profile_table import Op


def test_the_counter_counts_each_host_read_at_its_call_site():
    t = torch.ones(3)
    with host_reads.Counter() as counter:
        t.sum().item()
        bool(t.any())
        float(t[0])
        t.tolist()
        with host_reads.host_side():
            t.sum().item()  # on purpose, on host data: not counted
    assert counter.total == 4
    assert all(site.startswith("tests/hpc_train/worker/test_profile.py:") for site in counter.sites)
    t.sum().item()  # no counter active: nothing recorded anywhere
    assert counter.total == 4
    with host_reads.Counter(gpu_only=True) as gpu_only:
        t.sum().item()
    assert gpu_only.total == 0  # a GPU rank's counter leaves CPU tensors out


def test_the_cpu_only_sites_are_the_lines_of_the_installed_fairseq():
    """If fairseq moves these lines, the GPU-path count would be wrong: this test says so."""
    import fairseq

    root = Path(fairseq.__file__).parent
    for site, text in host_reads.CPU_ONLY_SITES.items():
        path, line = site.removeprefix("fairseq/").rsplit(":", 1)
        assert text in (root / path).read_text().splitlines()[int(line) - 1], site
    assert host_reads.gpu_path({"fairseq/criterions/masked_lm.py:50": 2, "x.py:1": 3}) == 3


@pytest.mark.parametrize(
    ("name", "marks", "kind"),
    [
        ("aten::addmm", (), "matmul"),
        ("sm90_xmma_gemm_bf16bf16_bf16f32", (), "matmul"),
        ("aten::_scaled_dot_product_flash_attention", (), "attention"),
        ("aten::_softmax", (), "attention"),
        ("aten::copy_", (), "casts/copies"),
        ("aten::native_layer_norm", (), "norm/elementwise"),
        ("aten::gelu", (), "norm/elementwise"),
        ("aten::mul_", ("hpc:optimizer",), "optimizer"),
        ("aten::copy_", ("hpc:optimizer",), "optimizer"),
        ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", ("hpc:optimizer",), "communication"),
        ("gloo:all_reduce", (), "communication"),
    ],
)
def test_each_op_or_kernel_has_its_kind(name, marks, kind):
    assert profile_table.kind_of(name, marks) == kind


def test_a_window_per_update_and_its_table():
    ops = [
        Op("aten::linear", (), 0.0, True, 0, (0.0, 400.0)),
        Op("aten::addmm", (), 400.0, False, 0, (10.0, 390.0)),
        Op("aten::gelu", (), 100.0, True, 0, (500.0, 600.0)),
        Op("aten::_fused_adamw_", ("hpc:optimizer",), 300.0, True, 0, (700.0, 1000.0)),
    ]
    busy = profile_table.union_s([op.span_us for op in ops if op.top_level]) / 1e6
    assert busy == pytest.approx(800e-6)
    window = profile_table.ProfileWindow(2, 5, 0.002, 0.0004, busy, "cpu", ops, {"a.py:1": 4})
    p = window.per_update()
    assert p["ms_by_kind"]["matmul"] == 0.2 and p["ms_by_kind"]["optimizer"] == 0.15
    assert p["ms_by_kind"]["outside the step"] == 0.2
    assert p["device_idle_pct"] == 60.0 and p["host_syncs"] == 2 and p["ops_launched"] == 1.5
    text = "\n".join(profile_table.table(window))
    assert "profile of updates 6-7 on cpu (2 after 5 of warm-up)" in text
    assert "host syncs by site: a.py:1 2" in text
    assert json.loads(json.dumps(window.to_json()))["per_update"] == p


def test_the_launchers_profile_request_crosses_to_the_rank():
    env = contract.WorkerEnv(profile=(5, 3)).to_env()
    assert env[contract.PROFILE] == "5:3"
    assert contract.WorkerEnv.from_env(env).profile == (5, 3)
    assert contract.WorkerEnv.from_env({}).profile is None
    for bad in ("5", "a:3", "5:0", "-1:2"):
        with pytest.raises(ValueError, match="WARMUP:UPDATES"):
            contract.parse_profile(bad)


def test_a_tiny_run_profiles_its_window_and_keeps_training(corpus, tmp_path, tiny_run):
    save = tmp_path / "run"
    save.mkdir()
    prelude = f"import os; os.environ[{contract.PROFILE!r}] = '3:2'"
    tiny_run(corpus, save, 8, "--log-interval", "100", prelude=prelude)
    result = json.loads((save / "profile.json").read_text())
    assert (result["device"], result["warmup_updates"], result["updates"]) == ("cpu", 3, 2)
    per = result["per_update"]
    assert per["ops_launched"] > 100 and 0 <= per["device_idle_pct"] <= 100
    assert per["ms_by_kind"]["matmul"] > 0 and per["ms_by_kind"]["optimizer"] > 0
    # the truth: tiny reads fairseq's padding flag once per layer (2) per micro-batch (2)
    assert result["host_sync_sites"]["fairseq/models/transformer/transformer_encoder.py:231"] == 4
    log = (save / "train.log").read_text()
    assert "profile of updates 4-5 on cpu" in log and "host syncs by site" in log
    assert "8 updates" in log or "num_updates: 8" in log or '"num_updates": "8"' in log


def test_kernels_no_op_claims_get_their_own_row_and_names():
    """On the H200 (2026-11-29) a fifth of roberta-large's kernel time was linked to no aten op
    and fell out of every row. Fake profiler events (the CPU has no CUDA kernels): an op that
    claims one of two same-named kernels, and one kernel no op claims."""
    from types import SimpleNamespace as NS

    from hpc_train.worker import profile

    cpu, cuda = torch.autograd.DeviceType.CPU, torch.autograd.DeviceType.CUDA

    def kernel(name, start, end):
        return NS(name=name, device_type=cuda, time_range=NS(start=start, end=end))

    op = NS(
        name="aten::mm", device_type=cpu, cpu_parent=None, time_range=NS(start=0, end=50),
        kernels=[NS(name="sm90_gemm", duration=40)],
    )  # fmt: skip
    # a kernel linked to a range (no row counts it) is still no op's
    ranged = NS(
        name="hpc:step", device_type=cpu, cpu_parent=None, time_range=NS(start=0, end=300),
        kernels=[NS(name="flash_bwd_kernel", duration=90)],
    )  # fmt: skip
    # the step's range as the profiler also draws it on the device: no kernel (the H200's table
    # of 2026-11-30 named train_step-10 the longest kernel of no op, and its span hid every gap)
    drawn = NS(name="hpc:step", device_type=cuda, time_range=NS(start=0, end=300))
    events = [op, ranged, kernel("sm90_gemm", 0, 40), kernel("sm90_gemm", 100, 140),
              kernel("flash_bwd_kernel", 200, 290), drawn]  # fmt: skip
    assert profile.busy_s(events, [], gpu=True) == pytest.approx(170e-6)
    unlinked = profile.unlinked_kernels(events, gpu=True)
    assert unlinked == {"sm90_gemm": 40.0, "flash_bwd_kernel": 90.0}
    assert profile.unlinked_kernels(events, gpu=False) == {}
    ops = profile.ops_of(events, gpu=True)
    window = profile_table.ProfileWindow(1, 0, 0.001, 0.0, 170e-6, "cuda", ops, {}, 0, unlinked)
    p = window.per_update()
    assert p["ms_by_kind"]["matmul"] == 0.04 and p["ms_by_kind"]["kernels of no op"] == 0.13
    text = "\n".join(profile_table.table(window))
    assert "kernels of no op, the longest: flash_bwd_kernel 0.09 ms, sm90_gemm 0.04 ms" in text
    assert "ops with the most time: aten::mm matmul 0.04 ms" in text
    assert window.to_json()["longest_ops_ms"] == [{"op": "aten::mm", "kind": "matmul", "ms": 0.04}]
    cpu_window = profile_table.ProfileWindow(1, 0, 0.001, 0.0, 0.0, "cpu", [], {})
    assert "kernels of no op" not in cpu_window.per_update()["ms_by_kind"]


def test_the_device_s_waits_by_length_and_the_longest_with_the_host_s_op():
    """Where a GPU's idle time goes: fake profiler events (the CPU has no kernels): two kernels
    launched back to back (a 5 µs gap), a 2 ms gap while the host waited in a sync, and a
    user annotation on the device (``is_user_annotation``) spanning them all that must hide none."""
    from types import SimpleNamespace as NS

    from hpc_train.worker import profile

    cpu, cuda = torch.autograd.DeviceType.CPU, torch.autograd.DeviceType.CUDA

    def ev(name, start, end, device=cpu, **kw):
        return NS(name=name, device_type=device, time_range=NS(start=start, end=end), **kw)

    events = [
        ev("train_step-3", 0, 3000),
        ev("aten::_local_scalar_dense", 50, 2100),  # the host blocked in .item()
        ev("cudaStreamSynchronize", 60, 2090),
        ev("aten::mm", 2100, 2200),
        ev("k1", 0, 40, cuda), ev("k2", 45, 60, cuda), ev("k3", 2060, 2300, cuda),
        ev("train_step-3", 0, 2300, cuda, is_user_annotation=True),
    ]  # fmt: skip
    waits = profile.device_waits(events)
    assert sorted(waits.lengths_us) == [5, 2000]
    assert waits.longest[0] == profile_table.Wait(
        2000, "aten::_local_scalar_dense", "aten::_local_scalar_dense"
    )
    assert waits.longest[1].began_in == "train_step-3"  # no op there: the innermost range
    window = profile_table.ProfileWindow(1, 0, 0.003, 0.0, profile.busy_s(events, [], True),
                                         "cuda", [], {}, 0, {}, waits)  # fmt: skip
    per = window.to_json()
    assert per["per_update"]["device_idle_pct"] == pytest.approx(100 * (1 - 295 / 3000), abs=0.1)
    assert per["device_waits"]["ms_by_length"] == {"<10 us": 0.01, "10-100 us": 0.0,
                                                   "100-1000 us": 0.0, ">=1000 us": 2.0}  # fmt: skip
    text = "\n".join(profile_table.table(window))
    assert "device waits: 2 per update, 2.00 ms" in text
    assert "2.00 ms (aten::_local_scalar_dense -> aten::_local_scalar_dense)" in text

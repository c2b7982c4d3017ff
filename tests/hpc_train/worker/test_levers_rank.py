"""The rank's speed levers of issue 36, each against fairseq's own path on the CPU (real fairseq,
the tiny preset's model): same outputs and gradients, and the host reads or ops they remove."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from hpc_train.worker import batch_facts, grads_foreach, host_reads, speed, train


@pytest.fixture(scope="module")
def tiny(corpus):
    """fairseq's task, model and criterion for the tiny preset on the test corpus, in-process."""
    from fairseq import tasks

    from hpc_train.job.command_lines import fairseq_args
    from hpc_train.job.sizing import Sizing
    from hpc_train.job.spec import JobSpec, Training

    spec = JobSpec(
        Training("tiny", corpus, corpus.parent / "save", max_update=1),
        sizing=Sizing(gpus_per_node=0),
    )
    args, _ = fairseq_args(spec, world_size=1, gpu=False)
    cfg = train.fairseq_config([*args, "--dropout", "0", "--attention-dropout", "0"])
    task = tasks.setup_task(cfg.task)
    torch.manual_seed(1)
    model = task.build_model(cfg.model)
    bf16 = train.fairseq_config([*args, "--bf16"])  # the GPU default's optimizer wrapper
    return task, model, task.build_criterion(cfg.criterion), bf16


def batch(task, pads: bool, size: int = 4, length: int = 24) -> dict:
    """A masked-LM batch on the host: random tokens, every third one a target; with ``pads`` the
    last sequence is half padding."""
    dictionary = task.source_dictionary
    g = torch.Generator().manual_seed(7)
    tokens = torch.randint(dictionary.nspecial, len(dictionary), (size, length), generator=g)
    target = torch.full_like(tokens, dictionary.pad())
    target[:, ::3] = tokens[:, ::3]
    if pads:
        tokens[-1, length // 2 :] = target[-1, length // 2 :] = dictionary.pad()
    net_input = {"src_tokens": tokens, "src_lengths": tokens.ne(dictionary.pad()).sum(1)}
    return {"net_input": net_input, "target": target, "ntokens": int(tokens.numel()),
            "nsentences": size}  # fmt: skip


def forward_backward(model, criterion, sample) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model.zero_grad()
    loss, _, _ = criterion(model, sample)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.fixture
def fairseq_encoder():
    """fairseq's own encoder forward, put back after a test that swapped it."""
    from fairseq.models.transformer.transformer_encoder import TransformerEncoderBase

    original = TransformerEncoderBase.forward_scriptable
    yield original
    TransformerEncoderBase.forward_scriptable = original


@pytest.mark.parametrize("pads", [False, True])
def test_pad_check_gives_fairseqs_outputs_and_gradients_without_a_read_per_layer(
    tiny, fairseq_encoder, pads
):
    from fairseq.models.transformer.transformer_encoder import TransformerEncoderBase

    task, model, criterion, _ = tiny
    sample = batch(task, pads)
    with host_reads.Counter() as theirs:
        loss, grads = forward_backward(model, criterion, sample)
    layers = len(model.encoder.sentence_encoder.layers)
    encoder_reads = sum(n for s, n in theirs.sites.items() if "transformer_encoder.py" in s)
    assert encoder_reads == 1 + layers  # the host tensor "xla?" and one per layer (CPU counts)

    TransformerEncoderBase.forward_scriptable = batch_facts.forward_scriptable
    facts = batch_facts.read(sample, task.source_dictionary.pad())
    assert facts is not None and facts.has_pads is pads
    setattr(sample["net_input"]["src_tokens"], batch_facts.FACTS, facts)
    with host_reads.Counter() as ours:
        loss_ours, grads_ours = forward_backward(model, criterion, sample)
    assert not [s for s in ours.sites if "transformer_encoder.py" in s or "batch_facts" in s]
    assert torch.equal(loss, loss_ours)
    for name, grad in grads.items():
        assert torch.equal(grad, grads_ours[name]), name


def test_pad_check_without_pinned_facts_reads_once_per_forward(tiny, fairseq_encoder):
    from fairseq.models.transformer.transformer_encoder import TransformerEncoderBase

    task, model, criterion, _ = tiny
    TransformerEncoderBase.forward_scriptable = batch_facts.forward_scriptable
    with host_reads.Counter() as counter:
        forward_backward(model, criterion, batch(task, pads=True))
    assert sum(n for s, n in counter.sites.items() if "batch_facts.py" in s) == 1


def test_facts_are_read_only_from_host_tensors(tiny):
    task, _, _, _ = tiny
    sample = batch(task, pads=True)
    pad = task.source_dictionary.pad()
    with host_reads.Counter() as counter:
        facts = batch_facts.read(sample, pad)
    assert counter.total == 0  # host-side reads, on purpose: not counted
    assert facts == batch_facts.Facts(True, int(sample["target"].ne(pad).sum()))
    on_meta = {**sample, "target": sample["target"].to("meta")}
    assert batch_facts.read(on_meta, pad) is None  # not on the host: nothing read
    assert batch_facts.read({"id": 1}, pad) is None


def test_host_sizes_returns_the_same_count_as_a_python_int(tiny):
    from fairseq.criterions.masked_lm import MaskedLmLoss

    task, model, criterion, _ = tiny
    sample = batch(task, pads=True)
    loss, size, _ = MaskedLmLoss.forward(criterion, model, sample)
    setattr(sample["net_input"]["src_tokens"], batch_facts.FACTS,
            batch_facts.read(sample, task.source_dictionary.pad()))  # fmt: skip
    forward = batch_facts.criterion_with_host_size(MaskedLmLoss.forward)
    loss2, size2, log2 = forward(criterion, model, sample)
    assert torch.is_tensor(size) and isinstance(size2, int) and size2 == int(size)
    assert log2["sample_size"] == size2 and torch.equal(loss, loss2)


def test_native_gelu_matches_fairseqs_in_fp32_and_within_bf16_rounding(tiny):
    from fairseq.modules.gelu import gelu

    x = torch.randn(64, 256, generator=torch.Generator().manual_seed(3), requires_grad=True)
    y = torch.nn.functional.gelu(x)
    assert torch.equal(gelu(x), y)  # fp32: the round trip is a no-op, the same kernel
    (gx,) = torch.autograd.grad(gelu(x).sum(), x)
    (gy,) = torch.autograd.grad(y.sum(), x)
    assert torch.equal(gx, gy)
    xb = x.detach().bfloat16().requires_grad_()
    reference = torch.nn.functional.gelu(xb.detach().double())
    theirs, ours = gelu(xb), torch.nn.functional.gelu(xb)
    ulp = reference.abs().clamp(min=1e-3) * 2**-7  # bf16 keeps 8 significant bits
    assert ((ours.double() - reference).abs() <= 2 * ulp).all()
    assert ((ours.double() - theirs.double()).abs() <= 2 * ulp).all()
    _, model, _, _ = tiny
    swapped = copy.deepcopy(model)
    assert speed.native_gelu(swapped) == len(model.encoder.sentence_encoder.layers) + 1  # + head
    assert all(getattr(m, "activation_fn", None) is not gelu for m in swapped.modules())


def fp16_optimizer(cfg, model, foreach: bool):
    """fairseq's FP16Optimizer as ``--bf16`` builds it (per-parameter fp32 masters, fairseq's
    adam) over ``model`` in bf16; with ``foreach`` the lever's loops."""
    from fairseq.optim.fp16_optimizer import FP16Optimizer

    if foreach:
        grads_foreach.install()
    return FP16Optimizer.build_optimizer(cfg, [p for p in model.parameters() if p.requires_grad])


@pytest.fixture
def fairseq_loops():
    """fairseq's own loops, put back after a test that swapped them."""
    from fairseq import utils
    from fairseq.optim.fp16_optimizer import _FP16OptimizerMixin as Mixin

    saved = {n: Mixin.__dict__[n] for n in ("_sync_fp16_grads_to_fp32",
                                            "_sync_fp32_params_to_fp16", "zero_grad")}  # fmt: skip
    clip = utils.clip_grad_norm_
    yield
    for name, fn in saved.items():
        setattr(Mixin, name, fn)
        if hasattr(Mixin, f"_hpc_loop_{name}"):
            delattr(Mixin, f"_hpc_loop_{name}")
    for name in ("_hpc_loop_sync_grads", "_hpc_loop_sync_params", "_hpc_loop_zero_grad"):
        if name in Mixin.__dict__:
            delattr(Mixin, name)
    utils.clip_grad_norm_ = getattr(utils, "_hpc_loop_clip_grad_norm_", clip)
    if hasattr(utils, "_hpc_loop_clip_grad_norm_"):
        del utils._hpc_loop_clip_grad_norm_


def bf16_updates(tiny, foreach: bool, updates: int = 3):
    """``updates`` bf16 updates through fairseq's FP16Optimizer; (norms, model weights, ops)."""
    task, model, criterion, cfg = tiny
    model = copy.deepcopy(model).bfloat16()
    optimizer = fp16_optimizer(cfg, model, foreach)
    norms, ops = [], []
    for i in range(updates):
        sample = batch(task, pads=bool(i % 2))
        optimizer.zero_grad()
        loss, _, _ = criterion(model, sample)
        optimizer.backward(loss)
        with torch.profiler.profile() as prof:
            norms.append(optimizer.clip_grad_norm(1.0))
            optimizer.step()
        ops.append(sum(1 for e in prof.events() if e.name.startswith("aten::")))
    return norms, {n: p.detach().clone() for n, p in model.named_parameters()}, ops


def test_foreach_grads_gives_fairseqs_updates_with_fewer_ops(tiny, fairseq_loops):
    norms, weights, ops = bf16_updates(tiny, foreach=False)
    norms2, weights2, ops2 = bf16_updates(tiny, foreach=True)
    assert [float(n) for n in norms] == [float(n) for n in norms2]
    for name, value in weights.items():
        assert torch.equal(value, weights2[name]), name
    # from the second update on (the first creates the master gradients, as fairseq does)
    print("ops per update", ops, ops2)
    assert ops2[-1] < ops[-1]
    assert all(math.isfinite(float(n)) for n in norms)


def test_compiled_layers_are_not_recompiled_for_validation(tiny, monkeypatch):
    """Dynamo's guards (its "eager" backend: no Inductor compile here, the same guards): the
    training forward compiles, eval runs eagerly; ``nn.Module.compile`` (the lever's former
    way) compiles again for eval, which is what this test would see if it came back."""
    import torch._dynamo

    task, model, criterion, _ = tiny
    monkeypatch.setattr(speed, "COMPILE_BACKEND", "eager")

    def frames_after(compile_fn) -> tuple[int, int]:
        torch._dynamo.reset()
        torch._dynamo.utils.counters.clear()
        copied = copy.deepcopy(model)
        compile_fn(copied)
        copied.train()
        forward_backward(copied, criterion, batch(task, pads=True))
        trained = torch._dynamo.utils.counters["stats"]["unique_graphs"]
        copied.eval()
        with torch.no_grad():
            criterion(copied, batch(task, pads=True))
        return trained, torch._dynamo.utils.counters["stats"]["unique_graphs"]

    trained, validated = frames_after(speed.compile_layers)
    assert trained >= 1 and validated == trained

    def module_compile(m) -> None:
        for layer in m.modules():
            if type(layer).__name__ in speed.LAYER_CLASSES:
                layer.compile(dynamic=True, backend="eager")

    trained_old, validated_old = frames_after(module_compile)
    assert validated_old > trained_old
    torch._dynamo.reset()


def logged_losses(save) -> dict[int, float]:
    """fairseq's per-update train loss from the rank's log (--log-interval 1)."""
    import json

    out = {}
    for line in (save / "train.log").read_text().splitlines():
        if "| train_inner |" in line:
            record = json.loads(line.split("| train_inner | ", 1)[1])
            out[int(record["num_updates"])] = float(record["loss"])
    return out


@pytest.mark.parametrize(
    ("precision", "names"),
    [
        ((), ("gelu", "pad-check", "host-sizes", "lazy-stats", "foreach-grads")),
        (("--bf16",), ("pad-check", "host-sizes", "lazy-stats", "foreach-grads")),  # gelu: rounding
    ],
)
def test_the_exact_levers_train_as_fairseq_does(corpus, tmp_path, tiny_run, precision, names):
    """Real fairseq through the worker, 12 updates, dropout on: the same logged losses and the
    same weights with the levers as without (each lever keeps fairseq's arithmetic)."""
    from hpc_train.job import levers

    saves = {}
    for label, asked in (("fairseq", "none"), ("levers", ",".join(names))):
        saves[label] = tmp_path / label
        saves[label].mkdir()
        tiny_run(corpus, saves[label], 12, "--log-interval", "1", *precision,
                 levers.WORKER_FLAG, asked)  # fmt: skip
    assert (
        f"speed levers on: {', '.join(sorted(names))}"
        in (saves["levers"] / "train.log").read_text()
    )
    theirs, ours = logged_losses(saves["fairseq"]), logged_losses(saves["levers"])
    assert sorted(theirs) == list(range(1, 13)) and ours == theirs
    weights = [
        torch.load(saves[n] / "checkpoint_last.pt", weights_only=False)["model"] for n in saves
    ]
    for key, value in weights[0].items():
        assert torch.equal(weights[1][key], value), key


def test_pack_gives_batches_without_padding(tiny):
    """``--sample-break-mode none`` (the pack lever): every block is full but the corpus's last,
    so every batch but the one holding it goes without a mask (SDPA may take its flash kernel);
    with fairseq's ``complete`` every batch of blocks of unequal lengths is padded (33 of 116
    here: batches are made of blocks of similar size)."""
    from fairseq import tasks

    task, _, _, _ = tiny
    padded = {}
    for mode in ("complete", "none"):
        cfg = train.fairseq_config([task.cfg.data, "--task", "masked_lm", "--arch", "roberta_base",
                                    "--tokens-per-sample", "64", "--sample-break-mode", mode,
                                    "--cpu", "--optimizer", "adam", "--batch-size", "8"])  # fmt: skip
        t = tasks.setup_task(cfg.task)
        t.load_dataset("train")
        itr = t.get_batch_iterator(t.dataset("train"), max_sentences=8, max_positions=64, seed=1,
                                   ignore_invalid_inputs=True)  # fmt: skip
        batches = list(itr.next_epoch_itr(shuffle=False))
        pad = t.source_dictionary.pad()
        padded[mode] = sum(bool(b["net_input"]["src_tokens"].eq(pad).any()) for b in batches)
        assert len(batches) > 10
    assert padded["none"] <= 1 and padded["complete"] > 10

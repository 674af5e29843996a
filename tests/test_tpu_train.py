"""The JAX train step (torchax, optax): loss and gradients equal diffusers' eager fp32 autograd, AdamW steps equal
torch's, LoRA trains only LoRA, resume is exact, FSDP on a mesh equals one device, and the step compiles for a TPU."""

import contextlib
import copy
import io
import json
import os
import subprocess
import sys

import pytest
import torch

pytest.importorskip("torchax")
pytest.importorskip("optax")

from tpu_train_probe import FAST, LR, STEPS, WD, lora_model, lora_steps, train_batch  # noqa: E402

from hyv_lib.base.errors import HyvInputError  # noqa: E402
from hyv_lib.models.families import get_preset  # noqa: E402
from hyv_lib.cli import commands as cli  # noqa: E402
from hyv_lib.models.components import build_tiny_components  # noqa: E402
from hyv_lib.models.flow_matching import flow_matching_loss  # noqa: E402
from hyv_lib.runtimes.jax_train import JaxTrainStep  # noqa: E402

TINY = get_preset("tiny")
PROBE = os.path.join(os.path.dirname(__file__), "tpu_train_probe.py")


@pytest.fixture(scope="module")
def model():
    return lora_model()


@pytest.fixture(scope="module")
def batch():
    return train_batch()


@pytest.fixture(scope="module")
def lora_run(model, batch):
    """Three JAX LoRA steps on one device (the blocks as a scan): the step, the losses, the state after step 1 and the
    trained LoRA factors."""
    step, losses, state = lora_steps(model, batch)
    trained = {n: p.detach().clone() for n, p in step.trained_transformer().named_parameters()}
    return step, losses, state, trained


def eager_loss(model, batch):
    """The objective in plain diffusers eager fp32: its own forward (dense-mask attention), then the MSE."""
    kwargs = {k: v for k, v in batch.items() if k != "target"}
    return flow_matching_loss(model(**kwargs, return_dict=False)[0], batch["target"])


def test_loss_and_gradients_equal_diffusers_eager_autograd(model, batch):
    """Every parameter (base weights and LoRA factors: trainable='full' on the LoRA model; blocks unrolled) against
    torch autograd through diffusers' own forward. Measured: the same loss, gradients within 1.2e-6 of the largest
    (unrolled and scanned blocks alike)."""
    oracle = copy.deepcopy(model).requires_grad_(True)
    loss = eager_loss(oracle, batch)
    loss.backward()
    step = JaxTrainStep(copy.deepcopy(model), trainable="full", compiler_options=FAST, scan_blocks=False)
    jax_loss, grads = step.gradients(batch)
    assert abs(jax_loss - loss.item()) <= 1e-5 * loss.item()
    expected = {n: torch.zeros_like(p) if p.grad is None else p.grad for n, p in oracle.named_parameters()}
    assert set(grads) == set(expected) and len(grads) > 100
    scale = max(g.abs().max().item() for g in expected.values())
    errors = {n: (grads[n] - g).abs().max().item() / scale for n, g in expected.items()}
    assert max(errors.values()) <= 1e-5, sorted(errors.items(), key=lambda kv: -kv[1])[:3]
    lora_scale = max(expected[n].abs().max().item() for n in expected if "lora_A" in n)
    assert lora_scale > 1e-3 * scale  # the LoRA factors' gradients are not vanishing, so they are checked too


def test_three_lora_steps_equal_torch_adamw_update_only_lora_and_resume_exactly(model, batch, lora_run):
    """optax's clip_by_global_norm + adamw against torch's clip_grad_norm_ + AdamW with the same hyper-parameters.
    A LoRA factor without a gradient path (the last block's context output) gets a zero gradient in JAX, so the torch
    reference fills its None gradient with zeros (AdamW would skip it, weight decay included)."""
    oracle = copy.deepcopy(model)
    names = [n for n, p in oracle.named_parameters() if "lora_" in n]
    trained = [p for n, p in oracle.named_parameters() if n in names]
    for n, p in oracle.named_parameters():
        p.requires_grad_(n in names)
    optimizer = torch.optim.AdamW(trained, lr=LR, weight_decay=WD)
    expected = []
    for _ in range(STEPS):
        optimizer.zero_grad()
        loss = eager_loss(oracle, batch)
        loss.backward()
        for p in trained:
            p.grad = torch.zeros_like(p) if p.grad is None else p.grad
        torch.nn.utils.clip_grad_norm_(trained, 1.0)
        optimizer.step()
        expected.append(loss.item())

    step, losses, state, after = lora_run
    assert step.compilations == 1 and step.scan
    assert max(abs(a - b) for a, b in zip(losses, expected)) <= 5e-6 * expected[0]  # measured 7e-7
    assert losses[2] < losses[0]  # it trains

    reference, before = dict(oracle.named_parameters()), dict(model.named_parameters())
    change = max((reference[n] - before[n]).abs().max().item() for n in names)
    error = max((after[n] - reference[n]).abs().max().item() for n in names)
    assert change > 2 * LR and error <= 5e-3 * change  # measured: 8.8e-7 = 0.03% of the change
    assert all(torch.equal(p, before[n]) for n, p in after.items() if n not in names)  # the base stays frozen

    # resume: the state after step 1 continues exactly as the run did (trained_transformer() put diffusers'
    # processors back on the module; the step installs its own again)
    step.load_state_dict(state)
    assert step.step_count == 1
    assert [step.step(batch) for _ in range(STEPS - 1)] == losses[1:]


def test_bad_inputs_are_named(model):
    with pytest.raises(HyvInputError, match="trainable"):
        JaxTrainStep(copy.deepcopy(model), trainable="some")
    plain = build_tiny_components(TINY, names=["transformer"])["transformer"]
    with pytest.raises(HyvInputError, match="add_lora"):
        JaxTrainStep(plain, trainable="lora")


def test_sharded_step_equals_one_device(lora_run):
    """FSDP over data=2 x sequence=2 (4 emulated CPU devices, a fresh process): every weight and the LoRA factors'
    AdamW moments split 4 ways, block weights gathered per block inside the scan, video tokens split over sequence;
    the three steps equal one device's (measured: losses within 7e-7 relative, LoRA factors within 0.01% of their
    change)."""
    env = dict(os.environ, JAX_PLATFORMS="cpu", OMP_NUM_THREADS="1")
    out = subprocess.run([sys.executable, PROBE], capture_output=True, text=True, timeout=600, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    _, losses, _, after = lora_run
    assert max(abs(a - b) for a, b in zip(result["losses"], losses)) <= 5e-6 * losses[0]
    before = dict(lora_model().named_parameters())
    change = max((after[n] - before[n]).abs().max().item() for n in result["trained"])
    error = max((torch.tensor(v) - after[n]).abs().max().item() for n, v in result["trained"].items())
    assert error <= 2e-3 * change
    assert result["devices"] == 4 and result["compilations"] == 1 and result["scan"]
    full, shard = result["weight"]["full"], result["weight"]["shard"]  # [blocks, out, in], stacked for the scan
    assert shard == [full[0], full[1] // 4, full[2]]  # FSDP: a frozen block weight split 4 ways
    mu = result["mu"]  # a LoRA B factor's AdamW moment, split 4 ways like its parameter
    assert mu["shard"] == [mu["full"][0], mu["full"][1] // 4, mu["full"][2]]


def test_tiny_train_step_compiles_for_a_tpu_slice():
    """The small twin of the real-size table (benchmarks/train_compile.py): ``python -m hyv_lib compile --train``
    compiles the whole update with libtpu for a v5p-8, Splash native (forward and backward kernels)."""
    pytest.importorskip("libtpu")
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.run(["compile", "--preset", "tiny", "--topology", "v5p:2x2x1", "--train", "lora",
                        "--batch_size", "2", "--json"])
    assert code == 0, err.getvalue()
    report = json.loads(out.getvalue())
    assert {"per_device_bytes", "fits", "flops_per_device", "matmul_flops_per_device", "collectives",
            "hbm_available_per_device", "parameters", "compile_seconds"} <= set(report)
    assert report["mesh"] == {"data": 2, "tensor": 1, "sequence": 2} and report["fits"] and report["scan_blocks"]
    assert report["lora"] == {"rank": 8, "alpha": 16.0}  # the official recipe's
    assert report["attention"]["native"] and report["matmul_flops_per_device"] > 0
    assert report["unknown_trip_counts"] == 0  # the scan's trip count is known, so the block FLOPs count 2 times
    assert 0 < report["parameters"]["trainable"] < report["parameters"]["total"]
    assert "all-gather" in {c["kind"] for c in report["collectives"]}  # FSDP's per-block gathers
    assert cli.run(["compile", "--preset", "tiny", "--train", "lora", "--sharding", "tp"]) == 2


def test_hlo_flops_count_a_tpu_scan_after_a_splash_config():
    """The HLO re-count on the TPU compiler's shape of a scan over blocks: the loop carries no known_trip_count (its
    N is in the ``i < N`` condition), follows a custom call whose multi-line config starts lines with '}}', and holds
    a dot written as a convolution over a padded window."""
    from types import SimpleNamespace

    from hyv_lib.planning.hlo import xla_flops

    text = """HloModule m

%body (p: (s32[], f32[4,8], f32[8,8])) -> (s32[], f32[4,8], f32[8,8]) {
  %p = (s32[], f32[4,8], f32[8,8]) parameter(0)
  %x = f32[4,8]{1,0:T(8,128)} get-tuple-element(%p), index=1
  %w = f32[8,8]{1,0:T(8,128)} get-tuple-element(%p), index=2
  %d = f32[4,8]{1,0:T(8,128)} dot(%x, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %x3 = f32[10,16,1]{2,1,0} parameter(1)
  %w3 = f32[4,8,16]{2,1,0} parameter(2)
  %q = f32[10,4,8]{2,1,0} convolution(%x3, %w3), window={size=4 pad=3_3 rhs_reversal=1}, dim_labels=bf0_0oi->b0f
  ROOT %t = (s32[], f32[4,8], f32[8,8]) tuple(%i, %d, %w)
}

%cond (p: (s32[], f32[4,8], f32[8,8])) -> pred[] {
  %c = s32[]{:T(128)} constant(54)
  %p = (s32[], f32[4,8], f32[8,8]) parameter(0)
  %i = s32[]{:T(128)} get-tuple-element(%p), index=0
  ROOT %lt = pred[]{:T(512)} compare(%i, %c), direction=LT, metadata={op_name="while/cond/lt"}
}

ENTRY %main (a: f32[4,8], w: f32[8,8]) -> f32[4,8] {
  %a = f32[4,8]{1,0} parameter(0)
  %k = f32[4,8]{1,0} custom-call(%a), custom_call_target="tpu_custom_call", backend_config={"config":
}}, metadata={op_name="splash"}
  %w = f32[8,8]{1,0} parameter(1)
  %t = (s32[], f32[4,8], f32[8,8]) tuple(%z, %k, %w)
  %loop = (s32[], f32[4,8], f32[8,8]) while(%t), condition=%cond, body=%body
  ROOT %out = f32[4,8]{1,0} get-tuple-element(%loop), index=1
}
"""
    counts = xla_flops(SimpleNamespace(as_text=lambda: text, cost_analysis=lambda: {"flops": 0.0}))
    # the dot, and a dot the TPU compiler wrote as a convolution: a size-1 input under a padded window of 4 (one tap)
    assert counts["matmul"] == 54 * (2 * 4 * 8 * 8 + 2 * 10 * 4 * 8 * 16) and counts["unknown_trip_counts"] == 0

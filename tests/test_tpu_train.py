"""The JAX train step (torchax, optax): loss and gradients equal diffusers' eager fp32 autograd, AdamW steps equal
torch's, LoRA trains only LoRA, resume is exact, FSDP on a mesh equals one device, and the step compiles for a TPU."""

import copy
import json
import os
import subprocess
import sys

import pytest
import torch

pytest.importorskip("torchax")
pytest.importorskip("optax")

from tiny_inputs import forward_kwargs  # noqa: E402

from hyv_lib.base.errors import HyvInputError  # noqa: E402
from hyv_lib.base.presets import get_preset  # noqa: E402
from hyv_lib.models.components import build_tiny_components  # noqa: E402
from hyv_lib.models.flow_matching import flow_matching_loss  # noqa: E402
from hyv_lib.models.lora import add_lora  # noqa: E402
from hyv_lib.runtimes.tpu_train import TpuTrainStep  # noqa: E402

TINY = get_preset("tiny")
PROBE = os.path.join(os.path.dirname(__file__), "tpu_train_probe.py")
FAST = {"xla_backend_optimization_level": 0}  # compiles the CPU programs about twice as fast here
LR, WD = 1e-3, 0.01


@pytest.fixture(scope="module")
def lora_model():
    """The tiny DiT in fp32 with a rank-4 LoRA whose B factors are random (at B = 0 the A factors get no gradient)."""
    model = build_tiny_components(TINY, names=["transformer"])["transformer"].float()
    add_lora(model, 4, 8.0)
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=generator) * 0.05)
    return model


@pytest.fixture(scope="module")
def batch():
    """A t2v batch of 2 with real padding (different text and ByT5 lengths) and a velocity target."""
    kwargs = forward_kwargs(0)
    kwargs.pop("return_dict", None)
    target = torch.randn(2, TINY.latent_channels, *kwargs["hidden_states"].shape[2:],
                         generator=torch.Generator().manual_seed(1))
    return dict(kwargs, target=target)


def eager_loss(model, batch):
    """The objective in plain diffusers eager fp32: its own forward (dense-mask attention), then the MSE."""
    kwargs = {k: v for k, v in batch.items() if k != "target"}
    return flow_matching_loss(model(**kwargs, return_dict=False)[0], batch["target"])


def test_loss_and_gradients_equal_diffusers_eager_autograd(lora_model, batch):
    """Every parameter (base weights and LoRA factors: trainable='full' on the LoRA model) against torch autograd
    through diffusers' own forward. Measured here: loss 2e-7 relative, gradients 1.1e-5 of the largest gradient."""
    oracle = copy.deepcopy(lora_model).requires_grad_(True)
    loss = eager_loss(oracle, batch)
    loss.backward()
    step = TpuTrainStep(copy.deepcopy(lora_model), trainable="full", compiler_options=FAST)
    jax_loss, grads = step.gradients(batch)
    assert abs(jax_loss - loss.item()) <= 1e-5 * loss.item()
    expected = {n: torch.zeros_like(p) if p.grad is None else p.grad for n, p in oracle.named_parameters()}
    assert set(grads) == set(expected) and len(grads) > 100
    scale = max(g.abs().max().item() for g in expected.values())
    errors = {n: (grads[n] - g).abs().max().item() / scale for n, g in expected.items()}
    assert max(errors.values()) <= 1e-4, sorted(errors.items(), key=lambda kv: -kv[1])[:3]
    lora_scale = max(expected[n].abs().max().item() for n in expected if "lora_A" in n)
    assert lora_scale > 1e-3 * scale  # the LoRA factors' gradients are not vanishing, so they are checked too


def test_three_lora_steps_equal_torch_adamw_update_only_lora_and_resume_exactly(lora_model, batch):
    """optax's clip_by_global_norm + adamw against torch's clip_grad_norm_ + AdamW with the same hyper-parameters.
    A LoRA factor without a gradient path (the last block's context output) gets a zero gradient in JAX, so the torch
    reference fills its None gradient with zeros (AdamW would skip it, weight decay included)."""
    oracle = copy.deepcopy(lora_model)
    names = [n for n, p in oracle.named_parameters() if "lora_" in n]
    trained = [p for n, p in oracle.named_parameters() if n in names]
    for n, p in oracle.named_parameters():
        p.requires_grad_(n in names)
    optimizer = torch.optim.AdamW(trained, lr=LR, weight_decay=WD)
    expected = []
    for _ in range(3):
        optimizer.zero_grad()
        loss = eager_loss(oracle, batch)
        loss.backward()
        for p in trained:
            p.grad = torch.zeros_like(p) if p.grad is None else p.grad
        torch.nn.utils.clip_grad_norm_(trained, 1.0)
        optimizer.step()
        expected.append(loss.item())

    step = TpuTrainStep(copy.deepcopy(lora_model), trainable="lora", learning_rate=LR, weight_decay=WD,
                        compiler_options=FAST)
    losses = [step.step(batch)]
    state = step.state_dict()
    losses += [step.step(batch) for _ in range(2)]
    assert step.compilations == 1
    assert max(abs(a - b) for a, b in zip(losses, expected)) <= 2e-6 * expected[0]
    assert losses[2] < losses[0]  # it trains

    trained_model = dict(step.trained_transformer().named_parameters())
    reference, before = dict(oracle.named_parameters()), dict(lora_model.named_parameters())
    change = max((reference[n] - before[n]).abs().max().item() for n in names)
    error = max((trained_model[n] - reference[n]).abs().max().item() for n in names)
    assert change > 2 * LR and error <= 0.02 * change  # measured: error 1.6e-5 = 0.5% of the change
    assert all(torch.equal(p, before[n]) for n, p in trained_model.items() if n not in names)  # base frozen

    # resume: the state after step 1 continues exactly as the run did (the module went back to diffusers'
    # processors for trained_transformer(); the step puts its own back)
    step.load_state_dict(state)
    assert step.step_count == 1
    assert [step.step(batch) for _ in range(2)] == losses[1:]


def test_bad_inputs_are_named(lora_model, batch):
    with pytest.raises(HyvInputError, match="trainable"):
        TpuTrainStep(copy.deepcopy(lora_model), trainable="some")
    plain = build_tiny_components(TINY, names=["transformer"])["transformer"]
    with pytest.raises(HyvInputError, match="add_lora"):
        TpuTrainStep(plain, trainable="lora")


def test_sharded_step_equals_one_device():
    """FSDP over data=2 x sequence=2 (4 emulated CPU devices): every weight and the LoRA factors' AdamW moments split
    4 ways, block weights gathered per block inside the scan over blocks, video tokens split over sequence; two steps
    equal one device's running the blocks unrolled."""
    env = dict(os.environ, JAX_PLATFORMS="cpu", OMP_NUM_THREADS="1")
    out = subprocess.run([sys.executable, PROBE, "lora", "2"], capture_output=True, text=True, timeout=600, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    one, mesh = result["losses"]["one"], result["losses"]["mesh"]
    assert max(abs(a - b) for a, b in zip(one, mesh)) <= 1e-5 * one[0]
    assert result["max_param_err"] <= 0.02 * result["max_param_change"]
    assert result["devices"] == 4 and result["compilations"] == 1 and result["scan"] == [False, True]
    full, shard = result["weight"]["full"], result["weight"]["shard"]  # [blocks, out, in], stacked for the scan
    assert shard == [full[0], full[1] // 4, full[2]]  # FSDP: a frozen block weight split 4 ways
    mu = result["mu"]  # a LoRA factor's AdamW moment, split 4 ways like its parameter
    assert "lora_B" in mu["name"] and mu["shard"] == [mu["full"][0], mu["full"][1] // 4, mu["full"][2]]


def test_tiny_train_step_compiles_for_a_tpu_slice():
    """The small twin of the real-size table: the whole update compiled by libtpu for a v5p-8, Splash native."""
    pytest.importorskip("libtpu")
    from hyv_lib.planning.train_compile import compile_train_step

    report = compile_train_step("tiny", "v5p:2x2x1", train="lora", batch_size=2)
    assert {"per_device_bytes", "fits", "flops_per_device", "collectives", "hbm_available_per_device",
            "parameters", "compile_seconds"} <= set(report)
    assert report["mesh"] == {"data": 2, "tensor": 1, "sequence": 2} and report["fits"]
    assert report["attention"]["native"] and report["flops_per_device"] > 0
    assert report["parameters"]["trainable"] < report["parameters"]["total"]
    kinds = {c["kind"] for c in report["collectives"]}
    assert "all-gather" in kinds  # FSDP's per-block gathers

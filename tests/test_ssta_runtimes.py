"""SSTA (the ``ssta`` FlexAttention backend) in every torch runtime, each equal to the same model run with the fp32
``ssta_reference`` backend: Ulysses on 2 gloo ranks (dense_every's blocks included), DeepCache and MagCache, a LoRA,
and the train step's loss and gradients (FlexAttention's forward with hyv_lib's tile backward on the CPU).

One latent grid, batch and per-kernel head count (2) throughout, so FlexAttention compiles one program: the Ulysses
ranks run a 4-head model (2 heads each) and find it in inductor's on-disk cache."""

import copy
import dataclasses
import time

import pytest
import torch
import torch.distributed as dist
from tiny_inputs import TINY, forward_kwargs

from hyv_lib.base.errors import HyvInputError
from hyv_lib.kernels import ssta_torch
from hyv_lib.kernels.ssta import SstaConfig
from hyv_lib.models.registry import adapter_for
from hyv_lib.runtimes.deepcache import DeepCacheSchedule
from hyv_lib.runtimes.magcache import MagCacheSchedule
from hyv_lib.runtimes.step import make_step

#: 105 video tokens (odd: 2 Ulysses ranks pad one row) in 2 x 3 x 4 tiles of 2x2x2 cells; a 1x3x3 window and 4 top-k
#: tiles (2 at <= 31 frames) leave about half of the video tile pairs out.
LATENT = (3, 5, 7)
CONFIG = SstaConfig(tile=(2, 2, 2), window=(1, 3, 3), topk=4)
HYBRID = dataclasses.replace(CONFIG, dense_every=2)  # of the tiny model's 2 blocks, the second runs dense
#: What sparse attention changes in the tiny model's output (measured 0.026): every comparison below is far tighter.
SPARSE_EFFECT = 1e-2


def tiny_transformer():
    from hyv_lib.models.components import build_tiny_components

    return build_tiny_components(TINY, names=["transformer"])["transformer"]


def four_heads():
    """The tiny preset's transformer with 4 heads of the same size (16), seeded: 2 whole heads on each of 2 ranks."""
    from diffusers.models.transformers.transformer_hunyuan_video15 import HunyuanVideo15Transformer3DModel

    torch.manual_seed(3)
    return HunyuanVideo15Transformer3DModel(**{**TINY.transformer, "num_attention_heads": 4}).eval()


@pytest.fixture(scope="module")
def model():
    return tiny_transformer()


@pytest.fixture(scope="module")
def inputs():
    return forward_kwargs(latent=LATENT)


def with_attention(model, backend, config=CONFIG):
    """A copy of ``model`` with ``backend`` installed (an SSTA backend with ``config``)."""
    copied = copy.deepcopy(model)
    adapter_for(copied).use_attention(copied, backend, **({} if backend == "auto" else {"ssta": config}))
    return copied


def predict(model, kwargs):
    with torch.no_grad():
        return model(**kwargs).sample


@pytest.fixture(scope="module")
def reference(model, inputs):
    """The ``ssta_reference`` model's predictions, sparse and hybrid, and the dense model's."""
    return {"sparse": predict(with_attention(model, "ssta_reference"), inputs),
            "hybrid": predict(with_attention(model, "ssta_reference", HYBRID), inputs),
            "dense": predict(with_attention(model, "auto"), inputs)}


def test_the_torch_step_equals_the_reference(model, inputs, reference):
    out = make_step(copy.deepcopy(model), "torch", attention="ssta", attention_options={"ssta": CONFIG})(**inputs)
    error = (out - reference["sparse"]).abs().max().item()
    effect = (reference["sparse"] - reference["dense"]).abs().max().item()
    print(f"\ntorch step: max error {error:.1e} (measured 3e-7); sparse vs dense {effect:.1e}")
    assert error <= 2e-6
    assert effect > SPARSE_EFFECT  # the test sees sparsity


def test_attention_options_are_checked(model):
    with pytest.raises(HyvInputError, match="attention_options: diffusers' own processor"):
        make_step(copy.deepcopy(model), "torch", attention="diffusers", attention_options={"ssta": CONFIG})
    with pytest.raises(HyvInputError, match="attention_options: must be None or a dict"):
        make_step(copy.deepcopy(model), "torch", attention="ssta", attention_options=CONFIG)
    with pytest.raises(TypeError):  # an option the backend does not take, refused when the step is made
        make_step(copy.deepcopy(model), "torch", attention="ssta", attention_options={"block_kv": 128})


# ------------------------------------------------------------------------------------------------ Ulysses
def ulysses_ranks():
    """On each of 2 gloo ranks: the Ulysses step with ssta (sparse, hybrid) from make_step, which blocks run what,
    and share_heads refused. Every rank's findings."""
    from hyv_lib.runtimes.ulysses import UlyssesTransformer

    model, kwargs = four_heads(), forward_kwargs(latent=LATENT)
    found = {}
    for name, config in (("sparse", CONFIG), ("hybrid", HYBRID)):
        step = make_step(copy.deepcopy(model), "ulysses", attention="ssta", attention_options={"ssta": config})
        start = time.perf_counter()
        found[name] = step(**kwargs)
        found[f"{name}_seconds"] = time.perf_counter() - start
        found[f"{name}_backends"] = [p.backend for p in step.processors]
    try:
        UlyssesTransformer(copy.deepcopy(model), attention_backend="ssta",
                           attention_options={"ssta": dataclasses.replace(CONFIG, share_heads=True)})
    except HyvInputError as err:
        found["share_heads"] = str(err)
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, found)
    return everyone


@pytest.fixture(scope="module")
def ulysses(inputs):
    """Every rank's findings, and the single-process reference model's predictions."""
    from hyv_lib.parallel.distributed import run_distributed

    start = time.perf_counter()
    found = run_distributed(ulysses_ranks, 2, timeout=300)
    print(f"\n2 gloo ranks: {time.perf_counter() - start:.1f} s")
    model = four_heads()
    return found, {kind: predict(with_attention(model, "ssta_reference", config), inputs)
                   for kind, config in (("sparse", CONFIG), ("hybrid", HYBRID))}


@pytest.mark.parametrize("kind", ["sparse", "hybrid"])
def test_ulysses_equals_the_reference(ulysses, kind):
    """Each rank's whole heads over the whole sequence: the single process's tiles, so the same output on every rank
    (up to float rounding); dense_every's block runs dense under Ulysses too."""
    ulysses, reference = ulysses
    errors = [(found[kind] - reference[kind]).abs().max().item() for found in ulysses]
    print(f"\nUlysses ({kind}, 2 ranks): max errors {['%.1e' % e for e in errors]}, first calls "
          f"{['%.1f s' % found[f'{kind}_seconds'] for found in ulysses]}")
    assert max(errors) <= 2e-6  # measured 4e-7
    assert torch.equal(ulysses[0][kind], ulysses[1][kind])
    assert ulysses[0][f"{kind}_backends"] == (["ssta", "ssta"] if kind == "sparse" else ["ssta", "auto"])
    assert (reference["sparse"] - reference["hybrid"]).abs().max() > SPARSE_EFFECT  # the dense block counts


def test_ulysses_refuses_shared_heads(ulysses):
    ulysses, _ = ulysses
    assert all(found["share_heads"].startswith("attention_options: SstaConfig(share_heads=True)")
               for found in ulysses)


# ------------------------------------------------------------------------------------ DeepCache, MagCache
def step_inputs(inputs, steps):
    """Per-step forward arguments: fresh latents and a falling timestep on the module's conditioning."""
    g = torch.Generator().manual_seed(5)
    return [{**inputs, "hidden_states": torch.randn(inputs["hidden_states"].shape, generator=g),
             "timestep": torch.full_like(inputs["timestep"], 900.0 - 200.0 * i)} for i in range(steps)]


SCHEDULES = {"deepcache": DeepCacheSchedule(4, start=1, end=4, interval=2),  # steps 0, 1, 3 full
             "magcache": MagCacheSchedule((0.0, 0.01, 0.01, 0.01), threshold=0.1, max_skip=1, retention=0.25)}


@pytest.mark.parametrize("name", list(SCHEDULES))
def test_cached_steps(model, inputs, name):
    """Full steps equal the uncached ssta step exactly (the same forward); cached steps run and equal the cached
    reference model's."""
    schedule = SCHEDULES[name]
    options = {"ssta": CONFIG}
    cached = make_step(copy.deepcopy(model), "torch", attention="ssta", attention_options=options, cache=schedule)
    reference = make_step(copy.deepcopy(model), "torch", attention="ssta_reference", attention_options=options,
                          cache=schedule)
    plain = make_step(copy.deepcopy(model), "torch", attention="ssta", attention_options=options)
    errors = []
    for index, kwargs in enumerate(step_inputs(inputs, schedule.num_steps)):
        out = cached(**kwargs)
        if schedule.is_full(index):
            assert torch.equal(out, plain(**kwargs)), index
        errors.append((out - reference(**kwargs)).abs().max().item())
    print(f"\n{name} over ssta: full steps {schedule.full_steps}, max errors per step {['%.1e' % e for e in errors]}")
    assert (cached.full_calls, cached.cached_calls) == (len(schedule.full_steps), 4 - len(schedule.full_steps))
    assert cached.cached_calls >= 1 and cached.skipped_steps == reference.skipped_steps
    assert max(errors) <= 2e-6  # measured 4e-7


# ------------------------------------------------------------------------------------------ LoRA, training
@pytest.fixture(scope="module")
def lora_model(model):
    """The tiny model with a rank-4 LoRA whose B matrices are random (peft starts them at zero)."""
    from hyv_lib.models.lora import add_lora

    adapted = copy.deepcopy(model)
    with torch.random.fork_rng(devices=[]):  # peft draws lora_A from the global RNG
        torch.manual_seed(7)
        add_lora(adapted, rank=4)
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, param in adapted.named_parameters():
            if "lora_B" in name:
                param.copy_(0.1 * torch.randn(param.shape, generator=g))
    return adapted


def test_lora_equals_the_reference_with_the_same_lora(lora_model, inputs, reference):
    fast, slow = (predict(with_attention(lora_model, backend), inputs) for backend in ("ssta", "ssta_reference"))
    error = (fast - slow).abs().max().item()
    effect = (slow - reference["sparse"]).abs().max().item()
    print(f"\nLoRA: max error {error:.1e} (measured 2e-7); the LoRA changes the output by {effect:.1e}")
    assert error <= 2e-6
    assert effect > SPARSE_EFFECT


def train_grads(model, backend, batch, trainable):
    """Loss and (clipped) gradients of one update of the training loop's torch step (TorchTrainStep, gradient
    checkpointing on), ``backend`` installed with :data:`CONFIG` by the loop's ``make_train_step``."""
    from hyv_lib.training.loop import make_train_step

    copied = copy.deepcopy(model)
    step = make_train_step("torch", copied, trainable=trainable, learning_rate=1e-4, warmup_steps=0,
                           weight_decay=0.0, attention=backend, attention_options={"ssta": CONFIG})
    loss = step.step(batch)
    return loss, {name: p.grad.clone() for name, p in copied.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("trainable", ["full", "lora"])
def test_train_step_gradients_equal_the_reference(model, lora_model, inputs, monkeypatch, trainable):
    """The backward through SSTA on the CPU (hyv_lib's tile backward, in chunks of 1000 of the ~7100 attended tile
    pairs here, so several chunks and a remainder) against autograd through the fp32 reference, every trainable
    weight's gradient."""
    tokens = CONFIG.tile[0] * CONFIG.tile[1] * CONFIG.tile[2]
    monkeypatch.setattr(ssta_torch, "PAIR_CHUNK_ELEMENTS", 1000 * tokens * tokens)
    g = torch.Generator().manual_seed(9)
    batch = {**inputs, "target": torch.randn(inputs["hidden_states"].shape[0], TINY.latent_channels, *LATENT,
                                             generator=g)}
    base = model if trainable == "full" else lora_model
    (loss, grads), (ref_loss, ref_grads) = (train_grads(base, b, batch, trainable) for b in ("ssta", "ssta_reference"))
    assert grads.keys() == ref_grads.keys() and len(grads) > 0
    scale = max(g.abs().max().item() for g in ref_grads.values())
    errors = {name: ((grads[name] - g).abs().max() / g.abs().max().clamp(min=1e-3 * scale)).item()
              for name, g in ref_grads.items()}
    worst = max(errors, key=errors.get)
    print(f"\ntrain step ({trainable}, {len(grads)} tensors): loss {loss:.6f} vs {ref_loss:.6f}; worst relative "
          f"gradient error {errors[worst]:.1e} ({worst})")
    assert abs(loss - ref_loss) <= 1e-6 * abs(ref_loss)
    assert errors[worst] <= 1e-5  # measured 5e-7

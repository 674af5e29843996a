"""Step profiles: HLO ops sorted into kinds, a jax.profiler trace attributed to them, time split as FLOPs say."""

import dataclasses

import pytest
import torch

import hyv_lib
from hyv_lib.models.components import build_tiny_components
from hyv_lib.models.hunyuan_video15.components import example_forward_kwargs
from hyv_lib.planning.costs import step_flops
from hyv_lib.planning.profile import OP_KINDS, classify_hlo, profile_step, profile_transformer

jax = pytest.importorskip("jax")
jnp = jax.numpy


def _attention_and_linear(x, w, q, k, v):
    """A linear layer and one softmax attention, written out: the kinds of every op are known by construction."""
    y = x @ w
    scores = jnp.einsum("bhqd,bhkd->bhqk", q, k) / 8.0
    probs = jax.nn.softmax(scores, axis=-1)
    return y, jnp.einsum("bhqk,bhkd->bhqd", probs, v)


def _inputs():
    keys = jax.random.split(jax.random.key(0), 5)
    shapes = [(512, 256), (256, 256), (2, 4, 384, 64), (2, 4, 384, 64), (2, 4, 384, 64)]
    return [jax.random.normal(key, shape) for key, shape in zip(keys, shapes)]


def test_classify_and_profile_a_hand_written_program(tmp_path):
    args = _inputs()
    jitted = jax.jit(_attention_and_linear)
    compiled = jitted.lower(*args).compile()
    ops = classify_hlo(compiled.as_text())
    kinds = {op.kind for op in ops.values()}
    # x @ w has no batch dimensions; both einsums are batched over (b, h); the softmax's exp and reductions read
    # the scores that the first einsum writes and the second reads.
    assert {"linear matmuls", "attention matmuls", "attention softmax and mask"} <= kinds
    linear = [op for op in ops.values() if op.kind == "linear matmuls"]
    attention = [op for op in ops.values() if op.kind == "attention matmuls"]
    assert any(op.shape == "f32[512,256]" for op in linear)
    assert {op.shape for op in attention} >= {"f32[2,4,384,64]"} and all(op.shape.startswith("f32[2,4,384,")
                                                                           for op in attention)
    jitted(*args)[1].block_until_ready()  # warm: the profile must not hold the compiler
    profile = profile_step(lambda: jax.block_until_ready(jitted(*args)), compiled.as_text(), repeats=3,
                           trace_dir=str(tmp_path))
    print({k: f"{1e3 * s:.2f} ms" for k, s in profile.by_kind.items()}, f"wall {1e3 * profile.wall_seconds:.2f} ms")
    assert abs(sum(profile.shares.values()) - 1) < 1e-9
    assert abs(sum(o["share"] for o in profile.ops) - 1) < 1e-9
    assert set(profile.by_kind) == set(OP_KINDS)
    assert profile.by_kind["linear matmuls"] > 0 and profile.by_kind["attention matmuls"] > 0
    # the ops ran inside the traced calls: their busy time cannot exceed the calls' wall time
    assert 0 < profile.busy_seconds <= profile.wall_seconds
    assert all(o["kind"] in OP_KINDS for o in profile.ops)  # the while/call containers are not counted twice
    assert profile.trace_dir == str(tmp_path) and list(tmp_path.rglob("perfetto_trace.json.gz"))  # kept: given


def _dit_profile(heads: int, head_dim: int, latent: tuple[int, int, int]):
    """One CFG step of a random-weight DiT of hyv-tiny's classes (3 blocks) on the TPU runtime (JAX on this CPU)."""
    from hyv_lib.runtimes.jax_step import JaxTransformer

    base = hyv_lib.get_preset("tiny_trained")
    quarter = head_dim // 4
    preset = dataclasses.replace(base, transformer=dict(base.transformer, num_attention_heads=heads,
                                                        attention_head_dim=head_dim,
                                                        rope_axes_dim=[quarter, 3 * quarter // 2, 3 * quarter // 2]))
    model = build_tiny_components(preset, names=["transformer"])["transformer"]
    kwargs = example_forward_kwargs(preset, latent=latent, text_lengths=(7, 12), byt5_lengths=(0, 5))
    frames, h, w = latent
    flops = step_flops(preset, 16 * h, 16 * w, 4 * (frames - 1) + 1)
    return flops, profile_transformer(JaxTransformer(model), kwargs, repeats=2)


@pytest.mark.parametrize("heads, head_dim, latent", [(8, 32, (3, 4, 7)), (2, 32, (5, 12, 16))],
                         ids=["wide-and-short", "narrow-and-long"])
def test_the_larger_flop_part_takes_the_larger_time(heads, head_dim, latent):
    """Where step_flops says attention (or the linear layers) does most of the work, the profile finds most of the
    time there too. Measured here (2 shared cores): wide-and-short (d = 256, S = 128, attention 6.4% of the FLOPs)
    spent 7.7x as long in linear matmuls as in attention; narrow-and-long (d = 64, S = 1004, attention 64% of the
    FLOPs) 2.4x to 3.3x as long in attention (its matmuls, softmax and mask) as in linear matmuls. The margin
    asserted is 1.5x."""
    torch.set_num_threads(1)
    flops, profile = _dit_profile(heads, head_dim, latent)
    attention_time = profile.by_kind["attention matmuls"] + profile.by_kind["attention softmax and mask"]
    linear_time = profile.by_kind["linear matmuls"]
    print(f"attention {flops['attention_share']:.1%} of the FLOPs, {attention_time / profile.op_seconds:.1%} of the "
          f"op time; linear matmuls {linear_time / profile.op_seconds:.1%}; time ratio attention / linear "
          f"{attention_time / linear_time:.2f} against a FLOP ratio of {flops['attention'] / flops['linear']:.2f}")
    assert abs(sum(profile.shares.values()) - 1) < 1e-9
    assert profile.busy_seconds <= profile.wall_seconds
    assert profile.trace_dir is None  # no folder given: the trace was written to a temporary one and removed
    if flops["attention"] > flops["linear"]:
        assert attention_time > 1.5 * linear_time
    else:
        assert linear_time > 1.5 * attention_time

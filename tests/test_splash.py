"""Splash attention (Pallas interpret mode on CPU) against a float64 masked-softmax reference."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from hyv_lib import HyvInputError
from hyv_lib.kernels.splash import DEFAULT_BLOCK_SIZES, resolve_block_sizes, splash_attention, splash_attention_jax

SMALL = dict(block_q=128, block_kv=256, block_kv_compute=128)  # keeps interpret mode fast; S below is not a multiple
FP32_TOL = 1e-5
BF16_TOL = 2e-2


def reference(q, k, v, kv_mask):
    """float64 attention over valid keys only; rows of invalid tokens (and of all-invalid elements) are zero."""
    q, k, v = (t.double() for t in (q, k, v))
    logits = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    logits = logits.masked_fill(~kv_mask[:, None, None, :], float("-inf"))
    peak = logits.amax(-1, keepdim=True)
    peak = torch.where(torch.isfinite(peak), peak, torch.zeros_like(peak))
    weights = torch.exp(logits - peak)
    weights = weights / weights.sum(-1, keepdim=True).clamp_min(1e-300)
    return (weights @ v) * kv_mask[:, None, :, None]


def make_mask(kind, batch, seq, gen):
    if kind == "all":
        return torch.ones(batch, seq, dtype=torch.bool)
    if kind == "prefix":  # random valid lengths, element 0 has none at all
        lengths = torch.randint(1, seq + 1, (batch,), generator=gen)
        lengths[0] = 0
        return torch.arange(seq)[None, :] < lengths[:, None]
    if kind == "scattered":  # non-prefix: random holes everywhere
        return torch.rand(batch, seq, generator=gen) < 0.6
    raise ValueError(kind)


def qkv(batch, heads, seq, dim, dtype, gen):
    return tuple(torch.randn(batch, heads, seq, dim, generator=gen).to(dtype) for _ in range(3))


@pytest.mark.parametrize(
    "batch,heads,seq,dim,kind",
    [
        (2, 2, 300, 64, "prefix"),
        (2, 2, 300, 64, "all"),
        (3, 1, 257, 16, "scattered"),
        (2, 2, 700, 128, "scattered"),
        (2, 1, 129, 128, "prefix"),
    ],
)
def test_fp32_matches_reference(batch, heads, seq, dim, kind):
    gen = torch.Generator().manual_seed(seq * dim + len(kind))
    q, k, v = qkv(batch, heads, seq, dim, torch.float32, gen)
    mask = make_mask(kind, batch, seq, gen)
    out = splash_attention(q, k, v, mask, **SMALL)
    assert out.dtype == torch.float32 and out.shape == q.shape
    err = (out.double() - reference(q, k, v, mask)).abs().max().item()
    assert err <= FP32_TOL, err
    assert torch.all(out[~mask[:, None, :].expand(-1, heads, -1)] == 0)


def test_bf16_matches_reference():
    gen = torch.Generator().manual_seed(7)
    q, k, v = qkv(2, 2, 500, 128, torch.bfloat16, gen)
    mask = make_mask("scattered", 2, 500, gen)
    ref = reference(q, k, v, mask)
    out = splash_attention(q, k, v, mask, **SMALL)
    assert out.dtype == torch.bfloat16
    diff = (out.double() - ref).abs()
    # Default f32 compute: only the final rounding to bf16 remains (<= 2**-9 relative, 2**-8 with margin).
    assert torch.all(diff <= ref.abs() * 2.0**-8 + FP32_TOL), diff.max().item()
    assert diff.max().item() <= BF16_TOL
    # bf16 compute adds the rounding of q * 1/sqrt(128) to bf16: still within the bf16 tolerance.
    fast = splash_attention(q, k, v, mask, compute_dtype="bfloat16", **SMALL)
    assert (fast.double() - ref).abs().max().item() <= BF16_TOL


def test_no_nan_for_degenerate_masks():
    gen = torch.Generator().manual_seed(3)
    batch, seq = 4, 200
    q, k, v = qkv(batch, 1, seq, 16, torch.float32, gen)
    mask = torch.zeros(batch, seq, dtype=torch.bool)  # element 0: nothing valid
    mask[1] = True  # all valid
    mask[2, 0] = True  # one valid token, first
    mask[3, -1] = True  # one valid token, last (shares its block with the padding)
    out = splash_attention(q, k, v, mask, **SMALL)
    assert not torch.isnan(out).any()
    assert torch.all(out[0] == 0)
    assert (out.double() - reference(q, k, v, mask)).abs().max().item() <= FP32_TOL
    # A lone valid token attends only to itself: its output is its own value row.
    torch.testing.assert_close(out[2, :, 0], v[2, :, 0], rtol=0, atol=FP32_TOL)
    torch.testing.assert_close(out[3, :, -1], v[3, :, -1], rtol=0, atol=FP32_TOL)


def test_default_block_sizes_and_clamping():
    assert all(b % 128 == 0 for b in DEFAULT_BLOCK_SIZES.values())
    assert DEFAULT_BLOCK_SIZES["block_kv"] % DEFAULT_BLOCK_SIZES["block_kv_compute"] == 0
    assert resolve_block_sizes(300, None, None, None) == (384, 384, 384)
    assert resolve_block_sizes(700, None, None, None) == (768, 768, 768)
    assert resolve_block_sizes(700, 512, 1024, 512) == (512, 768, 384)
    assert resolve_block_sizes(100_000, None, None, None) == tuple(DEFAULT_BLOCK_SIZES.values())
    # Default blocks (clamped) on a short sequence, interpret chosen automatically (CPU -> interpret mode).
    gen = torch.Generator().manual_seed(5)
    q, k, v = qkv(1, 2, 200, 64, torch.float32, gen)
    mask = make_mask("scattered", 1, 200, gen)
    out = splash_attention(q, k, v, mask)
    assert (out.double() - reference(q, k, v, mask)).abs().max().item() <= FP32_TOL


@pytest.mark.parametrize(
    "options,name",
    [
        (dict(block_q=100), "block_q"),
        (dict(block_kv=0), "block_kv"),
        (dict(block_kv=512, block_kv_compute=384), "block_kv_compute"),
        (dict(block_kv=256, block_kv_compute=512), "block_kv_compute"),
        (dict(compute_dtype="float16"), "compute_dtype"),
    ],
)
def test_bad_options_raise(options, name):
    q = jnp.zeros((1, 1, 130, 16), jnp.float32)
    mask = jnp.ones((1, 130), bool)
    with pytest.raises(ValueError, match=name) as info:
        splash_attention_jax(q, q, q, mask, **options)
    assert isinstance(info.value, HyvInputError) and info.value.argument == name


def test_bad_inputs_raise():
    q = jnp.zeros((1, 1, 130, 16), jnp.float32)
    with pytest.raises(HyvInputError, match="kv_mask"):
        splash_attention_jax(q, q, q, jnp.ones((1, 130), jnp.float32))  # additive/float masks are ambiguous
    with pytest.raises(HyvInputError, match="kv_mask"):
        splash_attention_jax(q, q, q, jnp.ones((1, 129), bool))
    with pytest.raises(HyvInputError, match="^k:"):
        splash_attention_jax(q, q[:, :, :64], q, jnp.ones((1, 130), bool))
    with pytest.raises(HyvInputError, match="block_size"):
        splash_attention(torch.zeros(1, 1, 8, 16), torch.zeros(1, 1, 8, 16), torch.zeros(1, 1, 8, 16), block_size=128)


def test_jit_compiles_once_for_different_masks():
    traces = []

    def traced(q, k, v, kv_mask):
        traces.append(1)  # runs only while tracing
        return splash_attention_jax(q, k, v, kv_mask, **SMALL)

    fn = jax.jit(traced)
    gen = torch.Generator().manual_seed(11)
    q, k, v = qkv(2, 1, 150, 16, torch.float32, gen)
    for kind in ("prefix", "scattered", "all"):
        mask = make_mask(kind, 2, 150, gen)
        out = fn(*(t.numpy() for t in (q, k, v, mask)))
        err = np.abs(np.asarray(out, np.float64) - reference(q, k, v, mask).numpy()).max()
        assert err <= FP32_TOL
    assert len(traces) == 1
    # The documented pattern (static options through functools.partial) jits as well.
    part = jax.jit(functools.partial(splash_attention_jax, **SMALL, interpret=True))
    part(*(t.numpy() for t in (q, k, v, mask)))
    part(*(t.numpy() for t in (q, k, v, ~mask)))
    assert part._cache_size() == 1


def test_torch_wrapper_roundtrip():
    gen = torch.Generator().manual_seed(13)
    q, k, v = qkv(1, 2, 140, 16, torch.bfloat16, gen)
    mask = torch.ones(1, 140, dtype=torch.bool)
    out = splash_attention(q, k, v, None, **SMALL)  # None = all valid
    assert out.dtype == torch.bfloat16 and out.device == q.device
    # bf16 crosses to JAX bit-exactly: the torch path equals the JAX path on the same bits.
    to_jax = lambda t: jnp.asarray(t.float().numpy()).astype(jnp.bfloat16)  # noqa: E731
    direct = splash_attention_jax(to_jax(q), to_jax(k), to_jax(v), jnp.asarray(mask.numpy()), **SMALL)
    assert torch.equal(out.float(), torch.from_numpy(np.array(direct.astype(jnp.float32))))
    half = splash_attention(q.half(), k.half(), v.half(), mask, **SMALL)
    assert half.dtype == torch.float16

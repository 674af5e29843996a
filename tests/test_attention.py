"""Masked attention backends against float64, the processor against diffusers' oracle, and no S x S tensors."""

import copy
import functools
import math
import sys
import types

import pytest
import torch
import torch.nn.functional as F
from tiny_inputs import forward_kwargs

from hyv_lib.base.memory import LargestTensor
from hyv_lib.models.families import get_preset
from hyv_lib.kernels import dispatch
from hyv_lib.kernels.dispatch import BACKENDS, attention, available_backends, resolve_backend
from hyv_lib.kernels.torch_kernels import (
    flash_attention,
    pad,
    reference_attention,
    torch_varlen_attention,
    unpad,
    varlen_inputs,
)
from hyv_lib.models.components import build_tiny_components
from hyv_lib.models.hunyuan_video15.processors import use_attention

TINY = get_preset("tiny")
TOL = {torch.float32: 2e-5}  # max abs error vs float64, inputs ~N(0, 1)


def bf16_tolerance(expected: torch.Tensor) -> float:
    """One bf16 ulp of the largest output: the output's own rounding is half of that (measured: at most 0.6 ulp on
    every backend and case here; a bf16 softmax or bf16 accumulation errs by several ulps)."""
    return torch.finfo(torch.bfloat16).eps * 2.0 ** math.floor(math.log2(expected.abs().max().item()))


def float64_attention(q, k, v, kv_mask):
    """Independent oracle: per batch element, softmax over valid keys only; invalid rows zero."""
    out = torch.zeros(q.shape, dtype=torch.float64)
    for b in range(q.shape[0]):
        idx = kv_mask[b].nonzero(as_tuple=True)[0]
        if len(idx) == 0:
            continue
        qb, kb, vb = (x[b][:, idx].double() for x in (q, k, v))
        w = torch.softmax(qb @ kb.transpose(-1, -2) / q.shape[-1] ** 0.5, dim=-1)
        out[b][:, idx] = w @ vb
    return out


def random_case(seed, b, h, s, d, lengths=None, scattered=False, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(b, h, s, d, generator=g).to(dtype) for _ in range(3))
    if scattered:
        mask = torch.rand(b, s, generator=g) < 0.6
    else:
        lengths = lengths or torch.randint(0, s + 1, (b,), generator=g).tolist()
        mask = torch.arange(s)[None, :] < torch.tensor(lengths)[:, None]
    return q, k, v, mask


CASES = [  # (b, h, s, d, lengths, scattered)
    (2, 2, 37, 16, [0, 37], False),  # no valid token in one element, all valid in the other
    (3, 1, 130, 32, None, False),  # random prefix lengths, S not a block multiple
    (2, 2, 64, 8, None, True),  # a scattered (non-prefix) mask
    (1, 4, 200, 64, [129], False),
]


@pytest.mark.parametrize("backend", ["reference", "sdpa", "xla", "host_sdpa"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_backends_match_float64(backend, dtype, case):
    reason = available_backends().get(backend)
    if reason is not None:  # host_sdpa needs JAX on the CPU (a TPU VM's JAX is on the TPU)
        pytest.skip(reason)
    b, h, s, d, lengths, scattered = CASES[case]
    q, k, v, mask = random_case(case, b, h, s, d, lengths, scattered, dtype)
    out = attention(q, k, v, mask, backend=backend)
    assert out.dtype == dtype and out.shape == q.shape
    assert torch.isfinite(out).all()
    expected = float64_attention(q, k, v, mask)
    tolerance = TOL[dtype] if dtype == torch.float32 else bf16_tolerance(expected)
    assert (out.double() - expected).abs().max() <= tolerance
    assert (out[~mask[:, None, :].expand(b, h, s)] == 0).all()  # invalid rows exactly zero


def test_splash_through_the_common_api():
    pytest.importorskip("jax")
    q, k, v, mask = random_case(5, 2, 2, 150, 16, [0, 97])
    out = attention(q, k, v, mask, backend="splash", block_q=128, block_kv=128, block_kv_compute=128)
    assert (out.double() - float64_attention(q, k, v, mask)).abs().max() <= TOL[torch.float32]


def test_kv_zeroing_is_not_exact():
    q, k, v, mask = random_case(1, 1, 2, 64, 16, [20])
    exact = float64_attention(q, k, v, mask)
    approx = attention(q, k, v, mask, backend="kv_zeroing").double()
    assert (approx - exact)[:, :, :20].abs().max() > 1e-2  # padded keys dilute every valid row


def test_default_mask_means_all_valid_and_bad_shapes_are_rejected():
    q, k, v, _ = random_case(2, 1, 2, 10, 8)
    torch.testing.assert_close(attention(q, k, v), F.scaled_dot_product_attention(q, k, v))
    with pytest.raises(ValueError, match="kv_mask"):
        attention(q, k, v, torch.ones(1, 9, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"\[B, H, S, D\]"):
        attention(q[0], k[0], v[0])
    with pytest.raises(TypeError, match="options"):
        attention(q, k, v, backend="sdpa", block_q=128)


def test_unknown_and_unavailable_backends_say_why():
    with pytest.raises(ValueError, match="one of"):
        attention(*random_case(0, 1, 1, 4, 4)[:3], backend="xformers")
    reasons = available_backends()
    assert reasons["reference"] is None and reasons["sdpa"] is None
    for name in ("flash", "flash3", "sage"):
        if reasons[name] is not None:
            with pytest.raises(RuntimeError, match=name):
                attention(*random_case(0, 1, 1, 4, 4)[:3], backend=name)
            assert "install" in reasons[name] or "GPU" in reasons[name]


def test_varlen_inputs_from_the_mask():
    mask = torch.tensor([[1, 1, 1, 0, 0], [0, 0, 0, 0, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)
    indices, cu_seqlens, max_len = varlen_inputs(mask)
    assert cu_seqlens.dtype == torch.int32 and cu_seqlens.tolist() == [0, 3, 3, 8]
    assert indices.tolist() == [0, 1, 2, 10, 11, 12, 13, 14] and max_len == 5
    x = torch.randn(3, 2, 5, 4)
    packed = unpad(x, indices)
    assert packed.shape == (8, 2, 4)
    restored = pad(packed, indices, x.shape)
    torch.testing.assert_close(restored, x * mask[:, None, :, None])


@pytest.fixture()
def fake_flash_attn(monkeypatch):
    """A CPU stand-in for flash_attn.flash_attn_varlen_func: SDPA per packed sequence. It lets the
    unpad -> varlen -> pad path run here; the real kernel is tested on GPUs below."""

    def flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, softmax_scale=None):
        assert cu_q.dtype == torch.int32 and torch.equal(cu_q, cu_k) and q.ndim == 3
        out = torch.empty_like(q)
        for start, end in zip(cu_q[:-1].tolist(), cu_q[1:].tolist()):
            if end > start:
                seg = [x[start:end].transpose(0, 1)[None] for x in (q, k, v)]
                out[start:end] = F.scaled_dot_product_attention(*seg, scale=softmax_scale)[0].transpose(0, 1)
        return out

    monkeypatch.setitem(sys.modules, "flash_attn", types.SimpleNamespace(flash_attn_varlen_func=flash_attn_varlen_func))


def test_flash_path_packing_on_cpu(fake_flash_attn):
    q, k, v, mask = random_case(3, 3, 2, 50, 16, [0, 50, 17])
    out = flash_attention(q, k, v, mask)
    assert (out.double() - float64_attention(q, k, v, mask)).abs().max() <= TOL[torch.float32]


def varlen_attn_stand_in(q, k, v, cu_seq_q, cu_seq_k, max_q, max_k, *, seqused_k=None, calls=None):
    """A CPU stand-in with torch.nn.attention.varlen.varlen_attn's contract (torch 2.12): sequence i's queries are
    rows cu_seq_q[i]:cu_seq_q[i+1]; its keys start at cu_seq_k[i] and number seqused_k[i] (else run to
    cu_seq_k[i+1]). Plain float64 softmax per sequence; ``calls`` records what each call was given."""
    assert q.ndim == k.ndim == 3 and cu_seq_q.dtype == cu_seq_k.dtype == torch.int32
    if calls is not None:
        calls.append(dict(rows=q.shape[0], seqused_k=None if seqused_k is None else seqused_k.tolist()))
    out = torch.zeros_like(q)
    for i in range(len(cu_seq_q) - 1):
        q0, q1, k0 = int(cu_seq_q[i]), int(cu_seq_q[i + 1]), int(cu_seq_k[i])
        k1 = k0 + int(seqused_k[i]) if seqused_k is not None else int(cu_seq_k[i + 1])
        assert q1 - q0 <= max_q and k1 - k0 <= max_k
        if q1 > q0 and k1 > k0:
            w = torch.softmax(q[q0:q1].double().transpose(0, 1) @ k[k0:k1].double().permute(1, 2, 0)
                              / q.shape[-1] ** 0.5, dim=-1)
            out[q0:q1] = (w @ v[k0:k1].double().transpose(0, 1)).transpose(0, 1).to(q.dtype)
    return out


def packed_only_stand_in(q, k, v, cu_seq_q, cu_seq_k, max_q, max_k, *, calls=None):
    """torch 2.10/2.11's varlen_attn: no ``seqused_k`` keyword, so hyv_lib packs the valid tokens."""
    return varlen_attn_stand_in(q, k, v, cu_seq_q, cu_seq_k, max_q, max_k, calls=calls)


@pytest.mark.parametrize("stand_in", [varlen_attn_stand_in, packed_only_stand_in])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_torch_varlen_layouts_on_cpu(stand_in, case):
    """torch_varlen's two layouts against the float64 oracle: with seqused_k (torch >= 2.12) a valid-first mask is
    not packed (B*S rows, one count per sample); without it, or for a scattered mask, the valid tokens are packed."""
    b, h, s, d, lengths, scattered = CASES[case]
    q, k, v, mask = random_case(case, b, h, s, d, lengths, scattered)
    calls = []
    out = torch_varlen_attention(q, k, v, mask, kernel=functools.partial(stand_in, calls=calls))
    assert (out.double() - float64_attention(q, k, v, mask)).abs().max() <= TOL[torch.float32]
    if not mask.any():
        assert calls == []
    elif stand_in is varlen_attn_stand_in and not scattered:
        assert calls == [dict(rows=b * s, seqused_k=mask.sum(1).tolist())]
    else:
        assert calls == [dict(rows=int(mask.sum()), seqused_k=None)]


def test_sage_gets_a_copy_of_k_and_a_broken_gpu_build_is_unavailable(monkeypatch, tmp_path):
    """SageAttention smooths K; a build doing it in place must not change the caller's k (a fake sageattn that
    does ``k -= km``). And a flash-attn that is installed but fails to import (built for another torch) is reported
    unavailable with the import error, not picked and failing at the first attention call."""
    from hyv_lib.kernels import registry
    from hyv_lib.kernels.torch_kernels import sage_attention

    def sageattn(q, k, v, tensor_layout="HND", is_causal=False):
        k -= k.mean(dim=2, keepdim=True)
        return F.scaled_dot_product_attention(q, k, v)

    monkeypatch.setitem(sys.modules, "sageattention", types.SimpleNamespace(sageattn=sageattn))
    q, k, v, mask = random_case(5, 2, 2, 40, 16, [40, 23])
    before = k.clone()
    out = sage_attention(q, k, v, mask)
    assert torch.equal(k, before)
    assert (out.double() - float64_attention(q, k, v, mask)).abs().max() <= TOL[torch.float32]  # smoothing is exact

    (tmp_path / "flash_attn").mkdir()
    (tmp_path / "flash_attn" / "__init__.py").write_text(
        "raise ImportError('flash_attn_2_cuda.so: undefined symbol: _ZN3c104cuda9SetDeviceEi')")
    monkeypatch.syspath_prepend(str(tmp_path))
    registry.import_failure.cache_clear()
    try:
        reason = BACKENDS["flash"].unavailable()
    finally:
        registry.import_failure.cache_clear()
        sys.modules.pop("flash_attn", None)
    assert "installed but does not import" in reason and "undefined symbol" in reason


def test_torch_varlen_signature_detection_sees_real_varlen_attn():
    """The seqused_k path is chosen by reading the kernel's signature: torch 2.12's varlen_attn has the keyword."""
    import inspect

    from hyv_lib.kernels.torch_kernels import torch_varlen_kernel

    assert "seqused_k" in inspect.signature(torch_varlen_kernel()).parameters


# auto's CUDA order by GPU generation: tests/test_gpu_path.py


@pytest.mark.parametrize("backend", ["flash", "flash3", "torch_varlen", "sage"])
def test_gpu_backends(backend):
    reason = available_backends()[backend]
    if reason is not None:
        pytest.skip(reason)
    q, k, v, mask = (x.cuda() for x in random_case(4, 2, 2, 300, 128, [300, 123], dtype=torch.bfloat16))
    out = attention(q, k, v, mask, backend=backend)
    expected = float64_attention(q.cpu(), k.cpu(), v.cpu(), mask.cpu())
    tol = 0.1 if backend == "sage" else bf16_tolerance(expected)  # SageAttention quantises QK^T to int8
    assert (out.double().cpu() - expected).abs().max() <= tol  # untested here: no GPU


# ------------------------------------------------------------------------------------------ on the model
def model_inputs(text_lengths=(14, 40), byt5_lengths=(0, 9), seed=0, latent_hw=(6, 10)):
    return forward_kwargs(seed=seed, text_lengths=text_lengths, byt5_lengths=byt5_lengths, latent=(3, *latent_hw))


@pytest.fixture(scope="module")
def tiny_transformer():
    return build_tiny_components(TINY, names=["transformer"])["transformer"]


def runnable_backends():
    """The exact dense backends that run here (not the lossy ones, nor SSTA's, whose sparse attention is another
    function: tests/test_ssta.py checks them against their own reference)."""
    return [n for n, why in available_backends().items() if why is None and n not in ("kv_zeroing", "sage")
            and "grid" not in BACKENDS[n].options]


@pytest.mark.parametrize("backend", runnable_backends())
def test_model_with_our_processor_equals_the_oracle(tiny_transformer, backend):
    kwargs = model_inputs()
    with torch.no_grad():
        oracle = tiny_transformer(**kwargs).sample
        model = copy.deepcopy(tiny_transformer)
        assert use_attention(model, backend) == TINY.transformer["num_layers"] + TINY.transformer["num_refiner_layers"]
        ours = model(**kwargs).sample
    assert (ours - oracle).abs().max() <= 1e-5


@pytest.mark.parametrize("lengths", [dict(text_lengths=(0, 0), byt5_lengths=(0, 0)),  # all padding
                                     dict(text_lengths=(1, 128), byt5_lengths=(32, 0)),  # extremes
                                     dict(text_lengths=(14, 14), byt5_lengths=(0, 0))])  # empty prompt
def test_edge_masks_give_no_nan(tiny_transformer, lengths):
    model = copy.deepcopy(tiny_transformer)
    use_attention(model, "sdpa")
    with torch.no_grad():
        assert torch.isfinite(model(**model_inputs(**lengths)).sample).all()


def test_processor_never_builds_an_s_by_s_tensor(tiny_transformer):
    # Long enough that S^2 dwarfs every activation (the ByT5 projection is 2048 wide even in tiny).
    kwargs = model_inputs(latent_hw=(12, 20))
    s = 3 * 12 * 20 + TINY.image_tokens + TINY.byt5_len + TINY.text_len  # joint sequence length
    model = copy.deepcopy(tiny_transformer)
    with torch.no_grad(), LargestTensor() as diffusers_run:
        model(**kwargs)
    use_attention(model, "sdpa")
    with torch.no_grad(), LargestTensor() as our_run:
        model(**kwargs)
    assert diffusers_run.elements >= 2 * s * s  # its [B, 1, S, S] mask
    assert our_run.elements < s * s


def test_default_torch_runtime_and_deepcache_over_it_build_no_s_by_s_tensor(tiny_transformer):
    """The torch runtime's default step (and DeepCache's full and cached steps over it) attend exactly without a
    [B, 1, S, S] mask, and still equal diffusers' own forward; ``attention="diffusers"`` keeps the stock processor,
    which does build it (so the probe can fail)."""
    from hyv_lib.runtimes.deepcache import DeepCacheSchedule
    from hyv_lib.runtimes.step import make_step

    kwargs = model_inputs(latent_hw=(12, 20))
    s = 3 * 12 * 20 + TINY.image_tokens + TINY.byt5_len + TINY.text_len
    with torch.no_grad():
        oracle = tiny_transformer(**kwargs).sample
    stock = make_step(copy.deepcopy(tiny_transformer), "torch", attention="diffusers")
    with torch.no_grad(), LargestTensor() as stock_run:
        stock(**kwargs)
    assert stock_run.elements >= 2 * s * s
    steps = {"torch": make_step(copy.deepcopy(tiny_transformer), "torch"),
             "deepcache": make_step(copy.deepcopy(tiny_transformer), "torch", cache=DeepCacheSchedule(3, 1, 3, 2))}
    for name, step in steps.items():
        for call in range(3 if name == "deepcache" else 1):  # full, cached, full
            with torch.no_grad(), LargestTensor() as run:
                out = step(**kwargs)
            assert run.elements < s * s, (name, call)
            if call != 1:
                assert (out - oracle).abs().max() <= 1e-5, (name, call)
    assert steps["deepcache"].cached_calls == 1


@pytest.mark.parametrize("block_kv", [5, 16, 48, 1000, None])
def test_xla_blockwise_online_softmax_across_blocks(block_kv):
    """Several KV blocks (S not a multiple of the block; 5 rounds up to 8, 1000 is one block), an empty element
    and a scattered mask."""
    for case in range(len(CASES)):
        b, h, s, d, lengths, scattered = CASES[case]
        q, k, v, mask = random_case(10 + case, b, h, s, d, lengths, scattered)
        out = attention(q, k, v, mask, backend="xla", block_kv=block_kv)
        assert (out.double() - float64_attention(q, k, v, mask)).abs().max() <= TOL[torch.float32]


def test_a_float_mask_is_an_error_not_an_inverted_mask():
    """An additive mask ([0, 0, -inf, -inf]) cast to bool would read True where the keys are padding."""
    from hyv_lib.base.errors import HyvInputError

    q, k, v, mask = random_case(5, 1, 2, 4, 8, [2])
    additive = torch.where(mask, 0.0, float("-inf"))
    with pytest.raises(HyvInputError) as err:
        attention(q, k, v, additive)
    assert err.value.argument == "kv_mask" and "mask == 0" in str(err.value)
    torch.testing.assert_close(attention(q, k, v, additive == 0), attention(q, k, v, mask))


def test_cuda_kernels_say_which_tensors_they_take(monkeypatch):
    """flash and Sage take fp16 / bf16 CUDA tensors: asked for CPU or fp32 tensors, backend resolution says so
    (even where the package is installed); auto does not pick them for fp32."""
    monkeypatch.setattr(dispatch, "available_backends", lambda: {**{n: None for n in BACKENDS}})
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))  # a Hopper GPU
    with pytest.raises(ValueError, match="fp16 or bf16 CUDA tensors, got float32 tensors on cpu"):
        resolve_backend("flash", torch.device("cpu"), torch.float32)
    with pytest.raises(ValueError, match="got float32 tensors on cuda"):
        resolve_backend("sage", torch.device("cuda"), torch.float32)
    assert resolve_backend("flash", torch.device("cuda"), torch.bfloat16) == "flash"
    assert resolve_backend("auto", torch.device("cuda"), torch.float32) == "sdpa"
    assert resolve_backend("auto", torch.device("cuda"), torch.float16) == "sdpa"  # Hopper: SDPA (cuDNN) first
    monkeypatch.setattr(dispatch, "available_backends", lambda: {**{n: None for n in BACKENDS}, "sdpa": "absent"})
    with pytest.raises(RuntimeError, match="no exact attention backend for float32 tensors on cuda runs here "
                                           r"\(sdpa: absent; flash3: takes fp16 or bf16 CUDA tensors"):
        resolve_backend("auto", torch.device("cuda"), torch.float32)


def test_options_go_only_to_backends_that_take_them():
    q, k, v, mask = random_case(3, 1, 2, 40, 16, [25])
    with pytest.raises(TypeError, match="'host_sdpa' takes no options"):
        attention(q, k, v, mask, backend="host_sdpa", block_kv=8)
    with pytest.raises(TypeError, match="'sdpa' takes no options"):
        attention(q, k, v, mask, backend="sdpa", block_kv=8)
    assert available_backends()["host_sdpa"] is None  # JAX runs on this machine's CPU


def test_the_oracle_zeroes_keyless_samples_but_passes_nan_inputs_through():
    """Hand-worked: a sample with no valid key gives zeros; a NaN in one valid query row gives NaN in that row only
    (zeroing every NaN would hide a numerical blow-up in whatever the oracle checks)."""
    q, k, v = torch.randn(3, 2, 1, 4, 8, dtype=torch.float64)
    mask = torch.tensor([[True, True, True, False], [False] * 4])
    q[0, 0, 1, 0] = float("nan")
    out = reference_attention(q, k, v, mask)
    assert torch.equal(out[1], torch.zeros_like(out[1]))
    assert out[0, 0, 1].isnan().all() and out[0, 0, [0, 2, 3]].isfinite().all()


def test_one_decorated_function_adds_a_backend():
    """The registry: a kernel and its requirements in one decorator; available_backends, the errors and attention()
    all come from it."""
    from hyv_lib.kernels.registry import BACKENDS as REGISTRY
    from hyv_lib.kernels.registry import register_backend

    calls = []

    @register_backend("toy_scaled", devices=("cpu",), dtypes=(torch.float32,), options=("scale",))
    def toy(q, k, v, kv_mask, scale=1.0):
        calls.append(scale)
        return reference_attention(q, k, v, kv_mask) * scale

    register_backend("toy_missing", devices=("cpu",), packages=("no_such_package_xyz",), install="pip install xyz")(toy)
    register_backend("toy_new_torch", devices=("cpu",), min_torch=(99, 0))(toy)
    register_backend("toy_gpu", devices=("cuda",), dtypes=(torch.float16,))(toy)
    try:
        q, k, v, mask = random_case(6, 2, 2, 12, 8, [12, 7])
        assert torch.equal(attention(q, k, v, mask, backend="toy_scaled", scale=2.0),
                           2.0 * reference_attention(q, k, v, mask)) and calls == [2.0]
        reasons = available_backends()
        assert reasons["toy_scaled"] is None
        assert reasons["toy_missing"] == "package 'no_such_package_xyz' is not installed (pip install xyz)"
        assert reasons["toy_new_torch"].startswith("needs torch >= 99.0")
        with pytest.raises(RuntimeError, match="toy_missing"):
            attention(q, k, v, mask, backend="toy_missing")
        with pytest.raises(ValueError, match="'toy_scaled' takes fp32 cpu tensors, got float64 tensors on cpu"):
            attention(q.double(), k.double(), v.double(), mask, backend="toy_scaled")
        with pytest.raises(TypeError, match="takes the options scale"):
            attention(q, k, v, mask, backend="toy_scaled", block_kv=8)
        if not torch.cuda.is_available():
            assert "NVIDIA GPU" in reasons["toy_gpu"]
    finally:
        for name in ("toy_scaled", "toy_missing", "toy_new_torch", "toy_gpu"):
            REGISTRY.pop(name)
    assert "toy_scaled" not in available_backends()

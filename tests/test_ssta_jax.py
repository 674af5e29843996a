"""SSTA on JAX (hyv_lib.kernels.ssta_jax): the tile mask equals torch's, the block-sparse Pallas kernel (interpret mode)
equals the fp32 reference, and the torchax runtime with --attention ssta equals the torch model with the reference."""

import copy
import math
import os
import textwrap

import numpy as np
import pytest
import torch

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

from hyv_lib.kernels import ssta, ssta_jax  # noqa: E402
from hyv_lib.kernels.ssta import SstaConfig  # noqa: E402
from hyv_lib.kernels.ssta_torch import ssta_reference  # noqa: E402

# Odd grids (every axis padded somewhere), per-sample valid text, and the official's per-grid rules: topk halved at
# <= 31 frames (3, 5, 4) but not at 33, a one-frame grid's flat image tile and 1x1x1 window, windows wider than the
# tile grid (centre clamped), every sparse type and sampling, both paddings, shared heads, no text at all.
MASK_CASES = [
    ((3, 5, 7), 21, SstaConfig(tile=(2, 2, 2), window=(3, 3, 3), topk=4)),
    ((5, 6, 9), 40, SstaConfig(tile=(2, 4, 4), window=(1, 3, 3), topk=3, sparse_type="block_attn", pad="repeat",
                               lambda_=0.3)),
    ((1, 9, 10), 13, SstaConfig(tile=(2, 2, 4), topk=3)),
    ((33, 3, 4), 0, SstaConfig(tile=(4, 2, 2), topk=5, sampling="similarity", share_heads=True)),
    ((3, 5, 7), 21, SstaConfig(tile=(2, 2, 2), window=(1, 3, 5), sparse_type="sta")),
    ((4, 7, 5), 30, SstaConfig(tile=(2, 2, 2), topk=8, sampling="similarity", threshold=0.6, pad="repeat")),
    ((4, 7, 5), 30, SstaConfig(tile=(2, 2, 2), topk=1, sampling="similarity", threshold=0.6)),  # k halved to 0
]


def inputs(grid, text, seed, heads=3, dim=16, scale=1.0, batch=2):
    g = torch.Generator().manual_seed(seed)
    s = math.prod(grid) + text
    return [torch.randn(batch, heads, s, dim, generator=g) * scale for _ in range(3)]


def text_mask(grid, text, batch=2):
    """[B, S] key mask: all video valid, sample 0 with a third of its text (none without text), the rest whole."""
    video = math.prod(grid)
    mask = torch.ones(batch, video + text, dtype=torch.bool)
    mask[0, video + text // 3:] = False
    return mask


def jax_mask(q, k, grid, text, text_valid, config):
    fn = jax.jit(ssta_jax.ssta_mask, static_argnames=("grid", "text_len", "config"))
    dtype = jnp.bfloat16 if q.dtype == torch.bfloat16 else jnp.float32

    def to_jax(t):
        return jnp.asarray(t.float().numpy()).astype(dtype)

    return np.asarray(fn(to_jax(q), to_jax(k), grid=grid, text_len=text, text_valid=jnp.asarray(text_valid.numpy()),
                         config=config))


@pytest.mark.parametrize("pad", ["zero", "repeat"])
def test_the_tile_layout_is_torchs(pad):
    layout = ssta.TileLayout((3, 5, 7), (2, 2, 4), 13)
    x = torch.randn(2, 3, 105 + 13, 8)
    tiled = np.asarray(ssta_jax.to_tiles(jnp.asarray(x.numpy()), layout, pad))
    assert np.array_equal(tiled, ssta.to_tiles(x, layout, pad).numpy())
    assert np.array_equal(np.asarray(ssta_jax.from_tiles(jnp.asarray(tiled), layout)), x.numpy())


@pytest.mark.parametrize("grid, text, config", MASK_CASES)
def test_the_mask_equals_torchs_on_random_inputs(grid, text, config):
    # the threshold's softmax(gate / 0.01) at unit scale puts most tiles at 0 or subnormal probabilities (XLA's CPU
    # flushes subnormals, torch keeps them), whose order then decides the 8-tile minimum: inputs of a smaller scale
    scale = 0.05 if config.threshold else 1.0
    for seed, dtype in ((0, torch.float32), (1, torch.bfloat16)):
        q, k, _ = (x.to(dtype) for x in inputs(grid, text, seed, scale=scale))
        valid = text_mask(grid, text)[:, math.prod(grid):].sum(1)
        expected = ssta.ssta_mask(q.float(), k.float(), grid, text, valid, config)
        assert np.array_equal(jax_mask(q, k, grid, text, valid, config), expected.numpy()), (seed, dtype)
        # the kernel's static bound on a video tile's list holds
        layout = ssta.TileLayout(grid, config.for_grid(grid).tile, text)
        widest = int(expected[:, :, : layout.video_tiles].sum(-1).max())
        assert widest <= ssta_jax.row_width(layout, config.for_grid(grid))


def test_exact_ties_go_to_the_lowest_tile_index():
    """Inputs in {-1, 0, 1} and tiles of 8 cells: block means and similarity gates are exact in any summation order,
    so many gates tie exactly, on both sides, also at the top-k boundary."""
    grid, text, config = (3, 5, 7), 16, SstaConfig(tile=(2, 2, 2), topk=6, sampling="similarity")
    g = torch.Generator().manual_seed(0)
    q, k = (torch.randint(-1, 2, (2, 3, math.prod(grid) + text, 16), generator=g).float() for _ in range(2))
    layout = ssta.TileLayout(grid, config.tile, text)
    q_means, k_means = (ssta.block_means(ssta.to_tiles(x, layout), layout) for x in (q, k))
    gates = (q_means @ k_means.transpose(-1, -2)).sort(dim=-1, descending=True).values
    k_eff = config.for_grid(grid).topk
    assert (gates[..., k_eff - 1] == gates[..., k_eff]).sum() > 10  # ties at the boundary decide the choice
    valid = torch.tensor([5, text])
    expected = ssta.ssta_mask(q, k, grid, text, valid, config)
    assert np.array_equal(jax_mask(q, k, grid, text, valid, config), expected.numpy())


def test_nan_scores_rank_first_as_in_torch():
    """An all-zero tile has no direction (0/0 in the cosine): its importance is NaN, which torch's topk ranks above
    every number; a query tile of zeros ranks every key tile NaN and takes the first ones."""
    grid, text, config = (4, 6, 6), 8, SstaConfig(tile=(2, 2, 2), topk=5)
    q, k, _ = inputs(grid, text, seed=3)
    cells = np.arange(math.prod(grid)).reshape(grid)
    for x, (t, h, w) in ((q, (0, 0, 0)), (k, (2, 2, 4)), (k, (0, 4, 2))):
        x[:, :, cells[t:t + 2, h:h + 2, w:w + 2].ravel()] = 0
    valid = torch.tensor([text, 1])
    expected = ssta.ssta_mask(q, k, grid, text, valid, config)
    assert np.array_equal(jax_mask(q, k, grid, text, valid, config), expected.numpy())


def test_tile_lists_hold_each_rows_attended_tiles_in_order():
    mask = np.random.default_rng(0).random((2, 3, 7, 11)) < 0.3
    mask[..., 4] = True
    indices, counts = (np.asarray(a) for a in jax.jit(ssta_jax.kv_lists, static_argnums=1)(jnp.asarray(mask), 9))
    for row in np.ndindex(mask.shape[:-1]):
        attended = np.flatnonzero(mask[row])
        assert counts[row] == len(attended)
        assert list(indices[row][: len(attended)]) == list(attended[:9])
        assert set(indices[row][len(attended):]) <= {attended[-1]}  # repeated: nothing new to fetch


KERNEL_CASES = [  # (grid, text, config, dtype, tolerance): the errors measured were 3e-7, 1.4e-6 and 4.2e-3
    ((3, 5, 7), 21, SstaConfig(tile=(2, 2, 2), window=(3, 3, 3), topk=4), torch.float32, 2e-6),
    ((5, 6, 9), 40, SstaConfig(tile=(2, 4, 4), window=(1, 3, 3), topk=3, sparse_type="block_attn", pad="repeat"),
     torch.float32, 5e-6),
    ((3, 5, 7), 21, SstaConfig(tile=(2, 2, 2), window=(3, 3, 3), topk=4, share_heads=True), torch.bfloat16, 1.5e-2),
]


@pytest.mark.parametrize("grid, text, config, dtype, tolerance", KERNEL_CASES)
def test_the_pallas_kernel_equals_the_fp32_reference(grid, text, config, dtype, tolerance):
    q, k, v = (x.to(dtype) for x in inputs(grid, text, seed=5))
    kv_mask = text_mask(grid, text)
    expected = ssta_reference(q.float(), k.float(), v.float(), kv_mask, grid=grid, ssta=config)
    fn = jax.jit(lambda *a: ssta_jax.ssta_jax_kernel(*a, grid=grid, ssta=config))
    jax_dtype = jnp.bfloat16 if dtype == torch.bfloat16 else jnp.float32
    out = fn(*(jnp.asarray(x.float().numpy()).astype(jax_dtype) for x in (q, k, v)), jnp.asarray(kv_mask.numpy()))
    assert out.dtype == jax_dtype and out.shape == q.shape
    assert np.abs(np.asarray(out.astype(jnp.float32)) - expected.numpy()).max() <= tolerance


def test_calls_split_to_fit_smem_give_the_same_numbers():
    """A TPU holds one call's prefetched tile lists in SMEM (1 MiB on v6e): larger lists go in several calls, by heads
    and then samples (here a budget of one head's lists; 3 samples x 3 heads would take 2 heads x 2 samples each)."""
    layout, config = ssta.TileLayout((3, 5, 7), (2, 2, 2), 21), SstaConfig(tile=(2, 2, 2), topk=2)
    x = inputs((3, 5, 7), 21, seed=6, batch=1, heads=2)
    q, k, v = (jnp.asarray(ssta.to_tiles(t, layout).numpy()) for t in x)
    mask = jax.jit(ssta_jax.tile_mask, static_argnums=(2, 4))(jnp.asarray(x[0].numpy()), jnp.asarray(x[1].numpy()),
                                                               layout, None, config)
    indices, counts = jax.jit(ssta_jax.kv_lists, static_argnums=1)(mask[:, :, : layout.video_tiles],
                                                                    ssta_jax.row_width(layout, config))
    rows, width = indices.shape[2:]
    per_head = rows * (width + 1) * 4
    assert ssta_jax.chunks(3, 3, 3, rows, width, 2 * per_head) == [((0, 1), (0, 2)), ((0, 1), (2, 1)),
                                                                  ((1, 1), (0, 2)), ((1, 1), (2, 1)),
                                                                  ((2, 1), (0, 2)), ((2, 1), (2, 1))]
    assert ssta_jax.chunks(3, 3, 1, rows, width, 2 * per_head) == [((0, 2), (0, 3)), ((2, 1), (0, 3))]
    budget = per_head
    rows_fn = jax.jit(ssta_jax.sparse_rows, static_argnames=("tile_tokens", "interpret", "budget"))
    whole = rows_fn(q, k, v, indices, counts, tile_tokens=8, interpret=True)
    split = rows_fn(q, k, v, indices, counts, tile_tokens=8, interpret=True, budget=budget)
    assert np.array_equal(np.asarray(whole), np.asarray(split))


def test_bad_options_raise_clear_errors():
    q = jnp.zeros((1, 2, 40, 8))
    with pytest.raises(ValueError, match="grid="):
        ssta_jax.ssta_jax_kernel(q, q, q, None, grid=None)
    with pytest.raises(TypeError, match="SstaConfig"):
        ssta_jax.ssta_jax_kernel(q, q, q, None, grid=(2, 4, 4), ssta={"topk": 4})
    with pytest.raises(ValueError, match="more than the sequence"):
        ssta_jax.ssta_jax_kernel(q, q, q, None, grid=(3, 4, 4))
    with pytest.raises(ValueError, match="SMEM"):
        ssta_jax.chunks(1, 1, 1, rows=4096, width=4096)


def test_the_tpu_runtime_takes_ssta():
    pytest.importorskip("torchax")
    from hyv_lib.kernels.registry import BACKENDS
    from hyv_lib.runtimes.step import check_attention

    assert BACKENDS["ssta"].jax_kernel is ssta_jax.ssta_jax_kernel
    check_attention("ssta", "jax")


@pytest.mark.slow  # ~12 s: the tiny model's jitted step with the kernel in interpret mode
def test_the_torchax_runtime_equals_the_torch_reference_model():
    pytest.importorskip("torchax")
    from tiny_inputs import TINY, forward_kwargs

    from hyv_lib.models.components import build_tiny_components
    from hyv_lib.models.hunyuan_video15.processors import use_attention
    from hyv_lib.runtimes.jax_step import JaxTransformer

    oracle = build_tiny_components(TINY, names=["transformer"])["transformer"]
    config = SstaConfig(tile=(2, 2, 2), window=(3, 3, 3), topk=4)
    reference = copy.deepcopy(oracle)
    use_attention(reference, "ssta_reference", ssta=config)
    tpu = JaxTransformer(copy.deepcopy(oracle), attention="ssta", attention_options={"ssta": config})
    for kwargs in (forward_kwargs(0, latent=(3, 5, 7)),
                   forward_kwargs(1, latent=(3, 5, 7), text_lengths=(128, 1), byt5_lengths=(32, 0))):
        with torch.no_grad():
            expected = reference(**kwargs).sample
            dense = oracle(**kwargs).sample
        out = tpu(**kwargs)
        assert (out - expected).abs().max() <= 3e-6  # measured 5.7e-7
        assert (dense - expected).abs().max() > 1e-3  # the sparse mask matters on this grid
    assert tpu.compilations == 1


SHARDED_PROBE = textwrap.dedent("""
    import os, copy, json
    os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    import torch
    from diffusers import HunyuanVideo15Transformer3DModel
    from hyv_lib.models.families import get_preset
    from hyv_lib.kernels.ssta import SstaConfig
    from hyv_lib.models.hunyuan_video15.components import example_forward_kwargs
    from hyv_lib.models.hunyuan_video15.processors import use_attention
    from hyv_lib.runtimes.jax_step import JaxTransformer
    tiny = get_preset("tiny")
    torch.manual_seed(0)
    model = HunyuanVideo15Transformer3DModel(**dict(tiny.transformer, num_attention_heads=8, attention_head_dim=16))
    model = model.eval().requires_grad_(False)
    # 4 x 4 x 6 = 96 video tokens: a sequence axis of 4 splits them evenly
    kwargs = example_forward_kwargs(tiny, seed=1, latent=(4, 4, 6), text_lengths=(14, 50), byt5_lengths=(0, 7))
    config = SstaConfig(tile=(2, 2, 2), window=(1, 3, 3), topk=4, share_heads=True)
    reference = copy.deepcopy(model)
    use_attention(reference, "ssta_reference", ssta=config)
    with torch.no_grad():
        expected = reference(**kwargs).sample
        dense = model(**kwargs).sample
    errors = {}
    for mesh in ("data=2,tensor=4", "tensor=2,sequence=4"):
        tpu = JaxTransformer(copy.deepcopy(model), mesh=mesh, attention="ssta", attention_options={"ssta": config})
        errors[mesh] = (tpu(**kwargs) - expected).abs().max().item()
    print(json.dumps({"errors": errors, "sparse_effect": (dense - expected).abs().max().item()}))
""")


@pytest.mark.slow  # its own process (8 emulated CPU devices need XLA_FLAGS before JAX starts), ~25 s
def test_sharded_on_eight_devices_with_one_mask_for_all_heads(run_probe):
    """Heads split 4 ways (data=2 x tensor=4) and 8 ways with the video tokens on a sequence axis (tensor=2 x
    sequence=4: attention gathers the whole sequence for its heads, so tiles stay whole): with ``share_heads`` every
    device averages the block means over all 8 heads (a pmean across the head shards), not its own (which measured
    5e-3 off)."""
    pytest.importorskip("torchax")
    result = run_probe("-c", SHARDED_PROBE)
    assert result["sparse_effect"] > 1e-3, result  # the sparse mask matters on this grid
    for mesh, error in result["errors"].items():
        assert error <= 3e-6, (mesh, result)  # measured 6.0e-7


@pytest.mark.slow  # ~10 s: the TPU compiler (libtpu, no TPU) on the real shape
def test_the_kernel_compiles_through_mosaic_at_720p_121_frames():
    """One sample of the 720p/121f step (16 heads x 128, grid 31 x 45 x 80, 1985 context tokens, the official 6x8x8
    tiles) with the heads on tensor=8 of a v6e-8: lowered natively (two Pallas calls: video rows, text rows), the
    tile lists within SMEM and the whole attention within a fraction of the chip's HBM (measured 0.40 GiB of
    temporaries per device)."""
    pytest.importorskip("libtpu", reason="the TPU compiler comes with libtpu (requirements.txt, Linux only)")
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from hyv_lib.parallel.jax_env import quiet_libtpu
    from hyv_lib.parallel.mesh import active_mesh
    from hyv_lib.parallel.sharding import per_shard
    from hyv_lib.planning.tpu_compile import topology_devices, topology_mesh

    grid, text, heads = (31, 45, 80), 1985, 16
    devices = topology_devices("v6e:2x4")
    with quiet_libtpu():
        mesh = topology_mesh({"tensor": 8}, devices, "v6e:2x4", heads)
        x = jax.ShapeDtypeStruct((1, heads, math.prod(grid) + text, 128), jnp.bfloat16,
                                 sharding=NamedSharding(mesh, P("data", "tensor")))
        mask = jax.ShapeDtypeStruct((1, x.shape[2]), jnp.bool_, sharding=NamedSharding(mesh, P("data")))
        with active_mesh(mesh):
            attend = per_shard(lambda *a: ssta_jax.ssta_jax_kernel(*a, grid=grid, ssta=SstaConfig()))
            compiled = jax.jit(attend).lower(x, x, x, mask).compile()
    assert compiled.as_text().count('custom_call_target="tpu_custom_call"') == 2
    assert compiled.memory_analysis().temp_size_in_bytes < 2**30

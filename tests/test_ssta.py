"""SSTA: the tile mask re-derived by hand on small grids (window clamping, top-k with ties to the lower index, halving at
<= 31 latent frames, image tiles, the text cut), the kernels against an independent float64 attention over the real
tokens with the padding's multiplicities, and the tiny model's forward with ``--attention ssta``."""

import copy
import math

import numpy as np
import pytest
import torch

import hyv_lib
from hyv_lib.kernels.dispatch import attention
from hyv_lib.kernels.ssta import SstaConfig, TileLayout, density, ssta_mask, window_mask
from hyv_lib.kernels.ssta_torch import ssta_reference
from hyv_lib.models.registry import adapter_for

from tiny_inputs import TINY, forward_kwargs


# ------------------------------------------------------------------------------------------ the mask by hand
def test_public_names():
    assert hyv_lib.SstaConfig is SstaConfig and hyv_lib.ssta_mask is ssta_mask
    config = SstaConfig()  # the official attn_param defaults
    assert (config.tile, config.window, config.topk, config.sampling, config.lambda_, config.threshold,
            config.share_heads, config.sparse_type, config.pad, config.dense_every) == (
        (6, 8, 8), (3, 3, 3), 64, "importance", 0.7, 0.0, False, "ssta", "zero", 0)


def test_window_centre_is_clamped_at_the_edges():
    # one row of 5 tiles, a 3-tile window: the centre is clip(i, 1, 3), so both edge tiles see the same 3 tiles
    rows = window_mask((1, 1, 5), (1, 1, 3)).int().tolist()
    assert rows == [[1, 1, 1, 0, 0], [1, 1, 1, 0, 0], [0, 1, 1, 1, 0], [0, 0, 1, 1, 1], [0, 0, 1, 1, 1]]
    # a grid narrower than the window: numpy's clip(i, 1, 0) is 0 for every i, and the window covers both tiles
    assert window_mask((1, 1, 2), (1, 1, 3)).all()
    # 3-D: a window of 3x3x3 on 4x4x4 tiles always holds 27 tiles (clamped, never cut)
    assert window_mask((4, 4, 4), (3, 3, 3)).sum(-1).tolist() == [27] * 64


def tiles_of(values: torch.Tensor, layout: TileLayout) -> torch.Tensor:
    """[B, H, N, D] per-tile vectors -> [B, H, S, D] raster-order tokens in which every token of a tile holds its
    tile's vector (tiles laid out in (t, h, w) order); the grid must be whole tiles."""
    (t, h, w), (tt, th, tw) = layout.grid, layout.tile
    b, heads, _, d = values.shape
    tile_index = torch.tensor([((ti // tt) * (h // th) + hi // th) * (w // tw) + wi // tw
                               for ti in range(t) for hi in range(h) for wi in range(w)])
    return values[:, :, tile_index]


def test_topk_by_importance_is_the_hand_formula_and_torch_topks_choice():
    # 2 x 1 x 8 latent cells in 2 x 1 x 2 tiles: 4 video tiles; one text tile. k = 4, halved (2 frames <= 31) to 2.
    grid, tile, text_len = (2, 1, 8), (2, 1, 2), 3
    layout = TileLayout(grid, tile, text_len)
    g = torch.Generator().manual_seed(0)
    q_tiles, k_tiles = torch.randn(1, 2, 4, 6, generator=g), torch.randn(1, 2, 4, 6, generator=g)
    q = torch.cat([tiles_of(q_tiles, layout), torch.randn(1, 2, text_len, 6, generator=g)], 2)
    k = torch.cat([tiles_of(k_tiles, layout), torch.randn(1, 2, text_len, 6, generator=g)], 2)
    config = SstaConfig(tile=tile, window=(1, 1, 1), topk=4, sparse_type="block_attn", lambda_=0.6)
    mask = ssta_mask(q, k, grid, text_len, config=config)
    # by hand (numpy, float64): cosine mapped to [0, 1]; redundancy = mean over the other key tiles
    for head in range(2):
        qn = q_tiles[0, head].double().numpy()
        kn = k_tiles[0, head].double().numpy()
        qn /= np.linalg.norm(qn, axis=-1, keepdims=True)
        kn /= np.linalg.norm(kn, axis=-1, keepdims=True)
        similarity = (qn @ kn.T + 1) / 2
        unique = (kn @ kn.T + 1) / 2
        redundancy = np.array([np.mean([unique[i, j] for i in range(4) if i != j]) for j in range(4)])
        scores = 0.6 * similarity - 0.4 * redundancy[None, :]
        chosen = torch.from_numpy(-scores).argsort(dim=-1, stable=True)[:, :2]
        expected = torch.zeros(5, 5, dtype=torch.bool)
        expected.scatter_(1, torch.cat([chosen, torch.zeros(1, 2, dtype=torch.long)]), True)
        expected[4] = False
        expected[:, 4] = True  # everyone attends the text tile; the text tile attends everyone
        expected[4, :] = True
        assert torch.equal(mask[0, head], expected), head


def test_topk_ties_go_to_the_lower_tile_index():
    # every key tile the same: all importance scores tie, and the chosen tiles are the first k (a stable sort), on
    # every device alike (torch.topk leaves the order of ties to the device's library)
    grid, tile = (2, 1, 8), (2, 1, 2)
    q = torch.ones(1, 1, 16, 4)
    k = torch.ones(1, 1, 16, 4)
    config = SstaConfig(tile=tile, window=(1, 1, 1), topk=4, sparse_type="block_attn")
    mask = ssta_mask(q, k, grid, 0, config=config)
    assert mask[0, 0].int().tolist() == [[1, 1, 0, 0]] * 4
    # two tiles tie for the second place: the lower index wins
    k_tiles = torch.tensor([[1.0, 0.0], [0.6, 0.8], [0.0, 1.0], [0.6, 0.8]])[None, None]
    layout = TileLayout(grid, tile, 0)
    mask = ssta_mask(tiles_of(torch.tensor([[[[1.0, 0.0]] * 4]]), layout), tiles_of(k_tiles, layout), grid, 0,
                     config=SstaConfig(tile=tile, topk=4, sparse_type="block_attn", lambda_=1.0))
    assert mask[0, 0, 0].int().tolist() == [1, 1, 0, 0]


@pytest.mark.parametrize("frames, per_row", [(31, 2), (32, 4)])
def test_topk_is_halved_at_31_latent_frames_or_fewer(frames, per_row):
    grid, tile = (frames, 1, 2), (1, 1, 2)  # one tile per latent frame
    q, k = torch.randn(1, 1, frames * 2, 8), torch.randn(1, 1, frames * 2, 8)
    mask = ssta_mask(q, k, grid, 0, config=SstaConfig(tile=tile, topk=4, sparse_type="block_attn"))
    assert mask[0, 0].sum(-1).tolist() == [per_row] * frames


def test_one_frame_uses_the_flat_image_tile_and_no_window():
    # tile volume 16 -> the official image tile (1, 4, 4); window 1x1x1: sta keeps the diagonal only
    q = k = torch.randn(1, 1, 8 * 8, 4)
    mask = ssta_mask(q, k, (1, 8, 8), 0, config=SstaConfig(tile=(2, 2, 4), sparse_type="sta"))
    assert torch.equal(mask[0, 0], torch.eye(4, dtype=torch.bool))
    with pytest.raises(ValueError, match="one-frame grid needs a tile of"):
        ssta_mask(q, k, (1, 8, 8), 0, config=SstaConfig(tile=(1, 2, 3)))


def test_text_tiles_past_the_valid_text_attend_only_themselves():
    # 2 x 2 x 2 grid = one 8-token tile; 10 text tokens = 3 text tiles of 4; valid text 5 and 0 (clamped to 1 tile)
    grid, tile = (2, 2, 2), (2, 2, 1)
    q = k = torch.randn(2, 1, 8 + 10, 4)
    mask = ssta_mask(q, k, grid, 10, torch.tensor([5, 0]), SstaConfig(tile=tile, window=(1, 1, 1), topk=1))
    assert mask.shape == (2, 1, 5, 5)
    live = [4, 3]  # video tiles 0-1 + ceil(5 / 4) = 2 text tiles; video + 1 text tile
    for b in range(2):
        n = live[b]
        expected = torch.zeros(5, 5, dtype=torch.bool)
        expected[:n, 2:n] = True  # the live text tiles: attended by all live tiles, attending them all
        expected[2:n, :n] = True
        # the video tiles: a 1x1x1 window, and top-1 halved (2 frames <= 31) to no top-k tile at all
        expected[range(2), range(2)] = True
        expected[range(n, 5), range(n, 5)] = True
        assert torch.equal(mask[b, 0], expected), b


def test_share_heads_gives_one_mask_for_every_head():
    q, k = torch.randn(1, 3, 4 * 4 * 4, 8), torch.randn(1, 3, 4 * 4 * 4, 8)
    config = SstaConfig(tile=(2, 2, 2), window=(1, 1, 1), topk=2, sparse_type="block_attn")
    shared = ssta_mask(q, k, (4, 4, 4), 0, config=SstaConfig(**{**config.__dict__, "share_heads": True}))
    assert shared.shape == (1, 3, 8, 8) and all(torch.equal(shared[0, 0], shared[0, h]) for h in range(3))
    # the shared choice is the choice on head-averaged block means
    pooled_q = q.mean(1, keepdim=True)
    pooled_k = k.mean(1, keepdim=True)
    assert torch.equal(shared[:, :1], ssta_mask(pooled_q, pooled_k, (4, 4, 4), 0, config=config))


def test_bad_options_are_clear_errors():
    with pytest.raises(ValueError, match="tile must be three positive integers"):
        SstaConfig(tile=(0, 8, 8))
    with pytest.raises(ValueError, match="topk must be an integer >= 1"):
        SstaConfig(topk=0)
    with pytest.raises(ValueError, match="sparse_type must be one of ssta, sta, block_attn"):
        SstaConfig(sparse_type="dense")
    with pytest.raises(ValueError, match="threshold > 0 needs sampling='similarity'"):
        SstaConfig(threshold=0.5)
    q = torch.randn(1, 1, 20, 4)
    with pytest.raises(ValueError, match="needs grid=\\(t, h, w\\)"):
        attention(q, q, q, backend="ssta")
    with pytest.raises(TypeError, match="takes the options grid, ssta"):
        attention(q, q, q, backend="ssta", grid=(2, 2, 5), tile=(1, 1, 1))


# ------------------------------------------------------------------------------------------ the kernels
def independent_attention(q, k, v, mask, grid, text_len, tile, pad_zero=True):
    """float64 attention over the S real tokens, each query over the real keys of its attended tiles plus what the
    tiled kernels also count: the zero padding of those tiles (score 0, value 0) and the text's repeated last token
    (the same key again). Built from token coordinates, not from the kernels' layout code."""
    t, h, w = grid
    tt, th, tw = tile
    nt, nh, nw = -(-t // tt), -(-h // th), -(-w // tw)
    size = tt * th * tw
    n_video = nt * nh * nw
    video_tile = [((a // tt) * nh + b // th) * nw + c // tw for a in range(t) for b in range(h) for c in range(w)]
    text_tile = [n_video + j // size for j in range(text_len)]
    tile_id = torch.tensor(video_tile + text_tile)
    real_per_tile = torch.bincount(tile_id, minlength=mask.shape[-1])
    zeros_per_tile = torch.full_like(real_per_tile, size) - real_per_tile
    repeats = torch.zeros_like(real_per_tile)
    if text_len:  # the last text tile is filled with copies of the last text token
        repeats[text_tile[-1]] = zeros_per_tile[text_tile[-1]]
        zeros_per_tile[n_video:] = 0
    if not pad_zero:
        raise NotImplementedError
    b, heads, s, d = q.shape
    out = torch.zeros(b, heads, s, d, dtype=torch.float64)
    for bi in range(b):
        for hi in range(heads):
            allowed = mask[bi, hi][tile_id][:, tile_id]  # [S, S]: the query's tile attends the key's tile
            scores = q[bi, hi].double() @ k[bi, hi].double().T / math.sqrt(d)
            top = torch.maximum(scores.masked_fill(~allowed, -math.inf).max(-1).values, torch.zeros(s))
            weight = torch.exp(scores - top[:, None]) * allowed
            weight[:, s - 1] *= 1 + (repeats[tile_id[s - 1]] if text_len else 0)
            tiles_attended = mask[bi, hi][tile_id].double()  # [S, T]
            zero_keys = tiles_attended @ zeros_per_tile.double()  # each contributes exp(0 - top)
            total = weight.sum(-1) + zero_keys * torch.exp(-top)
            out[bi, hi] = (weight @ v[bi, hi].double()) / total[:, None]
    return out


CASES = [  # grid needing padding on every axis, two samples with different valid text; sta on a 2-frame grid
    dict(grid=(5, 6, 7), text_len=11, valid=(11, 3), config=SstaConfig(tile=(2, 2, 4), window=(3, 3, 1), topk=3)),
    dict(grid=(2, 5, 6), text_len=6, valid=(6, 6), config=SstaConfig(tile=(2, 2, 2), window=(1, 3, 1),
                                                                     sparse_type="sta")),
]


@pytest.mark.parametrize("case", CASES, ids=["ssta-padded", "sta"])
def test_kernels_equal_the_independent_float64_attention(case):
    grid, text_len, config = case["grid"], case["text_len"], case["config"]
    s = math.prod(grid) + text_len
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 2, s, 16, generator=g) for _ in range(3))
    kv_mask = torch.ones(2, s, dtype=torch.bool)
    for b, n in enumerate(case["valid"]):
        kv_mask[b, math.prod(grid) + n:] = False
    mask = ssta_mask(q, k, grid, text_len, kv_mask[:, math.prod(grid):].sum(1), config)
    assert 0 < density(mask) < 1
    expected = independent_attention(q, k, v, mask, grid, text_len, config.for_grid(grid).tile)
    reference = ssta_reference(q, k, v, kv_mask, grid=grid, ssta=config)
    fast = attention(q, k, v, kv_mask, backend="ssta", grid=grid, ssta=config)
    # float32 softmax over <= 200 keys: measured ~3e-7 of the largest output
    scale = expected.abs().max()
    assert (reference.double() - expected).abs().max() < 2e-6 * scale
    assert (fast.double() - expected).abs().max() < 2e-6 * scale


# ------------------------------------------------------------------------------------------ the tiny model
@pytest.fixture(scope="module")
def tiny_transformer():
    from hyv_lib.models.components import build_tiny_components

    return build_tiny_components(TINY)["transformer"]


def run(model, kwargs):
    with torch.no_grad():
        return model(**kwargs, return_dict=False)[0]


def test_the_tiny_model_with_ssta_equals_its_reference_and_dense_blocks_equal_dense(tiny_transformer):
    kwargs = forward_kwargs(latent=(3, 5, 7))  # a CFG batch with different valid text per sample
    config = SstaConfig(tile=(2, 2, 2), window=(3, 3, 3), topk=4)
    outputs = {}
    for name, backend, options in (("reference", "ssta_reference", dict(ssta=config)),
                                   ("ssta", "ssta", dict(ssta=config)),
                                   ("dense", "auto", {}),
                                   ("all dense", "ssta", dict(ssta=SstaConfig(**{**config.__dict__,
                                                                                  "dense_every": 1})))):
        model = copy.deepcopy(tiny_transformer)
        adapter_for(model).use_attention(model, backend, **options)
        outputs[name] = run(model, kwargs)
    scale = outputs["reference"].abs().max()
    assert (outputs["ssta"] - outputs["reference"]).abs().max() < 1e-5 * scale  # measured 1.3e-7
    # sparse attention moves the output (the tiles do not cover the whole grid)...
    assert (outputs["ssta"] - outputs["dense"]).abs().max() > 1e-3 * scale
    # ... and dense_every=1 runs every block dense: hyv_lib's exact dense attention
    assert torch.allclose(outputs["all dense"], outputs["dense"], atol=1e-6 * scale, rtol=0)


def test_a_stale_grid_is_an_error_not_a_wrong_tiling(tiny_transformer):
    model = copy.deepcopy(tiny_transformer)
    adapter_for(model).use_attention(model, "ssta_reference", ssta=SstaConfig(tile=(2, 2, 2)))
    model.hyv_token_grid.record_shape((1, 8, 3, 5, 7))
    block = model.transformer_blocks[0]
    video = torch.zeros(1, 4 * 5 * 7, model.config.num_attention_heads * model.config.attention_head_dim)
    with pytest.raises(RuntimeError, match="SSTA needs the video's token grid: recorded \\(3, 5, 7\\)"):
        block.attn.processor(block.attn, video, video[:, :3], torch.ones(1, 3, dtype=torch.bool))


def test_ssta_compiles_on_the_cpu_after_torchax_registered_its_device():
    """torchax makes "jax" torch's accelerator on a machine without CUDA, and dynamo then failed to trace any CPU
    compile ("PyTorch is not linked with support for jax devices"): a process that ran the jax runtime could not run
    the torch one with SSTA. A shape no other test compiles, so this call compiles."""
    import torchax  # noqa: F401 - registers the device

    assert torch.accelerator.is_available() and torch.accelerator.current_accelerator().type == "jax"
    grid, config = (2, 3, 4), SstaConfig(tile=(1, 3, 2), window=(1, 1, 1), topk=2)
    q = torch.randn(1, 1, 24 + 3, 8)
    fast = attention(q, q, q, backend="ssta", grid=grid, ssta=config)
    assert (fast - ssta_reference(q, q, q, grid=grid, ssta=config)).abs().max() < 1e-5
    assert torch.accelerator.is_available()  # left as it was


def test_flex_attention_run_eagerly_gives_the_same_answer(monkeypatch):
    """FlexAttention run eagerly (what dynamo falls back to past its recompile limit) ignores a BlockMask's block
    indices and applies only its mask function: the tile mask is that function too, so the answer stays SSTA's
    (with the block indices alone it was dense attention, measured 0.95 off on this case)."""
    from torch.nn.attention.flex_attention import flex_attention

    import hyv_lib.kernels.ssta_torch as ssta_torch

    case = CASES[1]
    grid, config = case["grid"], case["config"]
    q, k, v = (torch.randn(1, 2, math.prod(grid) + case["text_len"], 16, generator=torch.Generator().manual_seed(s))
               for s in range(3))
    monkeypatch.setattr(ssta_torch, "COMPILED_FLEX", [flex_attention])
    eager = attention(q, k, v, backend="ssta", grid=grid, ssta=config)
    reference = ssta_reference(q, k, v, grid=grid, ssta=config)
    assert (eager - reference).abs().max() < 2e-6 * reference.abs().max()


def test_the_compiled_flex_attention_keeps_compiling_past_dynamos_default_limit():
    """A process may meet more shapes than dynamo's per-function limit (a server, this test suite): with the global
    limit at 1, two new shapes each add a program to FlexAttention's cache instead of the second running eagerly."""
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list
    from torch.nn.attention.flex_attention import flex_attention

    config = SstaConfig(tile=(1, 2, 2), window=(1, 1, 1), topk=1)
    with torch._dynamo.config.patch(recompile_limit=1):
        for grid in ((2, 6, 2), (2, 2, 10)):  # shapes no other test compiles
            q = torch.randn(1, 1, math.prod(grid) + 1, 8)
            programs = len(_debug_get_cache_entry_list(flex_attention.__code__))
            fast = attention(q, q, q, backend="ssta", grid=grid, ssta=config)
            assert len(_debug_get_cache_entry_list(flex_attention.__code__)) == programs + 1, grid
            assert (fast - ssta_reference(q, q, q, grid=grid, ssta=config)).abs().max() < 1e-5

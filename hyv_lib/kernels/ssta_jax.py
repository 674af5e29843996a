"""SSTA on JAX arrays: the tile mask inside jit and a block-sparse Pallas TPU kernel over the attended key tiles."""

from __future__ import annotations

import functools
import math

import numpy as np

from ..parallel.mesh import current_mesh, head_axes, target_platform
from .ssta import SstaConfig, TileLayout, call_layout, window_mask

#: TPU lane width: the online softmax keeps its running max and sum replicated over this many lanes (as Splash does).
LANES = 128
#: Bytes of one kernel call's scalar-prefetched tile lists (indices and counts). The TPU compiler (libtpu 0.0.42.1, v6e,
#: without a TPU) puts them in SMEM and refuses more than 1 MiB ("Allocation (size=1497600) would exceed memory
#: (size=1048576) ... prefetched SMEM operand": the 720p/121f lists of 16 heads in one call); calls are split by
#: heads (then samples) to stay within half of that.
SMEM_BUDGET = 512 * 1024


# ------------------------------------------------------------------------------------------ layout
def padded_video(x, layout: TileLayout, pad: str = "zero"):
    """The video tokens of [B, H, S, D] padded to whole tiles (zeros or the edge tokens, ``pad``) and split into
    them: [B, H, nt, tt, nh, th, nw, tw, D] (tile counts and tile cells per axis); a pad and a reshape."""
    import jax.numpy as jnp

    if x.shape[2] != layout.video_tokens + layout.text_len:
        raise ValueError(f"{x.shape[2]} tokens do not make a {layout.grid} grid and {layout.text_len} text tokens")
    b, heads, _, d = x.shape
    (t, h, w), (pt, ph, pw), (tt, th, tw), (nt, nh, nw) = layout.grid, layout.padded, layout.tile, layout.tiles
    video = x[:, :, : layout.video_tokens].reshape(b, heads, t, h, w, d)
    widths = ((0, 0), (0, 0), (0, pt - t), (0, ph - h), (0, pw - w), (0, 0))
    video = jnp.pad(video, widths, mode="constant" if pad == "zero" else "edge")
    return video.reshape(b, heads, nt, tt, nh, th, nw, tw, d)


def to_tiles(x, layout: TileLayout, pad: str = "zero"):
    """[B, H, S, D] -> [B, H, padded_length, D] as :func:`hyv_lib.kernels.ssta.to_tiles` lays it out, with a pad and
    a transpose (no gather): the video padded to whole tiles with zeros or its edge tokens, the text with its last
    token."""
    import jax.numpy as jnp

    b, heads, _, d = x.shape
    video = padded_video(x, layout, pad).transpose(0, 1, 2, 4, 6, 3, 5, 7, 8)
    parts = [video.reshape(b, heads, layout.video_tiles * layout.tile_tokens, d)]
    if layout.text_len:
        text = x[:, :, layout.video_tokens:]
        extra = layout.text_tiles * layout.tile_tokens - layout.text_len
        parts.append(jnp.pad(text, ((0, 0), (0, 0), (0, extra), (0, 0)), mode="edge") if extra else text)
    return jnp.concatenate(parts, axis=2) if len(parts) > 1 else parts[0]


def from_tiles(x, layout: TileLayout):
    """Inverse of :func:`to_tiles` for an output: [B, H, padded_length, D] -> [B, H, S, D], padding dropped."""
    import jax.numpy as jnp

    b, heads, _, d = x.shape
    (t, h, w), (tt, th, tw), (nt, nh, nw) = layout.grid, layout.tile, layout.tiles
    video = x[:, :, : layout.video_tiles * layout.tile_tokens].reshape(b, heads, nt, nh, nw, tt, th, tw, d)
    video = video.transpose(0, 1, 2, 5, 3, 6, 4, 7, 8).reshape(b, heads, nt * tt, nh * th, nw * tw, d)
    video = video[:, :, :t, :h, :w].reshape(b, heads, layout.video_tokens, d)
    start = layout.video_tiles * layout.tile_tokens
    return jnp.concatenate([video, x[:, :, start: start + layout.text_len]], axis=2)


@functools.lru_cache(maxsize=64)
def window_tiles(tiles: tuple[int, int, int], window: tuple[int, int, int]) -> np.ndarray:
    """:func:`hyv_lib.kernels.ssta.window_mask` as a numpy constant, [N, N] bool (once per tile grid and window)."""
    return window_mask(tiles, window).numpy()


# ------------------------------------------------------------------------------------------ the tile mask
def pool_bins(size: int, parts: int) -> list[tuple[int, int]]:
    """Adaptive pooling's windows over ``size`` cells in ``parts``: [floor(i n/o), ceil((i+1) n/o))."""
    return [(i * size // parts, -(-(i + 1) * size // parts)) for i in range(parts)]


def tile_sums(x, axis: int, tile: int, parts: int, pad: str):
    """Sums of x along ``axis`` over each tile's ``parts`` windows once the axis is padded to whole tiles (zeros, or
    its edge cell repeated): float32, that axis of length tiles * parts."""
    import jax
    import jax.numpy as jnp

    length = x.shape[axis]
    tiles = -(-length // tile)
    if tiles * tile > length:
        widths = [(0, 0)] * x.ndim
        widths[axis] = (0, tiles * tile - length)
        x = jnp.pad(x, widths, mode="constant" if pad == "zero" else "edge")
    x = x.reshape(*x.shape[:axis], tiles, tile, *x.shape[axis + 1:])
    sums = [jnp.sum(jax.lax.slice_in_dim(x, lo, hi, axis=axis + 1), axis=axis + 1, dtype=jnp.float32)
            for lo, hi in pool_bins(tile, parts)]
    out = jnp.stack(sums, axis=axis + 1) if parts > 1 else sums[0]
    return out.reshape(*out.shape[:axis], tiles * parts, *out.shape[axis + 1 + (parts > 1):])


def block_means(x, layout: TileLayout, pad: str = "zero", pool: tuple[int, int, int] | None = None):
    """:func:`hyv_lib.kernels.ssta.block_means` in JAX, from x [B, H, S, D] in raster order: float32 [B, H, N, D];
    ``pool``: each tile's ``pool`` sub-block means as ``adaptive_avg_pool3d`` takes them, concatenated: [B, H, N,
    D * prod(pool)]. Summed one axis at a time (w, then h, then t), so no tiled copy of x is made (summing the
    padded tiles in one reduction made the TPU compiler write a float32 copy of the padded video first)."""
    import jax.numpy as jnp

    b, heads, _, d = x.shape
    pool = pool or (1, 1, 1)
    sums = x[:, :, : layout.video_tokens].reshape(b, heads, *layout.grid, d)
    for axis in (4, 3, 2):
        sums = tile_sums(sums, axis, layout.tile[axis - 2], pool[axis - 2], pad)
    (nt, nh, nw), (pt, ph, pw) = layout.tiles, pool
    counts = np.einsum("t,h,w->thw", *(np.array([hi - lo for lo, hi in pool_bins(s, p)], np.float32)
                                       for s, p in zip(layout.tile, pool)))
    sums = sums.reshape(b, heads, nt, pt, nh, ph, nw, pw, d).transpose(0, 1, 2, 4, 6, 3, 5, 7, 8)
    return (sums / counts[..., None]).reshape(b, heads, layout.video_tiles, pt * ph * pw * d)


def ranks(scores):
    """Each entry's place in its row sorted from the highest (ties: the lower index first; NaN above every number,
    as torch ranks it): int32 [..., N]. Counted by comparison, O(N^2) per row with no sort (a TPU compiles a sort
    or a scatter slowly: ~10-20 s each at 720p's 360 tiles)."""
    import jax.numpy as jnp

    n = scores.shape[-1]
    mine, other = scores[..., :, None], scores[..., None, :]
    nan_mine, nan_other = jnp.isnan(mine), jnp.isnan(other)
    earlier = np.tril(np.ones((n, n), dtype=bool), -1)  # [j, j']: j' < j
    ahead = ((other > mine) | (nan_other & ~nan_mine)
             | (((other == mine) | (nan_other & nan_mine)) & earlier))
    return jnp.sum(ahead, axis=-1, dtype=jnp.int32)


def chosen_tiles(q_means, k_means, config: SstaConfig):
    """:func:`hyv_lib.kernels.ssta.topk_tiles` in JAX, as a mask: bool [B, H', N, N], True at each query tile's
    chosen key tiles (by importance or similarity, with similarity's cumulative ``threshold``). Ties go to the lower
    tile index (torch leaves their order unspecified); NaN ranks above every number, as in torch."""
    import jax
    import jax.numpy as jnp

    highest = jax.lax.Precision.HIGHEST  # a TPU's default f32 matmul rounds to bf16: the mask must not
    topk = min(config.topk, k_means.shape[-2])

    def matmul(a, b):
        return jnp.einsum("...id,...jd->...ij", a, b, precision=highest)

    if config.sampling == "importance":
        qn = q_means / jnp.sqrt(jnp.sum(q_means * q_means, axis=-1, keepdims=True))
        kn = k_means / jnp.sqrt(jnp.sum(k_means * k_means, axis=-1, keepdims=True))
        similarity = (matmul(qn, kn) + 1.0) / 2.0
        unique = (matmul(kn, kn) + 1.0) / 2.0
        eye = np.eye(unique.shape[-1], dtype=bool)
        redundancy = jnp.nanmean(jnp.where(eye, jnp.nan, unique), axis=-2, keepdims=True)
        return ranks(config.lambda_ * similarity - (1 - config.lambda_) * redundancy) < topk
    gate = matmul(q_means, k_means)
    if config.threshold <= 0:
        return ranks(gate) < topk
    probs = jax.nn.softmax(gate / 0.01, axis=-1)
    sorted_probs = jnp.sort(probs, axis=-1, descending=True)
    above = jnp.cumsum(sorted_probs, axis=-1) >= config.threshold
    count = jnp.where(above.any(-1, keepdims=True), jnp.argmax(above, axis=-1, keepdims=True) + 1, config.topk)
    # the rest of the official's list repeats its first tile, which is thus chosen even when k is 0 (halved from 1)
    return ranks(probs) < jnp.maximum(jnp.clip(count, 8, config.topk), 1)


def head_mean(x):
    """The mean over all heads, [B, 1, ...]: inside a sharded step (heads split over the mesh's head axes, see
    :func:`hyv_lib.parallel.sharding.per_shard`) across the shards too, so every device shares one mask."""
    import jax

    mean = x.mean(axis=1, keepdims=True)
    mesh = current_mesh()
    if mesh is None:
        return mean
    try:
        return jax.lax.pmean(mean, head_axes(mesh))
    except NameError:  # called outside the shard_map of a sharded step: these are all the heads
        return mean


def tile_mask(q, k, layout: TileLayout, text_valid, config: SstaConfig):
    """:func:`hyv_lib.kernels.ssta.tile_mask` in JAX, bool [B, H', T, T] (H' = 1 with ``share_heads``, else H), from
    q and k [B, H, S, D] in raster order (not tiled); ``config`` already
    :meth:`~hyv_lib.kernels.ssta.SstaConfig.for_grid`'s."""
    import jax.numpy as jnp

    b, heads = q.shape[:2]
    n, n_text = layout.video_tiles, layout.text_tiles
    video = jnp.zeros((b, 1 if config.share_heads else heads, n, n), bool)
    if config.sparse_type in ("ssta", "sta"):
        video = video | window_tiles(layout.tiles, config.window)
    if config.sparse_type in ("ssta", "block_attn"):
        pool = (2, 2, 2) if config.sampling == "similarity" and config.threshold > 0 else None
        q_means, k_means = (block_means(x, layout, config.pad, pool) for x in (q, k))
        if config.share_heads:
            q_means, k_means = head_mean(q_means), head_mean(k_means)
        video = video | chosen_tiles(q_means, k_means, config)
    mask = jnp.pad(video, ((0, 0), (0, 0), (0, n_text), (0, n_text)))
    if n_text:
        index = np.arange(n + n_text)
        mask = mask | ((index[:, None] >= n) | (index[None, :] >= n))
        if text_valid is not None:
            valid_tiles = jnp.maximum((jnp.reshape(text_valid, (-1,)) + layout.tile_tokens - 1)
                                      // layout.tile_tokens, 1)
            live = index[None, :] < (n + valid_tiles)[:, None]  # [B, T]
            keep = live[:, None, :, None] & live[:, None, None, :]
            own = np.eye(n + n_text, dtype=bool) & ~live[:, None, :, None]
            mask = (mask & keep) | own
    return mask


def ssta_mask(q, k, grid: tuple[int, int, int], text_len: int, text_valid=None, config: SstaConfig = SstaConfig()):
    """:func:`hyv_lib.kernels.ssta.ssta_mask` on JAX arrays (jittable: ``grid``, ``text_len`` and ``config`` static,
    ``text_valid`` [B] data): bool [B, H, T, T] over the tiles."""
    import jax.numpy as jnp

    config = config.for_grid(tuple(grid))
    layout = TileLayout(tuple(grid), config.tile, text_len)
    mask = tile_mask(q, k, layout, text_valid, config)
    return jnp.broadcast_to(mask, (q.shape[0], q.shape[1], *mask.shape[2:]))


# ------------------------------------------------------------------------------------------ the kernel
def row_width(layout: TileLayout, config: SstaConfig) -> int:
    """The most key tiles a video query tile can attend (a static bound: its window, its top-k, the text tiles;
    ``config`` already :meth:`~hyv_lib.kernels.ssta.SstaConfig.for_grid`'s)."""
    n = layout.video_tiles
    window = int(window_tiles(layout.tiles, config.window).sum(1).max()) if config.sparse_type != "block_attn" else 0
    topk = 0
    if config.sparse_type != "sta":  # the threshold's list holds its first tile even at k = 0 (see chosen_tiles)
        topk = max(min(config.topk, n), 1 if config.sampling == "similarity" and config.threshold > 0 else 0)
    return min(n + layout.text_tiles, window + topk + layout.text_tiles)


def kv_lists(mask, width: int):
    """Each row's attended key tiles, in ascending order: (indices int32 [..., width], counts int32 [...]); the
    slots past a row's count repeat its last tile, so the kernel's pipeline fetches nothing new for them. Slot s
    holds the number of tiles before the row's (s+1)-th attended one (a compare and a sum: no sort, no scatter)."""
    import jax.numpy as jnp

    counts = jnp.sum(mask, axis=-1, dtype=jnp.int32)
    before = jnp.cumsum(mask, axis=-1, dtype=jnp.int32)  # attended tiles up to and including each one
    slot = jnp.clip(jnp.minimum(jnp.arange(width, dtype=jnp.int32), counts[..., None] - 1), 0, None)
    indices = jnp.sum(before[..., None, :] <= slot[..., :, None], axis=-1, dtype=jnp.int32)
    return jnp.minimum(indices, mask.shape[-1] - 1), counts


def lanes(x, width: int):
    """[rows, LANES] lane-replicated values broadcast to [rows, width] (a tile on a TPU, where width is 128-aligned)."""
    import jax.numpy as jnp

    if width % LANES == 0:
        return jnp.tile(x, (1, width // LANES))
    return jnp.broadcast_to(x[:, :1], (x.shape[0], width))


def sparse_kernel(indices_ref, counts_ref, q_ref, k_ref, v_ref, o_ref, m_ref, l_ref, acc_ref, *, scale: float,
                  width: int, rows: int, list_heads: int):
    """One (batch, head, query tile, slot) step: the online softmax over the slot's key tile, skipped past the row's
    count; the output is written at the last slot."""
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl

    b, h, i, j = (pl.program_id(axis) for axis in range(4))
    count = counts_ref[(b * list_heads + (h if list_heads > 1 else 0)) * rows + i]

    @pl.when(j == 0)
    def _init():
        m_ref[...] = jnp.full(m_ref.shape, -jnp.inf, jnp.float32)
        l_ref[...] = jnp.zeros(l_ref.shape, jnp.float32)
        acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)

    @pl.when(j < count)
    def _step():
        q, k, v = q_ref[...], k_ref[...], v_ref[...]
        s = jax.lax.dot_general(q, k, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32) * scale
        m_prev = m_ref[...]
        m_next = jnp.maximum(m_prev, jax.lax.broadcast_in_dim(s.max(axis=-1), m_prev.shape, (0,)))
        p = jnp.exp(s - lanes(m_next, s.shape[-1]))
        alpha = jnp.exp(m_prev - m_next)
        l_ref[...] = alpha * l_ref[...] + jax.lax.broadcast_in_dim(p.sum(axis=-1), m_prev.shape, (0,))
        m_ref[...] = m_next
        pv = jax.lax.dot_general(p.astype(v.dtype), v, (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32)
        acc_ref[...] = lanes(alpha, acc_ref.shape[-1]) * acc_ref[...] + pv

    @pl.when(j == width - 1)
    def _finish():
        total = l_ref[...]
        inverse = jnp.where(total > 0, 1.0 / jnp.where(total > 0, total, 1.0), 0.0)  # no attended tile: zeros
        o_ref[...] = (acc_ref[...] * lanes(inverse, acc_ref.shape[-1])).astype(o_ref.dtype)


def sparse_attention(q, k, v, indices, counts, *, tile_tokens: int, first_row: int = 0,
                     heads: tuple[int, int] | None = None, batch: tuple[int, int] | None = None,
                     interpret: bool = False):
    """Block-sparse attention over tiles of ``tile_tokens`` tokens: query tile ``first_row + i`` attends, with one
    softmax over all their tokens, the key tiles ``indices[b, h, i, :counts[b, h, i]]``.

    q, k, v: [B, H, L, D] in the tile layout; indices: int32 [nb, H', R, J] (H' = 1: one list for every head) and
    counts [nb, H', R] from :func:`kv_lists`, for the ``batch`` = (first, count) samples and ``heads`` = (first,
    count) heads (None: all). Returns those query tiles' outputs, [nb, nh, R * tile_tokens, D] in q's dtype. One
    Pallas call, grid (nb, nh, R, J): the lists are scalar-prefetched into SMEM and the K/V blocks' index maps read
    them, so only attended tiles are fetched; steps past a row's count neither fetch nor compute."""
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    d = q.shape[-1]
    b0, nb = batch or (0, q.shape[0])
    h0, nh = heads or (0, q.shape[1])
    _, list_heads, rows, width = indices.shape

    def row(bi, hi, i):
        return (bi * list_heads + (hi if list_heads > 1 else 0)) * rows + i

    def q_map(bi, hi, i, j, indices_ref, counts_ref):
        return b0 + bi, h0 + hi, first_row + i, 0

    def kv_map(bi, hi, i, j, indices_ref, counts_ref):
        return b0 + bi, h0 + hi, indices_ref[row(bi, hi, i) * width + j], 0

    def out_map(bi, hi, i, j, indices_ref, counts_ref):
        return bi, hi, i, 0

    block = (None, None, tile_tokens, d)
    kernel = functools.partial(sparse_kernel, scale=1.0 / math.sqrt(d), width=width, rows=rows,
                               list_heads=list_heads)
    return pl.pallas_call(
        kernel,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=2,
            grid=(nb, nh, rows, width),
            in_specs=[pl.BlockSpec(block, q_map), pl.BlockSpec(block, kv_map), pl.BlockSpec(block, kv_map)],
            out_specs=pl.BlockSpec(block, out_map),
            scratch_shapes=[pltpu.VMEM((tile_tokens, LANES), jnp.float32),
                            pltpu.VMEM((tile_tokens, LANES), jnp.float32),
                            pltpu.VMEM((tile_tokens, d), jnp.float32)],
        ),
        out_shape=jax.ShapeDtypeStruct((nb, nh, rows * tile_tokens, d), q.dtype),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "parallel", "arbitrary")),
        interpret=interpret,
    )(indices.reshape(-1), counts.reshape(-1), q, k, v)


def chunks(batch: int, heads: int, list_heads: int, rows: int, width: int,
           budget: int = SMEM_BUDGET) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """((first sample, samples), (first head, heads)) of each kernel call, so that one call's prefetched lists
    (``rows`` x (``width`` + 1) int32 per sample and list head) fit in ``budget`` bytes of SMEM."""
    per_list = rows * (width + 1) * 4
    if per_list > budget:
        raise ValueError(f"ssta: one head's tile lists ({rows} query tiles x {width} key tiles, {per_list} bytes) do "
                         f"not fit the kernel's {budget} bytes of SMEM; use larger SstaConfig.tile")
    shared = list_heads == 1
    nh = heads if shared else max(1, min(heads, budget // per_list))
    nb = max(1, min(batch, budget // (per_list * (1 if shared else nh))))
    return [((b, min(nb, batch - b)), (h, min(nh, heads - h)))
            for b in range(0, batch, nb) for h in range(0, heads, nh)]


def sparse_rows(q, k, v, indices, counts, *, tile_tokens: int, first_row: int = 0, interpret: bool = False,
                budget: int = SMEM_BUDGET):
    """:func:`sparse_attention` for every sample and head, in as many calls as SMEM needs (:func:`chunks`):
    [B, H, R * tile_tokens, D]."""
    import jax.numpy as jnp

    b, heads = q.shape[:2]
    list_heads, rows, width = indices.shape[1:]
    parts: dict[int, list] = {}
    for (b0, nb), (h0, nh) in chunks(b, heads, list_heads, rows, width, budget):
        lists = slice(h0, h0 + nh) if list_heads > 1 else slice(None)
        parts.setdefault(b0, []).append(sparse_attention(
            q, k, v, indices[b0: b0 + nb, lists], counts[b0: b0 + nb, lists], tile_tokens=tile_tokens,
            first_row=first_row, heads=(h0, nh), batch=(b0, nb), interpret=interpret))
    rows_out = [jnp.concatenate(p, axis=1) if len(p) > 1 else p[0] for p in parts.values()]
    return jnp.concatenate(rows_out, axis=0) if len(rows_out) > 1 else rows_out[0]


def attend_tiles(q_tiles, k_tiles, v_tiles, mask, layout: TileLayout, config: SstaConfig, interpret: bool = False):
    """The attention of tiled q, k, v under a tile mask [B, H', T, T]: the video query tiles with lists of at most
    :func:`row_width` key tiles, the text query tiles (which attend every live tile) with lists of all T; separate
    kernel calls, so the sparse rows' grid is not as wide as the dense ones'."""
    import jax.numpy as jnp

    n = layout.video_tiles
    size = layout.tile_tokens
    indices, counts = kv_lists(mask[:, :, :n], row_width(layout, config))
    outs = [sparse_rows(q_tiles, k_tiles, v_tiles, indices, counts, tile_tokens=size, interpret=interpret)]
    if layout.text_tiles:
        indices, counts = kv_lists(mask[:, :, n:], n + layout.text_tiles)
        outs.append(sparse_rows(q_tiles, k_tiles, v_tiles, indices, counts, tile_tokens=size, first_row=n,
                                interpret=interpret))
    return jnp.concatenate(outs, axis=2) if len(outs) > 1 else outs[0]


def ssta_jax_kernel(q, k, v, kv_mask=None, *, grid: tuple[int, int, int] | None = None,
                    ssta: SstaConfig = SstaConfig(), interpret: bool | None = None):
    """SSTA on JAX arrays, the ``ssta`` backend's kernel inside a jitted torchax step: q, k, v [B, H, S, D] (video
    tokens in raster order on ``grid``, then the text), ``kv_mask`` bool [B, S] (its text part gives each sample's
    valid text tokens, valid first; None: all valid) -> [B, H, S, D] in q's dtype, as
    :func:`hyv_lib.kernels.ssta_torch.ssta_attention` computes it: tile, mask (built here, per sample and head, from
    the block means), attend only the attended tiles (every token of them), untile.

    ``interpret``: None compiles the Pallas kernel for a TPU when the program targets one (see
    :func:`hyv_lib.parallel.mesh.target_platform`) and runs it in interpret mode elsewhere."""
    import jax.numpy as jnp

    config, layout = call_layout(tuple(q.shape), grid, ssta)
    if interpret is None:
        interpret = target_platform() != "tpu"
    text_valid = None
    if kv_mask is not None:
        text_valid = jnp.sum(kv_mask[:, layout.video_tokens:], axis=1, dtype=jnp.int32)
    mask = tile_mask(q, k, layout, text_valid, config)
    q_tiles, k_tiles, v_tiles = (to_tiles(x, layout, config.pad) for x in (q, k, v))
    return from_tiles(attend_tiles(q_tiles, k_tiles, v_tiles, mask, layout, config, bool(interpret)), layout)

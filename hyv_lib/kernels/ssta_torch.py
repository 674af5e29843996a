"""SSTA on torch tensors: the fp32 reference over exactly the tokens of the attended tiles, and the ``ssta`` backend,
torch's FlexAttention driven by the tile mask of :mod:`hyv_lib.kernels.ssta` (no S x S tensor, compiled once per
shape; CPU and every CUDA GPU of compute capability >= 8.0, no extra package)."""

from __future__ import annotations

import math

import torch

from .registry import register_backend
from .ssta import SstaConfig, TileLayout, tile_mask, to_tiles, from_tiles, token_mask


def ssta_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_mask: torch.Tensor | None,
                grid: tuple[int, int, int], config: SstaConfig):
    """The tiled q, k, v, the layout and the tile mask [B, H, T, T] of one SSTA call (``kv_mask`` [B, S]: its text
    part gives each sample's valid text tokens, valid first)."""
    if grid is None or len(grid) != 3:
        raise ValueError(f"ssta attention needs grid=(t, h, w), the video's token grid; got {grid!r}")
    grid = tuple(int(n) for n in grid)
    if not isinstance(config, SstaConfig):
        raise TypeError(f"ssta= must be a hyv_lib.SstaConfig, got {type(config).__name__}")
    config = config.for_grid(grid)
    video = math.prod(grid)
    text_len = q.shape[2] - video
    if text_len < 0:
        raise ValueError(f"grid {grid} has {video} video tokens, more than the sequence's {q.shape[2]}")
    layout = TileLayout(grid, config.tile, text_len)
    text_valid = None if kv_mask is None else kv_mask[:, video:].sum(dim=1)
    qt, kt, vt = (to_tiles(x, layout, config.pad) for x in (q, k, v))
    return qt, kt, vt, layout, tile_mask(qt, kt, layout, text_valid, config)


@register_backend("ssta_reference", devices=("cpu", "cuda"), options=("grid", "ssta"))
def ssta_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_mask: torch.Tensor | None = None, *,
                   grid: tuple[int, int, int], ssta: SstaConfig = SstaConfig()) -> torch.Tensor:
    """The oracle: softmax over exactly the tokens of the attended tiles (padding inside them included, as the
    official kernel counts it), in float32 with the token mask materialised (O(S^2): tests only). [B, H, S, D]."""
    qt, kt, vt, layout, mask = ssta_inputs(q, k, v, kv_mask, grid, ssta)
    scores = torch.einsum("bhqd,bhkd->bhqk", qt.float(), kt.float()) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(~token_mask(mask, layout), float("-inf"))
    out = torch.einsum("bhqk,bhkd->bhqd", torch.softmax(scores, dim=-1), vt.float())
    return from_tiles(out, layout).to(q.dtype)


def block_mask(mask: torch.Tensor, layout: TileLayout, device: torch.device, backward: bool):
    """FlexAttention's BlockMask of a tile mask: one block per tile, every attended block whole. On CUDA the blocks
    are *full* (no mask function runs in them); on the CPU they are partial blocks with a mask that keeps everything
    (torch 2.12's CPU FlexAttention does not compile full blocks). ``backward``: also the transposed indices."""
    from torch.nn.attention.flex_attention import BlockMask

    mask = mask.contiguous()
    counts = mask.sum(-1, dtype=torch.int32)
    indices = torch.argsort((~mask).to(torch.int8), dim=-1, stable=True).to(torch.int32)
    size = layout.tile_tokens
    if device.type == "cuda":
        return BlockMask.from_kv_blocks(torch.zeros_like(counts), indices, counts, indices, BLOCK_SIZE=size,
                                        compute_q_blocks=backward)
    return BlockMask.from_kv_blocks(counts, indices, BLOCK_SIZE=size, compute_q_blocks=backward)


#: ``torch.compile(flex_attention)``, made on first use (:func:`compiled_flex`).
COMPILED_FLEX: list = []


def compiled_flex():
    """``torch.compile(flex_attention)`` once per process (static shapes: it recompiles for a new sequence length,
    batch, head count or tile count, and reuses the program otherwise). A plain list holds it, not ``lru_cache``,
    which torch.compile would warn about when a compiled block calls this."""
    if not COMPILED_FLEX:
        from torch.nn.attention.flex_attention import flex_attention

        COMPILED_FLEX.append(torch.compile(flex_attention, dynamic=False))
    return COMPILED_FLEX[0]


@register_backend("ssta", devices=("cpu", "cuda"), min_torch=(2, 5), min_cuda_capability=(8, 0),
                  options=("grid", "ssta"))
def ssta_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_mask: torch.Tensor | None = None, *,
                   grid: tuple[int, int, int] | None = None, ssta: SstaConfig = SstaConfig()) -> torch.Tensor:
    """SSTA through torch's FlexAttention: [B, H, S, D] (video in raster order on ``grid``, then the text) -> the
    outputs of the S tokens. Every row is computed as the official kernel computes it, padded text tokens included
    (those in a valid text tile attend like it; the rest attend their own tile), so the tokens that later blocks
    read evolve as in the checkpoints' training."""
    qt, kt, vt, layout, mask = ssta_inputs(q, k, v, kv_mask, grid, ssta)
    backward = torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v))
    blocks = block_mask(mask, layout, q.device, backward)
    out = compiled_flex()(qt, kt, vt, block_mask=blocks, scale=q.shape[-1] ** -0.5)
    return from_tiles(out, layout)

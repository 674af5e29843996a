"""SSTA on torch tensors: the fp32 reference over exactly the tokens of the attended tiles, and the ``ssta`` backend,
torch's FlexAttention driven by the tile mask of :mod:`hyv_lib.kernels.ssta` (no S x S tensor, compiled once per
shape; CPU and every CUDA GPU of compute capability >= 8.0, no extra package)."""

from __future__ import annotations

import contextlib
import math

import torch

from .registry import register_backend
from .ssta import SstaConfig, TileLayout, call_layout, from_tiles, tile_mask, to_tiles, token_mask
from .ssta_jax import ssta_jax_kernel


def ssta_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_mask: torch.Tensor | None,
                grid: tuple[int, int, int], config: SstaConfig):
    """The tiled q, k, v, the layout and the tile mask [B, H, T, T] of one SSTA call (``kv_mask`` [B, S]: its text
    part gives each sample's valid text tokens, valid first)."""
    config, layout = call_layout(q.shape, grid, config)
    video = layout.video_tokens
    text_valid = None if kv_mask is None else kv_mask[:, video:].sum(dim=1)
    qt, kt, vt = (to_tiles(x, layout, config.pad) for x in (q, k, v))
    with torch.no_grad():  # a choice of tiles: nothing to differentiate
        mask = tile_mask(qt.detach(), kt.detach(), layout, text_valid, config)
    return qt, kt, vt, layout, mask


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
    are *full* (no mask function runs in them); on the CPU they are partial blocks (torch 2.12's CPU FlexAttention
    does not compile full blocks). Its ``mask_mod`` reads the tile mask itself, so the answer is the same where only
    the mask function counts: FlexAttention run eagerly (dynamo past its recompile limit, :func:`run_flex`) ignores
    the block indices and masks the dense scores with ``mask_mod``. ``backward``: also the transposed indices."""
    from torch.nn.attention.flex_attention import BlockMask

    mask = mask.contiguous()
    counts = mask.sum(-1, dtype=torch.int32)
    indices = torch.argsort((~mask).to(torch.int8), dim=-1, stable=True).to(torch.int32)
    size = layout.tile_tokens

    def attended(b, h, q_idx, kv_idx):
        return mask[b, h, q_idx // size, kv_idx // size]

    if device.type == "cuda":
        return BlockMask.from_kv_blocks(torch.zeros_like(counts), indices, counts, indices, BLOCK_SIZE=size,
                                        mask_mod=attended, compute_q_blocks=backward)
    return BlockMask.from_kv_blocks(counts, indices, BLOCK_SIZE=size, mask_mod=attended, compute_q_blocks=backward)


#: ``torch.compile(flex_attention)``, made on first use (:func:`compiled_flex`).
COMPILED_FLEX: list = []

#: Programs dynamo may keep for the compiled FlexAttention (one per shape), against its default of 8 per function
#: (``torch._dynamo.config.recompile_limit``): past the limit a call runs eagerly, dense over S x S.
FLEX_RECOMPILE_LIMIT = 64


def compiled_flex():
    """``torch.compile(flex_attention)`` once per process (static shapes: it recompiles for a new sequence length,
    batch, head count or tile count, and reuses the program otherwise). A plain list holds it, not ``lru_cache``,
    which torch.compile would warn about when a compiled block calls this."""
    if not COMPILED_FLEX:
        import logging

        from torch.nn.attention.flex_attention import flex_attention

        # inductor's C++ build on a machine with CUDA's compiler but no GPU logs "No CUDA runtime is found" once, a
        # warning about CUDA that a CPU compile does not use
        logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)

        COMPILED_FLEX.append(torch.compile(flex_attention, dynamic=False))
    return COMPILED_FLEX[0]


def run_flex(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, blocks, scale: float) -> torch.Tensor:
    """The compiled FlexAttention of tiled q, k, v with the BlockMask ``blocks``, allowed
    :data:`FLEX_RECOMPILE_LIMIT` shapes per process (a process that meets more sizes, a server or a test suite,
    keeps compiling instead of running dense). Inside a compiled block dynamo inlines the call and the block's own
    limit applies."""
    if torch.compiler.is_compiling():
        return compiled_flex()(q, k, v, block_mask=blocks, scale=scale)
    import torch._dynamo as dynamo

    limit = max(FLEX_RECOMPILE_LIMIT, dynamo.config.recompile_limit)
    with host_compile(q.device), dynamo.config.patch(recompile_limit=limit):
        return compiled_flex()(q, k, v, block_mask=blocks, scale=scale)


@contextlib.contextmanager
def host_compile(device: torch.device):
    """Around a torch.compile call on CPU tensors. torchax registers JAX as torch's PrivateUse1 device, and from then
    on a machine without CUDA reports ``torch.accelerator.is_available()`` (the "jax" device), so dynamo's tracer asks
    that device for its current stream and fails ("PyTorch is not linked with support for jax devices"): in a
    process that ran the jax runtime, every later CPU compile would. While compiling for the host, the host has no
    accelerator; with a CUDA GPU (the current accelerator then) nothing changes."""
    current = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else None
    if device.type != "cpu" or current is None or current.type in ("cuda", "cpu"):
        yield
        return
    available = torch.accelerator.is_available
    torch.accelerator.is_available = lambda: False
    try:
        yield
    finally:
        torch.accelerator.is_available = available


@register_backend("ssta", devices=("cpu", "cuda", "jax"), min_torch=(2, 5), min_cuda_capability=(8, 0),
                  options=("grid", "ssta"), jax_kernel=ssta_jax_kernel)
def ssta_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_mask: torch.Tensor | None = None, *,
                   grid: tuple[int, int, int] | None = None, ssta: SstaConfig = SstaConfig()) -> torch.Tensor:
    """SSTA through torch's FlexAttention: [B, H, S, D] (video in raster order on ``grid``, then the text) -> the
    outputs of the S tokens. Every row is computed as the official kernel computes it, padded text tokens included
    (those in a valid text tile attend like it; the rest attend their own tile), so the tokens that later blocks
    read evolve as in the checkpoints' training."""
    qt, kt, vt, layout, mask = ssta_inputs(q, k, v, kv_mask, grid, ssta)
    backward = torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v))
    scale = q.shape[-1] ** -0.5
    if backward and q.device.type == "cpu":  # torch's CPU FlexAttention has no backward: ours, over the tiles
        out = FlexTileBackward.apply(qt, kt, vt, mask, layout, scale)
    else:
        blocks = block_mask(mask, layout, q.device, backward)
        with torch.set_grad_enabled(backward):  # grad mode is one of dynamo's guards
            out = run_flex(qt, kt, vt, blocks, scale)
    return from_tiles(out, layout)


# ------------------------------------------------------------------------------ the backward on the CPU
#: Scores of one chunk of attended tile pairs in the CPU backward, at most (float32 elements: 64 MiB).
PAIR_CHUNK_ELEMENTS = 1 << 24


def tile_pairs(mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The attended (query tile, key tile) pairs of a tile mask [B, H, T, T], as row indices into the tiles of all
    samples and heads flattened ((b * H + h) * T + tile): (query rows, key rows), each [P]."""
    b, h, t, _ = mask.shape
    pairs = mask.reshape(b * h, t, t).nonzero()
    return pairs[:, 0] * t + pairs[:, 1], pairs[:, 0] * t + pairs[:, 2]


def pair_chunks(pairs: int, size: int):
    """Slices of the pair list whose [n, size, size] scores hold at most :data:`PAIR_CHUNK_ELEMENTS` elements."""
    step = max(1, PAIR_CHUNK_ELEMENTS // (size * size))
    return (slice(start, start + step) for start in range(0, pairs, step))


def tile_logsumexp(q: torch.Tensor, k: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor, size: int,
                   scale: float) -> torch.Tensor:
    """The softmax's log-normaliser of every query token over its attended tiles, float32 [B * H * T, size]
    (``q``, ``k``: tiles [B * H * T, size, D]; ``rows``, ``cols``: :func:`tile_pairs`)."""
    per_pair = torch.empty(rows.numel(), size, dtype=torch.float32, device=q.device)
    for part in pair_chunks(rows.numel(), size):
        scores = torch.bmm(q[rows[part]].float(), k[cols[part]].float().transpose(1, 2)) * scale
        per_pair[part] = torch.logsumexp(scores, dim=-1)
    top = torch.full((q.shape[0], size), float("-inf"), dtype=torch.float32, device=q.device)
    top.scatter_reduce_(0, rows[:, None].expand(-1, size), per_pair, "amax")
    total = torch.zeros_like(top).index_add_(0, rows, torch.exp(per_pair - top[rows]))
    return top + torch.log(total)


def tile_attention_backward(q, k, v, out, grad_out, mask: torch.Tensor, size: int, scale: float):
    """Gradients of block-sparse attention over whole tiles (q, k, v, out, grad_out: [B, H, L, D] in the tile
    layout; ``mask`` [B, H, T, T]) with FlashAttention's recurrences, chunk by chunk over the attended tile pairs: no
    S x S tensor, work in proportion to the attended pairs, float32 accumulation. Returns dq, dk, dv in q's dtype."""
    b, h, length, d = q.shape
    tiles = b * h * (length // size)
    q3, k3, v3, o3, g3 = (x.reshape(tiles, size, x.shape[-1]) for x in (q, k, v, out, grad_out))
    rows, cols = tile_pairs(mask)
    lse = tile_logsumexp(q3, k3, rows, cols, size, scale)
    delta = (g3.float() * o3.float()).sum(-1)  # [tiles, size]: rowsum(dO * O)
    dq, dk = (torch.zeros(tiles, size, d, dtype=torch.float32, device=q.device) for _ in range(2))
    dv = torch.zeros(tiles, size, v.shape[-1], dtype=torch.float32, device=q.device)
    for part in pair_chunks(rows.numel(), size):
        r, c = rows[part], cols[part]
        qr, kc, vc, gr = q3[r].float(), k3[c].float(), v3[c].float(), g3[r].float()
        probs = torch.exp(torch.bmm(qr, kc.transpose(1, 2)) * scale - lse[r][..., None])
        dv.index_add_(0, c, torch.bmm(probs.transpose(1, 2), gr))
        dscores = probs * (torch.bmm(gr, vc.transpose(1, 2)) - delta[r][..., None]) * scale
        dq.index_add_(0, r, torch.bmm(dscores, kc))
        dk.index_add_(0, c, torch.bmm(dscores.transpose(1, 2), qr))
    return tuple(g.reshape(x.shape).to(x.dtype) for g, x in ((dq, q), (dk, k), (dv, v)))


class FlexTileBackward(torch.autograd.Function):
    """SSTA on the CPU with gradients: the forward is the compiled FlexAttention of the inference path (same numbers),
    the backward :func:`tile_attention_backward`. torch 2.12's FlexAttention refuses inputs that require grad on the
    CPU (``_validate_device``): inductor's CPU template compiles the forward only (no backward, no logsumexp)."""

    @staticmethod
    def forward(ctx, q, k, v, mask, layout: TileLayout, scale: float):
        """The compiled FlexAttention forward on detached inputs; saves what the tile backward needs."""
        blocks = block_mask(mask, layout, q.device, backward=False)
        out = run_flex(q.detach(), k.detach(), v.detach(), blocks, scale)
        ctx.save_for_backward(q, k, v, out, mask)
        ctx.size, ctx.scale = layout.tile_tokens, scale
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out):
        """dq, dk, dv by :func:`tile_attention_backward` (no gradient for the mask, layout and scale)."""
        q, k, v, out, mask = ctx.saved_tensors
        dq, dk, dv = tile_attention_backward(q, k, v, out, grad_out.contiguous(), mask, ctx.size, ctx.scale)
        return dq, dk, dv, None, None, None

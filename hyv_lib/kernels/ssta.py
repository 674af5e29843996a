"""SSTA, HunyuanVideo-1.5's sparse attention (selective and sliding tile attention): its options, the tile layout
and the tile-level block mask, computed once here for every kernel that consumes it.

The facts restated (read in Tencent-Hunyuan/HunyuanVideo-1.5, ``hyvideo/models/transformers/modules/
ssta_attention.py``, ``attention.py`` and the transformer's ``attn_param`` defaults; this code is written anew):

- The video tokens of a latent grid (t, h, w) are padded to whole tiles (zeros, or the last row repeated) along t,
  then h, then w, and laid out tile by tile: tiles in (t, h, w) raster order, tokens inside a tile in raster order.
  The context ("text") tokens follow, padded to whole tiles by repeating the last one.
- A query tile attends a ``window`` of key tiles around it whose centre is clamped at the grid's edges (numpy's
  ``clip(x, lo, hi)``, so a grid smaller than the window sees all of it), and/or, per sample, head and query tile,
  its ``topk`` key tiles by importance: cosine similarity of the block means of q and k mapped to [0, 1], weighted
  by ``lambda_``, minus (1 - ``lambda_``) times the key tile's mean similarity to the other key tiles (its
  redundancy); or by raw similarity (``sampling="similarity"``), optionally with a cumulative-probability
  ``threshold`` over 2x2x2-pooled tile features that keeps between 8 and ``topk`` tiles.
- Every tile attends every text tile and every text tile attends every tile; text tiles past the last one holding a
  valid text token attend only themselves and nobody attends them.
- Among equal scores the lower tile index wins (a stable sort: the official's ``topk`` leaves ties to the device's
  library).
- ``topk`` is halved at <= 31 latent frames (121 frames at 24 fps); a single frame uses a flat image tile of the same
  size and a 1x1x1 window.
- Every token inside an attended tile counts, the zero padding included (a zero key scores 0 and adds its weight to
  the softmax's denominator), exactly as in the official kernel: the sparse checkpoints were trained so.

The official applies the text cut only with ``sparse_type="ssta"`` (its ``sta`` path refuses a text mask and its
``block_attn`` path ignores it); here the cut applies whenever ``text_valid`` is given, whatever the type. The block
means are taken in float32 (the official takes them in the input dtype, then casts).
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

#: The flat image tile the official uses for a one-frame grid, by tile volume.
IMAGE_TILES = {384: (1, 16, 24), 128: (1, 16, 8), 64: (1, 8, 8), 16: (1, 4, 4)}
SPARSE_TYPES = ("ssta", "sta", "block_attn")
SAMPLINGS = ("importance", "similarity")
PADS = ("zero", "repeat")


@dataclass(frozen=True)
class SstaConfig:
    """SSTA's options, with the defaults of the official transformer's ``attn_param``.

    ``tile``: latent cells of one tile (t, h, w); ``window``: tiles of the sliding window (t, h, w); ``topk``: key
    tiles chosen per query tile (halved at <= 31 latent frames); ``sampling``: ``importance`` or ``similarity``;
    ``lambda_``: importance's weight of similarity against redundancy; ``threshold``: similarity sampling's
    cumulative cut (0: plain top-k); ``share_heads``: one mask for all heads (block means averaged over heads);
    ``sparse_type``: ``ssta`` (window and top-k), ``sta`` (window only) or ``block_attn`` (top-k only); ``pad``: how the
    video is padded to whole tiles (``zero`` or ``repeat``); ``dense_every``: N > 0 runs every N-th block and the
    last one with dense attention (the official's ``win_type="hybrid"``, ``win_ratio=N``), 0 none.
    """

    tile: tuple[int, int, int] = (6, 8, 8)
    window: tuple[int, int, int] = (3, 3, 3)
    topk: int = 64
    sampling: str = "importance"
    lambda_: float = 0.7
    threshold: float = 0.0
    share_heads: bool = False
    sparse_type: str = "ssta"
    pad: str = "zero"
    dense_every: int = 0

    def __post_init__(self):
        for name in ("tile", "window"):
            value = getattr(self, name)
            if len(value) != 3 or not all(isinstance(x, int) and x >= 1 for x in value):
                raise ValueError(f"SstaConfig.{name} must be three positive integers (t, h, w), got {value!r}")
            object.__setattr__(self, name, tuple(value))
        if not isinstance(self.topk, int) or self.topk < 1:
            raise ValueError(f"SstaConfig.topk must be an integer >= 1, got {self.topk!r}")
        choices = {"sampling": SAMPLINGS, "sparse_type": SPARSE_TYPES, "pad": PADS}
        for name, valid in choices.items():
            if getattr(self, name) not in valid:
                raise ValueError(f"SstaConfig.{name} must be one of {', '.join(valid)}, got {getattr(self, name)!r}")
        if not 0.0 <= self.lambda_ <= 1.0:
            raise ValueError(f"SstaConfig.lambda_ must be in [0, 1], got {self.lambda_!r}")
        if not 0.0 <= self.threshold <= 1.0:
            raise ValueError(f"SstaConfig.threshold must be in [0, 1], got {self.threshold!r}")
        if self.threshold > 0 and self.sampling == "importance":
            raise ValueError("SstaConfig.threshold > 0 needs sampling='similarity' (the official importance sampling "
                             "has no threshold)")
        if not isinstance(self.dense_every, int) or self.dense_every < 0:
            raise ValueError(f"SstaConfig.dense_every must be an integer >= 0, got {self.dense_every!r}")

    def for_grid(self, grid: tuple[int, int, int]) -> SstaConfig:
        """The options the official uses on a latent grid (t, h, w): a flat image tile and a 1x1x1 window for one
        frame, ``topk`` halved at <= 31 frames."""
        t = grid[0]
        if t == 1:
            volume = math.prod(self.tile)
            if volume not in IMAGE_TILES:
                raise ValueError(f"a one-frame grid needs a tile of {', '.join(map(str, IMAGE_TILES))} cells (the "
                                 f"official's image tiles), got {self.tile} = {volume}")
            return _replace(self, tile=IMAGE_TILES[volume], window=(1, 1, 1))
        if t <= 31:  # the official halves k as it is (1 becomes 0: no top-k tiles), unchecked by __post_init__
            halved = copy.copy(self)
            object.__setattr__(halved, "topk", self.topk // 2)
            return halved
        return self

    def is_dense(self, block: int, blocks: int) -> bool:
        """Whether block ``block`` (0-based) of ``blocks`` runs dense attention (``dense_every``, the hybrid mode)."""
        return self.dense_every > 0 and ((block + 1) % self.dense_every == 0 or block + 1 == blocks)


def _replace(config: SstaConfig, **changes) -> SstaConfig:
    import dataclasses

    return dataclasses.replace(config, **changes)


# ------------------------------------------------------------------------------------------ layout
@dataclass(frozen=True)
class TileLayout:
    """Where the tokens of one (grid, text length, tile) go: the padded grid, tile counts and sequence lengths."""

    grid: tuple[int, int, int]  #: the video's latent grid (t, h, w)
    tile: tuple[int, int, int]
    text_len: int

    @property
    def padded(self) -> tuple[int, int, int]:
        return tuple(-(-n // s) * s for n, s in zip(self.grid, self.tile))

    @property
    def tiles(self) -> tuple[int, int, int]:
        """Video tiles along t, h, w."""
        return tuple(p // s for p, s in zip(self.padded, self.tile))

    @property
    def tile_tokens(self) -> int:
        return math.prod(self.tile)

    @property
    def video_tiles(self) -> int:
        return math.prod(self.tiles)

    @property
    def text_tiles(self) -> int:
        return -(-self.text_len // self.tile_tokens)

    @property
    def video_tokens(self) -> int:
        return math.prod(self.grid)

    @property
    def padded_length(self) -> int:
        """Tokens of the tiled sequence: every tile whole."""
        return (self.video_tiles + self.text_tiles) * self.tile_tokens


def tile_order(layout: TileLayout, device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """Where the tiled sequence's positions come from: the source token of each position (index into the S tokens;
    a video padding position names the edge token it would repeat, a text padding position the last text token)
    and the video padding positions (those :func:`to_tiles` zeroes with ``pad="zero"``). Computed on ``device`` with
    a few index operations (no host round trip, traceable by torch.compile)."""
    (t, h, w), (tt, th, tw), (_, nh, nw) = layout.grid, layout.tile, layout.tiles
    size = layout.tile_tokens
    position = torch.arange(layout.video_tiles * size, device=device)
    tile, within = position // size, position % size
    ct = (tile // (nh * nw)) * tt + within // (th * tw)
    ch = (tile // nw) % nh * th + (within // tw) % th
    cw = (tile % nw) * tw + within % tw
    padding = (ct >= t) | (ch >= h) | (cw >= w)
    source = (ct.clamp(max=t - 1) * h + ch.clamp(max=h - 1)) * w + cw.clamp(max=w - 1)
    text = layout.video_tokens + torch.arange(layout.text_tiles * size, device=device).clamp(max=layout.text_len - 1)
    n_padding = layout.video_tiles * size - layout.video_tokens
    padded = torch.argsort((~padding).to(torch.int8), stable=True)[:n_padding]
    return torch.cat([source, text]), padded


def call_layout(shape: tuple[int, ...], grid, config: SstaConfig) -> tuple[SstaConfig, TileLayout]:
    """The per-grid options (:meth:`SstaConfig.for_grid`) and the tile layout of one attention call on [B, H, S, D]
    tensors of ``shape`` whose video has the token grid ``grid``; a clear error for a missing or wrong grid."""
    if grid is None or len(grid) != 3:
        raise ValueError(f"ssta attention needs grid=(t, h, w), the video's token grid; got {grid!r}")
    grid = tuple(int(n) for n in grid)
    if not isinstance(config, SstaConfig):
        raise TypeError(f"ssta= must be a hyv_lib.SstaConfig, got {type(config).__name__}")
    config = config.for_grid(grid)
    text_len = shape[2] - math.prod(grid)
    if text_len < 0:
        raise ValueError(f"grid {grid} has {math.prod(grid)} video tokens, more than the sequence's {shape[2]}")
    return config, TileLayout(grid, config.tile, text_len)


def to_tiles(x: torch.Tensor, layout: TileLayout, pad: str = "zero") -> torch.Tensor:
    """[B, H, S, D] (video in raster order, then text) -> [B, H, padded_length, D], tile by tile: tiles in (t, h, w)
    raster order, tokens inside a tile in raster order; the video padded to whole tiles with zeros or its edge
    tokens (``pad``; the official pads t, then h, then w, which repeats the same edge token), the text with its last
    token. One gather (and a fill of the padding)."""
    if x.shape[2] != layout.video_tokens + layout.text_len:
        raise ValueError(f"{x.shape[2]} tokens do not make a {layout.grid} grid and {layout.text_len} text tokens")
    source, padded = tile_order(layout, x.device)
    out = x.index_select(2, source)
    if pad == "zero" and padded.numel():
        out.index_fill_(2, padded, 0)
    return out


def from_tiles(x: torch.Tensor, layout: TileLayout) -> torch.Tensor:
    """Inverse of :func:`to_tiles` for an output: [B, H, padded_length, D] -> [B, H, S, D], padding dropped (one
    gather)."""
    (t, h, w), (tt, th, tw), (_, nh, nw) = layout.grid, layout.tile, layout.tiles
    token = torch.arange(layout.video_tokens, device=x.device)
    ct, ch, cw = token // (h * w), (token // w) % h, token % w
    tile = ((ct // tt) * nh + ch // th) * nw + cw // tw
    within = ((ct % tt) * th + ch % th) * tw + cw % tw
    text = layout.video_tiles * layout.tile_tokens + torch.arange(layout.text_len, device=x.device)
    return x.index_select(2, torch.cat([tile * layout.tile_tokens + within, text]))


# ------------------------------------------------------------------------------------------ the block mask
def window_mask(tiles: tuple[int, int, int], window: tuple[int, int, int],
                device: torch.device | str = "cpu") -> torch.Tensor:
    """[N, N] bool over the video tiles (raster order): query tile i attends key tile j when j lies in the window
    centred on i, the centre clamped to the grid's edges as numpy's ``clip(i, w // 2, n - 1 - w // 2)`` does
    (max first, then min: a grid narrower than the window sees all of it)."""
    coords = torch.stack(torch.meshgrid(*(torch.arange(n, device=device) for n in tiles), indexing="ij"), -1)
    coords = coords.reshape(-1, 3)
    inside = torch.ones(coords.shape[0], coords.shape[0], dtype=torch.bool, device=device)
    for axis, (n, size) in enumerate(zip(tiles, window)):
        half = size // 2
        centre = coords[:, axis].clamp(min=half).clamp(max=n - 1 - half)
        inside &= (centre[:, None] - coords[None, :, axis]).abs() <= half
    return inside


def block_means(x: torch.Tensor, layout: TileLayout, pool: tuple[int, int, int] | None = None) -> torch.Tensor:
    """Per-tile mean features of the tiled video tokens, float32: [B, H, N_video_tiles, D] (``pool``: the means of
    each tile's ``pool`` sub-blocks, concatenated: [B, H, N, D * prod(pool)], as ``adaptive_avg_pool3d`` takes them)."""
    b, heads, _, d = x.shape
    tiles = x[:, :, : layout.video_tiles * layout.tile_tokens].reshape(b, heads, layout.video_tiles, -1, d)
    if pool is None:
        return tiles.mean(dim=3, dtype=torch.float32)  # accumulated in float32, no float32 copy of the tiles
    volumes = tiles.float().reshape(-1, *layout.tile, d).permute(0, 4, 1, 2, 3)
    pooled = F.adaptive_avg_pool3d(volumes, pool).permute(0, 2, 3, 4, 1)
    return pooled.reshape(b, heads, layout.video_tiles, -1)


def best(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the ``k`` highest scores along the last axis, ties to the lower index (a stable sort; NaN ranks
    highest, as torch sorts it). ``torch.topk`` leaves the order of ties to the device's library, so the CPU, CUDA
    and the JAX kernel could pick different tiles from equal scores; a stable sort picks the same everywhere."""
    return scores.sort(dim=-1, descending=True, stable=True).indices[..., :k]


def topk_tiles(q_means: torch.Tensor, k_means: torch.Tensor, config: SstaConfig) -> torch.Tensor:
    """Key-tile indices chosen per query tile, [B, H', N, k] (ties to the lower index, :func:`best`), by importance or
    similarity (with its cumulative ``threshold``: between 8 and ``topk`` tiles, the rest filled with the best one)."""
    topk = min(config.topk, k_means.shape[-2])
    if config.sampling == "importance":
        qn = q_means / q_means.norm(dim=-1, keepdim=True)
        kn = k_means / k_means.norm(dim=-1, keepdim=True)
        similarity = (qn @ kn.transpose(-1, -2) + 1.0) / 2.0
        unique = (kn @ kn.transpose(-1, -2) + 1.0) / 2.0
        eye = torch.eye(unique.shape[-1], dtype=torch.bool, device=unique.device)
        redundancy = torch.nanmean(unique.masked_fill(eye, float("nan")), dim=-2, keepdim=True)
        scores = config.lambda_ * similarity - (1 - config.lambda_) * redundancy
        return best(scores, topk)
    gate = q_means @ k_means.transpose(-1, -2)
    if config.threshold <= 0:
        return best(gate, topk)
    probs = torch.softmax(gate / 0.01, dim=-1)
    sorted_probs, order = probs.sort(dim=-1, descending=True, stable=True)
    above = sorted_probs.cumsum(-1) >= config.threshold
    count = torch.where(above.any(-1, keepdim=True), above.int().argmax(-1, keepdim=True) + 1,
                        torch.full_like(above[..., :1], config.topk, dtype=torch.long))
    count = count.clamp(min=8, max=config.topk)
    rank = torch.arange(gate.shape[-1], device=gate.device).expand(gate.shape)
    return torch.where(rank < count, order, order[..., :1])


def ssta_mask(q: torch.Tensor, k: torch.Tensor, grid: tuple[int, int, int], text_len: int,
              text_valid: torch.Tensor | None = None, config: SstaConfig = SstaConfig()) -> torch.Tensor:
    """SSTA's tile-level mask, bool [B, H, T, T]: the padded grid's video tiles (in the official's tile order), then
    the text tiles; True where a query tile attends a key tile (every token of it).

    ``q``, ``k``: [B, H, S, D], S = t*h*w video tokens in (t, h, w) raster order followed by ``text_len`` text tokens;
    ``grid``: (t, h, w); ``text_valid``: [B] valid text tokens per sample (valid first; None: all). The official's
    per-grid rules apply (:meth:`SstaConfig.for_grid`)."""
    config = config.for_grid(tuple(grid))
    layout = TileLayout(tuple(grid), config.tile, text_len)
    return tile_mask(to_tiles(q, layout, config.pad), to_tiles(k, layout, config.pad), layout, text_valid, config)


def tile_mask(q_tiles: torch.Tensor, k_tiles: torch.Tensor, layout: TileLayout, text_valid: torch.Tensor | None,
              config: SstaConfig) -> torch.Tensor:
    """:func:`ssta_mask` on tensors already in the tile layout (``config`` already :meth:`~SstaConfig.for_grid`'s)."""
    b, heads = q_tiles.shape[:2]
    n, n_text = layout.video_tiles, layout.text_tiles
    device = q_tiles.device
    mask = torch.zeros(b, 1 if config.share_heads else heads, n + n_text, n + n_text, dtype=torch.bool,
                       device=device)
    if config.sparse_type in ("ssta", "sta"):
        mask[:, :, :n, :n] = window_mask(layout.tiles, config.window, device)
    if config.sparse_type in ("ssta", "block_attn"):
        pool = (2, 2, 2) if config.sampling == "similarity" and config.threshold > 0 else None
        q_means, k_means = block_means(q_tiles, layout, pool), block_means(k_tiles, layout, pool)
        if config.share_heads:
            q_means, k_means = q_means.mean(1, keepdim=True), k_means.mean(1, keepdim=True)
        chosen = topk_tiles(q_means, k_means, config)
        video = mask[:, :, :n, :n].clone()
        mask[:, :, :n, :n] = video.scatter(-1, chosen, True)
    mask[:, :, :, n:] = True
    mask[:, :, n:, :] = True
    if text_valid is not None and n_text:
        valid_tiles = (torch.as_tensor(text_valid, device=device).reshape(-1) + layout.tile_tokens - 1)
        valid_tiles = (valid_tiles // layout.tile_tokens).clamp(min=1)
        index = torch.arange(n + n_text, device=device)
        live = index[None, :] < (n + valid_tiles)[:, None]  # [B, T]
        keep = live[:, None, :, None] & live[:, None, None, :]
        mask = (mask & keep) | torch.eye(n + n_text, dtype=torch.bool, device=device) & ~live[:, None, :, None]
    return mask.expand(b, heads, n + n_text, n + n_text)


def token_mask(mask: torch.Tensor, layout: TileLayout) -> torch.Tensor:
    """The tile mask expanded to tokens of the tiled sequence, [B, H, L, L] (L = padded_length): O(L^2), for
    references and tests only."""
    size = layout.tile_tokens
    return mask.repeat_interleave(size, dim=-2).repeat_interleave(size, dim=-1)


def density(mask: torch.Tensor) -> float:
    """The attended share of the tile pairs (what the kernels' work scales with)."""
    return float(mask.float().mean())

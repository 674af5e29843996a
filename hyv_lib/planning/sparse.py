"""SSTA's tile density and kernel cost without data: the window and text tiles exact, the top-k tiles bounded."""

from __future__ import annotations

import dataclasses
from typing import Any

from ..base.errors import HyvInputError
from ..base.presets import Preset
from ..kernels.ssta import SstaConfig, TileLayout, window_mask
from ..models.registry import adapters_with, get_adapter

#: The ``attention`` values the cost model takes (or a :class:`hyv_lib.SstaConfig`): ``auto`` (the preset's own,
#: :attr:`hyv_lib.base.presets.Preset.attention`: SSTA for the ``*_sparse`` checkpoints, dense for the rest),
#: ``dense`` or ``flash`` (every exact kernel, Splash, flash-attn, SDPA, XLA: each computes all S x S pairs, so
#: they cost the same FLOPs) and ``ssta`` (:class:`hyv_lib.SstaConfig`'s defaults, the official ``attn_param``).
ATTENTIONS = ("auto", "dense", "flash", "ssta")


def ssta_config(preset: Preset, attention: str | SstaConfig | None = None) -> SstaConfig | None:
    """The SSTA options ``attention`` asks for on ``preset``, or None for dense attention (:data:`ATTENTIONS`; None
    is ``auto``). HyvInputError naming ``attention`` for another value, or SSTA on a model that does not run it."""
    if attention is None or attention == "auto":
        attention = "ssta" if preset.attention == "ssta" else "dense"
    if isinstance(attention, SstaConfig):
        config = attention
    elif attention == "ssta":
        config = SstaConfig()
    elif attention in ATTENTIONS:
        return None
    else:
        raise HyvInputError("attention", f"must be one of {', '.join(ATTENTIONS)} or a hyv_lib.SstaConfig, got "
                                         f"{attention!r}")
    if not get_adapter(preset.model).runs_ssta:
        raise HyvInputError("attention", f"{preset.name} runs {preset.model!r}; SSTA runs on "
                                         f"{', '.join(adapters_with('runs_ssta'))} only")
    return config


def tile_density(grid: tuple[int, int, int], text_len: int, config: SstaConfig = SstaConfig(),
                 text_valid: int | None = None) -> dict[str, Any]:
    """SSTA's tile density on a token grid (t, h, w) with ``text_len`` context tokens, from the layout alone (no q, k).

    The mask of :func:`hyv_lib.kernels.ssta.ssta_mask` (the official's rules, :meth:`~hyv_lib.SstaConfig.for_grid`
    applied first) has three parts. Two are fixed by the layout and counted exactly here: the window (each video
    query tile's key tiles in the clamped ``window``, :func:`hyv_lib.kernels.ssta.window_mask`) and the text tiles
    (every video tile attends the text tiles holding valid text and they attend every live tile; text tiles past
    ``text_valid`` attend only themselves). The third depends on the data: each video query tile adds its ``topk`` key
    tiles, which may fall inside its window. The planning figure is the upper bound, ``density``: top-k tiles all
    outside the window (window plus k distinct tiles, capped at the video tiles); ``lower`` has them all inside it;
    ``uniform`` is the expectation when the k tiles are a uniformly random choice among the video tiles (what random
    q and k give: a query tile with w window tiles of N gains k (N - w) / N). ``sparse_type="sta"`` (window only)
    and ``"block_attn"`` (top-k only: exactly k distinct tiles; with a ``threshold``, at most k) leave less or nothing
    to the data; ``exact`` says whether the bounds meet (a similarity ``threshold`` keeps between 8 and k tiles).

    ``text_valid``: valid context tokens (valid first); None counts every context token valid (an upper bound: a
    short prompt's padding tiles attend only themselves). Returns the densities (shares of the T x T tile pairs,
    T = video + text tiles), the attended pairs of each part, the layout's sizes (``padded_length``: tokens of the
    tiled sequence, every tile whole: the kernel computes the padding inside attended tiles) and ``config`` (the
    per-grid options actually used).
    """
    grid = tuple(int(n) for n in grid)
    config = config.for_grid(grid)
    layout = TileLayout(grid, config.tile, text_len)
    n, n_text = layout.video_tiles, layout.text_tiles
    if text_valid is not None and not (isinstance(text_valid, int) and 0 <= text_valid <= text_len):
        raise HyvInputError("text_valid", f"must be an integer between 0 and {text_len}, got {text_valid!r}")
    valid = n_text if text_valid is None else min(n_text, max(1, -(-text_valid // layout.tile_tokens)))
    if n_text == 0:
        valid = 0
    window = (window_mask(layout.tiles, config.window).sum(-1).tolist() if config.sparse_type != "block_attn"
              else [0] * n)
    k = min(config.topk, n) if config.sparse_type != "sta" else 0
    k_min = min(8, k) if config.threshold > 0 else k  # the cumulative threshold keeps between 8 and k tiles
    fixed = sum(window)
    upper = sum(min(n, w + k) for w in window)
    lower = sum(max(w, k_min) for w in window)
    uniform = sum(w + k * (n - w) / n for w in window)
    text = n * valid + valid * (n + valid) + (n_text - valid)
    total = (n + n_text) ** 2
    return dict(
        density=(upper + text) / total, lower=(lower + text) / total, uniform=(uniform + text) / total,
        window=(fixed + text) / total, exact=upper == lower, pairs=upper + text, window_pairs=fixed,
        topk_pairs=upper - fixed, text_pairs=text, tiles=n + n_text, video_tiles=n, text_tiles=n_text,
        valid_text_tiles=valid, tile_tokens=layout.tile_tokens, padded_length=layout.padded_length, topk=k,
        grid=grid, config=config)


def ssta_density(preset: Preset, height: int, width: int, video_length: int,
                 attention: str | SstaConfig | None = None, valid_context: int | None = None) -> dict[str, Any] | None:
    """:func:`tile_density` of one sample's joint attention in a step of ``preset`` (the video's token grid, every
    context token, ``valid_context`` of them valid; None: all) under ``attention`` (:func:`ssta_config`; None: the
    preset's own), plus ``sparse_blocks``: the joint blocks that run SSTA (``dense_every`` leaves some dense).
    None for dense attention."""
    config = ssta_config(preset, attention)
    if config is None:
        return None
    c = preset.transformer
    t, h, w = preset.denoising_shape(height, width, video_length)[2:]
    patch, patch_t = c.get("patch_size") or 1, c.get("patch_size_t") or 1
    grid = (-(-t // patch_t), h // patch, w // patch)
    nc = get_adapter(preset.model).context_tokens(preset)
    if valid_context is not None and not (isinstance(valid_context, int) and 0 <= valid_context <= nc):
        raise HyvInputError("valid_context", f"must be between 0 and {nc}, got {valid_context!r}")
    density = tile_density(grid, nc, config, valid_context)
    layers = c["num_layers"]
    density["sparse_blocks"] = sum(not config.is_dense(i, layers) for i in range(layers))
    return density


def density_summary(density: dict[str, Any] | None) -> dict[str, Any]:
    """The JSON-ready figures of an :func:`ssta_density` (empty for None, dense attention): ``density`` (the upper
    bound), ``window_density``, ``uniform_density``, ``tiles``, ``padded_length``, ``topk``, ``sparse_blocks`` and
    ``config`` (the per-grid options as a dict)."""
    if density is None:
        return {}
    return dict(density=density["density"], window_density=density["window"], uniform_density=density["uniform"],
                tiles=density["tiles"], padded_length=density["padded_length"], topk=density["topk"],
                sparse_blocks=density["sparse_blocks"], config=dataclasses.asdict(density["config"]))


def ssta_kernel_cost(density: dict[str, Any], batch: int, heads: int, head_dim: int,
                     dtype_bytes: int) -> dict[str, Any]:
    """FLOPs and HBM bytes of one SSTA attention call (one joint block) over ``batch`` samples and ``heads`` heads, at
    the bound of :func:`tile_density` (``density``).

    - FLOPs: QK^T and PV over every attended tile pair, padding tokens included (the kernel computes whole tiles):
      ``4 B H D x pairs x tile^2``, i.e. the dense count over the tiled sequence (``4 B H L^2 D``, L = padded_length)
      times the tile density.
    - bytes: per (sample, head) Q is read and O written once over the tiled sequence, and each query tile reads its
      attended K and V tiles from HBM (no reuse between query tiles, as a TPU's VMEM gives none; a GPU's L2 may share
      some, so there it is an upper bound): ``B H D x (2 L + 2 pairs x tile)``, x = ``dtype_bytes``. The gathers into
      and out of the tile layout run outside the kernel and are not counted.

    ``intensity`` = FLOPs / bytes tends to ``2 tile / x`` FLOP per byte (384 at bf16 with 6x8x8 tiles): under v6e's
    ridge (918e12 / 1638e9 = 560), over an H100's or H200's (about 300 and 206)."""
    tile, pairs, length = density["tile_tokens"], density["pairs"], density["padded_length"]
    flops = 4 * batch * heads * head_dim * pairs * tile * tile
    nbytes = batch * heads * head_dim * dtype_bytes * (2 * length + 2 * pairs * tile)
    return dict(flops=flops, bytes=nbytes, intensity=flops / nbytes, passes=pairs / density["tiles"],
                block_q=tile)

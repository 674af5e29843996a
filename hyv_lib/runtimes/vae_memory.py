"""The VAE decode's peak memory for a spatial tile size, and the largest tile that fits a memory budget."""

from __future__ import annotations

import functools
import json
import math

import torch

from ..base.errors import HyvInputError
from ..models.patches import frame_causal_vae_attention

#: Copies of the decoder's largest activation alive at its peak (a causal convolution's padded input, its output, the
#: residual, the norm's output, ...): fitted to one H200 measurement, bf16, 720p/121f, 256 px tiles, 16.56 GiB allocated
#: (benchmarks/results/gpu_check_2026-11-26_H200_run2.json), with the other terms of :func:`decode_peak_bytes`.
LIVE_COPIES = 6.3
#: Tile sizes :func:`tile_for_budget` tries, in pixels (square tiles, multiples of the 16x spatial compression).
TILE_STEP_PX = 64
SMALLEST_TILE_PX = 64


@functools.lru_cache(maxsize=8)
def _largest_activation_elements(vae_class: type, config_json: str, tile_shape: tuple[int, ...]) -> int:
    """Elements of the largest output of any leaf module of the decoder on one latent tile: the decoder runs on the
    meta device (shapes only, no memory, no arithmetic), so this is the real class's architecture, not a model of it."""
    with torch.device("meta"):
        vae = vae_class.from_config(json.loads(config_json))
    largest = [0]

    def record(module, args, out):
        if isinstance(out, torch.Tensor):
            largest[0] = max(largest[0], out.numel())

    hooks = [m.register_forward_hook(record) for m in vae.decoder.modules() if not list(m.children())]
    try:
        with torch.no_grad(), frame_causal_vae_attention(vae.decoder):
            vae.decoder(torch.empty(tile_shape, device="meta"))
    finally:
        for hook in hooks:
            hook.remove()
    return largest[0]


def _tile_starts(length: int, tile: int, overlap_factor: float) -> range:
    """diffusers' tile origins along one latent axis (``tiled_decode``: a stride of tile x (1 - overlap))."""
    return range(0, length, max(1, int(tile * (1 - overlap_factor))))


def decode_peak_bytes(vae, latent_shape: tuple[int, ...], tile_px: int | None, dtype: torch.dtype) -> dict[str, float]:
    """The peak device memory of ``decode_latents`` for latents of ``latent_shape`` [B, C, T, h, w] with square
    ``tile_px`` tiles (None: one piece), the VAE in ``dtype``: its terms in bytes and their ``total``.

    - ``weights``: the whole VAE (encoder too: it moves as one module);
    - ``activations``: :data:`LIVE_COPIES` x the decoder's largest activation on one tile (every tile spans all the
      video's frames: diffusers tiles space only), traced on the meta device;
    - ``tiles``: the decoded tiles diffusers keeps until it blends them;
    - ``video``: the blended rows and the concatenated video.
    """
    batch, _, frames, h, w = latent_shape
    ratio = vae.config.spatial_compression_ratio
    x = torch.empty((), dtype=dtype).element_size()
    weights = sum(p.numel() for p in vae.parameters()) * x
    tile = max(h, w) if tile_px is None else max(1, tile_px // ratio)
    th, tw = min(tile, h), min(tile, w)
    config = json.dumps({k: v for k, v in vae.config.items() if not k.startswith("_")}, sort_keys=True, default=list)
    largest = _largest_activation_elements(type(vae), config, (batch, latent_shape[1], frames, th, tw))
    out_frames = (frames - 1) * vae.config.temporal_compression_ratio + 1
    overlap = vae.tile_overlap_factor
    tiled = tile_px is not None and (h > tile or w > tile)
    tiles = 0.0
    if tiled:
        for i in _tile_starts(h, tile, overlap):
            for j in _tile_starts(w, tile, overlap):
                tiles += batch * 3 * out_frames * min(tile, h - i) * ratio * min(tile, w - j) * ratio * x
    video = (2 if tiled else 1) * batch * 3 * out_frames * h * ratio * w * ratio * x
    terms = dict(weights=float(weights), activations=LIVE_COPIES * largest * x, tiles=tiles, video=float(video))
    terms["total"] = sum(terms.values())
    return terms


def tile_for_budget(vae, latent_shape: tuple[int, ...], budget_gib: float, dtype: torch.dtype) -> int:
    """The largest square tile (pixels, a multiple of :data:`TILE_STEP_PX`; or the whole frame when it fits in one
    piece) whose :func:`decode_peak_bytes` stays within ``budget_gib`` GiB; HyvInputError naming ``--vae_memory_gb``
    with the smallest tile's need when none does."""
    if not isinstance(budget_gib, (int, float)) or isinstance(budget_gib, bool) or not budget_gib > 0 \
            or not math.isfinite(budget_gib):
        raise HyvInputError("--vae_memory_gb", f"must be a positive number of GiB, got {budget_gib!r}")
    budget = budget_gib * 2**30
    ratio = vae.config.spatial_compression_ratio
    side = max(latent_shape[-2:]) * ratio
    candidates = list(range(SMALLEST_TILE_PX, side, TILE_STEP_PX)) + [side]
    fitting = [t for t in candidates if decode_peak_bytes(vae, latent_shape, t, dtype)["total"] <= budget]
    if not fitting:
        need = decode_peak_bytes(vae, latent_shape, SMALLEST_TILE_PX, dtype)["total"] / 2**30
        raise HyvInputError("--vae_memory_gb", f"{budget_gib:g} GiB is too little: the smallest tile "
                                               f"({SMALLEST_TILE_PX} px, all {latent_shape[2]} latent frames) needs "
                                               f"about {need:.3g} GiB at this size")
    return max(fitting)

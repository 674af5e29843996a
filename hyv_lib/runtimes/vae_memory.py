"""The VAE decode's peak memory for a spatial tile size, and the largest tile that fits a memory budget."""

from __future__ import annotations

import functools
import json
import math

import torch

from ..base.errors import HyvInputError
from ..models.patches import frame_causal_vae_attention

#: Copies of the decoder's largest activation alive at its peak (a causal convolution's padded input, its output, the
#: residual, the norm's output, ...) and the memory besides the weights, the activations and the decoded video (the
#: decoded tiles waiting to be blended, cuDNN's workspace): fitted by least squares to one H200's peaks, bf16,
#: 720p/121f, tiles of 128, 192, 256 and 384 px: 6.77, 10.75, 16.56 and 33.14 GiB allocated, each within 1.2% of the
#: model; the 320 px decode left out of the fit measured 23.9 GiB, modelled 24.0
#: (benchmarks/results/gpu_check_2026-11-26_H200_run4.json).
LIVE_COPIES = 7.0
WORKSPACE_GIB = 0.41
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


def decode_peak_bytes(vae, latent_shape: tuple[int, ...], tile_px: int | None, dtype: torch.dtype) -> dict[str, float]:
    """The peak device memory (allocated; torch's allocator may reserve more) of ``decode_latents`` for latents of
    ``latent_shape`` [B, C, T, h, w] with square ``tile_px`` tiles (None: one piece), the VAE in ``dtype``: its terms
    in bytes and their ``total``.

    - ``weights``: the whole VAE (encoder too: it moves as one module);
    - ``activations``: :data:`LIVE_COPIES` x the decoder's largest activation on one tile (every tile spans all the
      video's frames: diffusers tiles space only), traced on the meta device;
    - ``video``: the decoded video;
    - ``workspace``: :data:`WORKSPACE_GIB`, the rest (fitted).
    """
    batch, _, frames, h, w = latent_shape
    ratio = vae.config.spatial_compression_ratio
    x = torch.empty((), dtype=dtype).element_size()
    weights = sum(p.numel() for p in vae.parameters()) * x
    tile = max(h, w) if tile_px is None else max(1, tile_px // ratio)
    config = json.dumps({k: v for k, v in vae.config.items() if not k.startswith("_")}, sort_keys=True, default=list)
    largest = _largest_activation_elements(type(vae), config, (batch, latent_shape[1], frames, min(tile, h),
                                                               min(tile, w)))
    out_frames = (frames - 1) * vae.config.temporal_compression_ratio + 1
    video = batch * 3 * out_frames * h * ratio * w * ratio * x
    terms = dict(weights=float(weights), activations=LIVE_COPIES * largest * x, video=float(video),
                 workspace=WORKSPACE_GIB * 2**30)
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

"""The VAE decode's peak memory for a spatial tile size, and the largest tile that fits a memory budget."""

from __future__ import annotations

import math

import torch

from ..base.errors import HyvInputError

#: Tensors of one tile's largest activation, c0 x F x tile_h x tile_w (c0 = the decoder's last width, 128 at real
#: size; F = output frames; a tile spans every frame) alive at the decoder's peak, in a resnet of its last up block:
#: the up block's input, the resnet's input, the first convolution's output, and the norm's fp32 input and quotient
#: (2 + 2); plus its fp32 norm denominator (one channel: 2 / c0 of a copy), which :func:`decode_peak_bytes` adds.
#: Counted from diffusers 0.42.1's code, checked on the CPU by the live tensor bytes of the real class at tiny widths
#: (7.255 measured from the operators' outputs, tests/test_gpu_memory.py) and on one H200 at five tile sizes
#: (tests/test_vae_memory.py).
VAE_TILE_COPIES = 7
#: What torch's allocator holds besides the tensors (cuBLAS's workspace; 0.03-0.04 GiB on the H200,
#: benchmarks/results/gpu_check_2026-11-26_H200_run2.json and run3.json).
DECODE_WORKSPACE = 0.03 * 2**30
#: Tile sizes :func:`tile_for_budget` tries, in pixels (square tiles, multiples of the 16x spatial compression).
TILE_STEP_PX = 64
SMALLEST_TILE_PX = 64


def decode_peak_bytes(vae, latent_shape: tuple[int, ...], tile_px: int | None, dtype: torch.dtype,
                      ranks: int = 1) -> dict[str, float]:
    """Peak allocated device memory of ``decode_latents`` (torch's allocator may reserve more) for one video's latents
    of ``latent_shape`` [1, C, T, h, w], square ``tile_px`` tiles (None: one piece), the VAE (a module: real or on
    the meta device) in ``dtype``, its tiles spread round-robin over ``ranks``
    (:func:`hyv_lib.runtimes.tile_parallel.tile_parallel_decode`). In bytes:

    - ``weights``: the whole VAE (the encoder moves with it); ``latents``;
    - ``decode``: the largest of three phases: decoding (:data:`VAE_TILE_COPIES` + 2 / c0) x c0 x F x tile_h x
      tile_w for a tile, beside the decoded tiles this rank holds by then; blending (every decoded tile, the blended
      rows and the video, 3 x F x H x W); and the uint8 conversion (the video and two fp32 copies of it);
    - ``workspace``: :data:`DECODE_WORKSPACE`; ``total``: their sum.
    """
    _, channels, latent_frames, h, w = latent_shape
    config = vae.config
    ratio, c0 = config.spatial_compression_ratio, config.block_out_channels[0]
    x = torch.empty((), dtype=dtype).element_size()
    frames = (latent_frames - 1) * config.temporal_compression_ratio + 1
    tile = max(h, w) if tile_px is None else max(1, tile_px // ratio)
    stride = max(1, int(tile * (1 - vae.tile_overlap_factor)))
    if h > tile or w > tile:  # diffusers tiles only a frame larger than one tile
        tiles = [(min(tile, h - i) * ratio, min(tile, w - j) * ratio)
                 for i in range(0, h, stride) for j in range(0, w, stride)]
    else:
        tiles = [(h * ratio, w * ratio)]
    video = 3 * frames * h * ratio * w * ratio * x
    done = tile_phase = 0.0
    for index, (th, tw) in enumerate(tiles):
        if index % ranks:  # another rank's tile
            continue
        tile_phase = max(tile_phase, done + (VAE_TILE_COPIES + 2 / c0) * c0 * frames * th * tw * x)
        done += 3 * frames * th * tw * x
    blend_phase = sum(3 * frames * th * tw * x for th, tw in tiles) + 2 * video if len(tiles) > 1 else video
    frames_phase = video + 2 * video * 4 / x
    terms = dict(weights=float(sum(p.numel() for p in vae.parameters()) * x),
                 latents=float(channels * latent_frames * h * w * x),
                 decode=max(tile_phase, blend_phase, frames_phase), workspace=DECODE_WORKSPACE)
    terms["total"] = sum(terms.values())
    return dict(terms, tiles=len(tiles), tile_phase=tile_phase, blend_phase=blend_phase, frames_phase=frames_phase)


def tile_for_budget(vae, latent_shape: tuple[int, ...], budget_gib: float, dtype: torch.dtype) -> int:
    """The largest square tile (pixels, a multiple of :data:`TILE_STEP_PX`; or the whole frame when it fits in one
    piece) whose :func:`decode_peak_bytes` stays within ``budget_gib`` GiB; HyvInputError naming ``vae_memory_gb``
    with the smallest tile's need when none does."""
    if not isinstance(budget_gib, (int, float)) or isinstance(budget_gib, bool) or not budget_gib > 0 \
            or not math.isfinite(budget_gib):
        raise HyvInputError("vae_memory_gb", f"must be a positive number of GiB, got {budget_gib!r}")
    budget = budget_gib * 2**30
    ratio = vae.config.spatial_compression_ratio
    side = max(latent_shape[-2:]) * ratio
    candidates = list(range(SMALLEST_TILE_PX, side, TILE_STEP_PX)) + [side]
    fitting = [t for t in candidates if decode_peak_bytes(vae, latent_shape, t, dtype)["total"] <= budget]
    if not fitting:
        need = decode_peak_bytes(vae, latent_shape, SMALLEST_TILE_PX, dtype)["total"] / 2**30
        raise HyvInputError("vae_memory_gb", f"{budget_gib:g} GiB is too little: the smallest tile "
                                             f"({SMALLEST_TILE_PX} px, all {latent_shape[2]} latent frames) needs "
                                             f"about {need:.3g} GiB at this size")
    return max(fitting)

"""Compile stage 3's VAE decode for a TPU slice on any machine: per-device memory of one tile."""

from __future__ import annotations

from typing import Any

import torch

from ..base.presets import video_size
from ..models.dtypes import torch_dtype
from ..models.families import get_preset
from ..models.patches import loop_free_causal_masks
from ..models.registry import get_adapter
from ..parallel.jax_env import quiet_libtpu
from ..runtimes.vae import latent_tile
from .tpu_compile import available_hbm, topology_devices


def compile_decode(preset: str = "720p_t2v", topology: str = "v6e:2x4", *, height: int | None = None,
                   width: int | None = None, video_length: int | None = None,
                   dtype: str = "bf16") -> dict[str, Any]:
    """Compile the stage-3 decoder for one device of a TPU slice, here (no TPU needed): per-device bytes of the
    largest tile's program (decode runs tile by tile, each tile on one device).

    The VAE is built on the meta device from the preset's config; the tile is diffusers' default spatial tile
    (256 px, so 16 latents at 16x compression) over all latent frames of the video. Returns the compiler's memory
    figures for that program, the chip's usable HBM per device and ``fits``.
    """
    import time

    import jax
    import diffusers
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P
    from torchax.interop import JittableModule, jax_view

    preset = get_preset(preset) if isinstance(preset, str) else preset
    height, width, video_length = video_size(preset, height, width, video_length)
    devices = topology_devices(topology)
    with torch.device("meta"):
        vae = getattr(diffusers, get_adapter(preset.model).vae_class)(**preset.vae)
    vae = torch.nn.Module.to(vae, torch_dtype(dtype)).eval().requires_grad_(False)
    vae.enable_tiling()
    _, c, t, h, w = preset.latent_shape(height, width, video_length)
    tile_h, tile_w = latent_tile(vae)
    tile = (1, c, t, min(h, tile_h), min(w, tile_w))
    mesh = Mesh(devices[:1], ("x",))
    replicated = NamedSharding(mesh, P())
    import torchax
    from torchax.ops.mappings import t2j_dtype

    env = torchax.default_env()
    with env:
        jitted = JittableModule(vae.decoder)
        params = {k: jax.ShapeDtypeStruct(tuple(v.shape), t2j_dtype(v.dtype), sharding=replicated)
                  for k, v in {**jitted.params, **jitted.buffers}.items()}
        x = jax.ShapeDtypeStruct(tile, t2j_dtype(torch_dtype(dtype)), sharding=replicated)

        def decode(weights, latents):
            return jitted.functional_call("forward", weights, {}, latents)

        start = time.perf_counter()
        with quiet_libtpu(), loop_free_causal_masks(vae.decoder):
            compiled = jax.jit(jax_view(decode)).lower(params, x).compile()
        seconds = time.perf_counter() - start
    mem = compiled.memory_analysis()
    parts = {"arguments": mem.argument_size_in_bytes, "temporaries": mem.temp_size_in_bytes,
             "outputs": mem.output_size_in_bytes - mem.alias_size_in_bytes,
             "code": mem.generated_code_size_in_bytes}
    total = sum(parts.values())
    available = available_hbm(devices[0])
    return dict(topology=topology, device_kind=devices[0].device_kind, preset=preset.name, dtype=dtype,
                size=dict(height=height, width=width, video_length=video_length), tile_latents=list(tile),
                tile_pixels=[tile[3] * preset.spatial_compression, tile[4] * preset.spatial_compression],
                per_device_bytes=dict(parts, total=total), hbm_available_per_device=available,
                fits=total <= available, compile_seconds=round(seconds, 1))

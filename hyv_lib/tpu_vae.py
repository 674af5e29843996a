"""Stage 3 on JAX: the VAE decoder jitted through torchax (the TPU on a TPU VM), diffusers' tiling and blending kept."""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch


def block_causal_mask(n_frame: int, n_hw: int, dtype: torch.dtype, device, batch_size: int | None = None):
    """The additive mask of the VAE's mid-block attention (a token sees every token of its own and earlier frames),
    built with one comparison instead of diffusers' Python loop over all ``n_frame * n_hw`` tokens.

    Traced under jit, that loop becomes one slice update per token: 7,936 for a 720p/121-frame decode tile, whose
    TPU compile grew past 17 GB of host memory here and aborted. Same values, same signature as
    ``HunyuanVideo15AttnBlock.prepare_causal_attention_mask`` (diffusers 0.42).
    """
    frame = torch.arange(n_frame * n_hw, device=device) // n_hw
    zero = torch.zeros((), dtype=dtype, device=device)
    minus_inf = torch.full((), float("-inf"), dtype=dtype, device=device)
    mask = torch.where(frame[None, :] <= frame[:, None], zero, minus_inf)
    return mask if batch_size is None else mask.unsqueeze(0).expand(batch_size, -1, -1)


@contextlib.contextmanager
def loop_free_causal_masks(decoder: torch.nn.Module) -> Iterator[None]:
    """While inside, the VAE attention blocks of ``decoder`` build their mask with :func:`block_causal_mask`
    (an attribute on each block instance, removed on exit: the caller's model is left as found)."""
    from diffusers.models.autoencoders.autoencoder_kl_hunyuanvideo15 import HunyuanVideo15AttnBlock

    blocks = [m for m in decoder.modules() if isinstance(m, HunyuanVideo15AttnBlock)]
    for block in blocks:
        block.prepare_causal_attention_mask = block_causal_mask
    try:
        yield
    finally:
        for block in blocks:
            del block.prepare_causal_attention_mask


class JaxDecoder(torch.nn.Module):
    """Stands in for ``vae.decoder``: each call runs the decoder jitted through torchax on JAX's default device.

    diffusers' ``tiled_decode`` cuts the latents into spatial tiles and calls ``vae.decoder`` once per tile, then
    blends the decoded tiles in eager torch; with this in the decoder's place, every tile is decoded by one
    compiled program per tile shape (the edge tiles are smaller: a few programs in all). Tiles come in and go out
    as CPU torch tensors. ``dtype`` (e.g. ``torch.bfloat16``) casts the decoder's weights and inputs on the JAX
    side; the output returns in the input's dtype.
    """

    def __init__(self, decoder: torch.nn.Module, dtype: torch.dtype | None = None):
        import torchax
        from torchax.interop import JittableModule

        super().__init__()
        self.env = torchax.default_env()
        self.dtype = dtype or next(decoder.parameters()).dtype
        self.shapes: set[tuple[int, ...]] = set()  # one compiled program per tile shape
        with self.env:
            self.jitted = JittableModule(decoder)
            for store in ("params", "buffers"):
                setattr(self.jitted, store, {k: v.detach().to("cpu").to(self.dtype).to("jax") if v.is_floating_point()
                                             else v.detach().to("cpu").to("jax")
                                             for k, v in getattr(self.jitted, store).items()})

    @property
    def compilations(self) -> int:
        """How many programs were compiled so far (one per distinct tile shape)."""
        return len(self.shapes)

    def forward(self, tile: torch.Tensor) -> torch.Tensor:
        from .tpu import _to_cpu

        self.shapes.add(tuple(tile.shape))
        with self.env, torch.no_grad(), loop_free_causal_masks(self.jitted):
            out = self.jitted(tile.detach().to("cpu").to(self.dtype).to("jax"))
            return _to_cpu(out).to(tile.dtype)


def decode_on_jax(vae, z: torch.Tensor, dtype: torch.dtype | None = None) -> tuple[torch.Tensor, int]:
    """``vae.decode(z).sample`` (tiled or not, as the VAE is set) with the decoder on JAX; returns the video and
    the number of compiled programs. The caller's VAE keeps its own decoder afterwards."""
    decoder = vae.decoder
    jax_decoder = JaxDecoder(decoder, dtype)
    vae.decoder = jax_decoder
    try:
        return vae.decode(z).sample, jax_decoder.compilations
    finally:
        vae.decoder = decoder


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
    from diffusers import AutoencoderKLHunyuanVideo15
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    from torchax.interop import JittableModule, jax_view

    from .libtpu import quiet_libtpu
    from .models import torch_dtype
    from .presets import get_preset
    from .tpu_compile import _size, available_hbm, topology_devices

    spec = get_preset(preset) if isinstance(preset, str) else preset
    height, width, video_length = _size(spec, height, width, video_length)
    devices = topology_devices(topology)
    with torch.device("meta"):
        vae = AutoencoderKLHunyuanVideo15(**spec.vae)
    vae = torch.nn.Module.to(vae, torch_dtype(dtype)).eval().requires_grad_(False)
    vae.enable_tiling()
    _, c, t, h, w = spec.latent_shape(height, width, video_length)
    tile = (1, c, t, min(h, vae.tile_latent_min_height), min(w, vae.tile_latent_min_width))
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
    return dict(topology=topology, device_kind=devices[0].device_kind, preset=spec.name, dtype=dtype,
                size=dict(height=height, width=width, video_length=video_length), tile_latents=list(tile),
                tile_pixels=[tile[3] * spec.spatial_compression, tile[4] * spec.spatial_compression],
                per_device_bytes=dict(parts, total=total), hbm_available_per_device=available,
                fits=total <= available, compile_seconds=round(seconds, 1))

"""Stage 3 on JAX: the VAE decoder jitted through torchax (the TPU on a TPU VM), diffusers' tiling and blending kept."""

from __future__ import annotations

import warnings

import torch

from ..models.patches import loop_free_causal_masks
from .jax_step import to_cpu


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
        """How many programs were compiled so far (one per distinct tile shape, and per cache present or not)."""
        return len(self.shapes)

    def forward(self, tile: torch.Tensor, **kwargs):
        """The decoded tile as a CPU tensor in ``tile``'s dtype. Keyword arguments pass through to the decoder:
        CogVideoX's ``conv_cache`` (the causal convolutions' last frames of the previous chunk, a nested dict of
        tensors, None for the first chunk), which its decoder returns beside the frames. That cache stays on JAX's
        device between calls; a call with one and a call without are two programs."""
        self.shapes.add((tuple(tile.shape), *sorted(k for k, v in kwargs.items() if v is not None)))
        with self.env, torch.no_grad(), loop_free_causal_masks(self.jitted), warnings.catch_warnings():
            # torch's nearest-upsampling decomposition (CogVideoX's decoder) asks for int64 pixel indices, which JAX
            # makes int32 (x64 is off): exact for any frame size
            warnings.filterwarnings("ignore", message="Explicitly requested dtype int64", category=UserWarning)
            out = self.jitted(tile.detach().to("cpu").to(self.dtype).to("jax"), **kwargs)
            if isinstance(out, tuple):  # CogVideoX: (frames, conv_cache)
                return (to_cpu(out[0]).to(tile.dtype), *out[1:])
            return to_cpu(out).to(tile.dtype)


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

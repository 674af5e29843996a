"""The one path from a loaded transformer to frames that every entry point runs: the transformer made ready (LoRA
merged, placed or sharded, its step built), the denoising loop around it, and the VAE decode of its latents."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..base.errors import HyvInputError
from ..base.presets import Preset
from ..kernels.dispatch import kernel_record
from ..models.dtypes import torch_dtype
from ..models.lora import LoraWeights, ensure_merged
from ..parallel.distributed import local_device
from ..runtimes.fsdp import shard_weights, sharded_step
from ..runtimes.names import TORCH_RUNTIMES
from ..runtimes.placement import place_transformer, while_denoising
from ..runtimes.step import TransformerStep, make_step
from ..runtimes.vae import decode_latents
from ..runtimes.vae_memory import tile_for_budget
from .sampling import sample_latents
from .settings import ResolvedSettings
from .stage_io import STAGE2_FILE

@dataclass
class Denoiser:
    """A transformer ready to denoise with resolved settings: what :meth:`prepare` did to it, and its step."""

    transformer: Any
    #: The denoising step (a runtime's, or the caller's).
    step: TransformerStep
    #: Where the transformer runs: this rank's GPU for the torch runtimes when CUDA is available, else the host.
    device: torch.device
    #: ``block``, ``model`` or None (:data:`hyv_lib.runtimes.placement.OFFLOAD_MODES`).
    offload: str | None
    #: The merged LoRA's weights (None without one): their record goes into generation_config.json.
    lora: LoraWeights | None
    #: generation_config.json's ``attention_kernel`` (the backend ``auto`` chose, SDPA's own kernel choice); None
    #: for the JAX runtime or a step the caller supplied.
    attention_kernel: dict | None

    @classmethod
    def prepare(cls, transformer, settings: ResolvedSettings, *, step: TransformerStep | None = None,
                cache: Any = None) -> "Denoiser":
        """Merge ``settings.lora`` into the weights (before they are placed, sharded or traced; a kept transformer
        holding that merge already is left alone), then shard the weights over the torchrun ranks
        (``shard_weights``) or place them (this rank's GPU, block streaming or the host: ``offload``), then build the
        runtime's step with the attention backend and ``cache`` (a DeepCache or MagCache schedule, or None). A given
        ``step`` is used as it is (then a LoRA that is not merged yet is an error: the step was built before it)."""
        lora = ensure_merged(transformer, settings.lora, settings.lora_scale, can_merge=step is None)
        device = local_device() if settings.runtime in TORCH_RUNTIMES else torch.device("cpu")
        if settings.shard_weights:  # 1/N of the weights to this rank's device, cut block by block (kept: once)
            shard_weights(transformer, settings.shard_weights)
        else:  # on the GPU (a no-op when a kept model is already there), streamed block by block, or on the host
            place_transformer(transformer, device, settings.offload)
        kernel = None
        if step is None:
            # no --mesh: the step lays every device out itself at its first call (the layout the settings recorded)
            mesh = None if settings.mesh_source == "default" else settings.mesh
            step = make_step(transformer, settings.runtime, mesh, settings.sharding, cache=cache,
                             no_cache_blocks=settings.no_cache_blocks, attention=settings.attention,
                             attention_options=settings.attention_options(), compile=settings.compile)
            if settings.shard_weights:  # each step one forward of the sharded root
                step = sharded_step(step, transformer)
            if settings.runtime in TORCH_RUNTIMES:
                kernel = kernel_record(settings.attention, device, next(transformer.parameters()).dtype,
                                       getattr(transformer.config, "attention_head_dim", None))
        return cls(transformer, step, device, settings.offload, lora, kernel)

    def denoise(self, scheduler_config, preset: Preset, embeds: dict[str, torch.Tensor], settings: ResolvedSettings,
                *, step: TransformerStep | None = None, progress: bool = True) -> torch.Tensor:
        """Seeded noise denoised by the preset's family (:func:`hyv_lib.pipeline.sampling.sample_latents`) with
        ``step`` (None: :attr:`step`), the transformer on its device for the loop only when ``offload="model"``;
        fp32 latents on the host."""
        with while_denoising(self.transformer, self.device, self.offload):
            return sample_latents(step or self.step, self.transformer, scheduler_config, preset, embeds, settings,
                                  progress=progress, device=self.device)


def decode_video(vae, latents: torch.Tensor, *, runtime: str = "torch", vae_dtype: str = "fp32", tiling: bool = True,
                 memory_gb: float | None = None, tile_parallel: bool = False,
                 argument: str = "latents") -> tuple[torch.Tensor, int | None]:
    """``latents`` in the VAE's layout (:meth:`hyv_lib.models.family.ModelFamily.vae_latents`) decoded to uint8 frames [F, H, W, 3], and the tile size
    a ``memory_gb`` budget chose (None without one): :func:`hyv_lib.runtimes.vae.decode_latents` in ``vae_dtype`` on
    this rank's GPU if any (``runtime="torch"``) or on JAX's device (``jax``), tiles spread over the torchrun ranks
    with ``tile_parallel``. Latents with other channels than the VAE's are a HyvInputError naming ``argument``."""
    if latents.shape[1] != vae.config.latent_channels:
        raise HyvInputError(argument, f"{STAGE2_FILE}: latents have {latents.shape[1]} channels but the VAE expects "
                                      f"{vae.config.latent_channels}")
    dtype = torch_dtype(vae_dtype)
    tile_px = None if memory_gb is None else tile_for_budget(vae, tuple(latents.shape), memory_gb, dtype)
    # torch: this rank's GPU if any (nccl's tile exchange needs GPU tensors), else the host
    frames = decode_latents(vae, latents, tiling=tiling, tile_parallel=tile_parallel, runtime=runtime, dtype=dtype,
                            device=local_device() if runtime == "torch" else None, tile_px=tile_px)
    return frames, tile_px

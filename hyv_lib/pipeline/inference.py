"""In memory: load the models once, then generate videos as frames (the stages' work without their files)."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ..base.errors import HyvInputError
from ..base.files import ensure_output_dir
from ..base.presets import DEFAULT_SEED, Preset
from ..models.components import load_components, pipeline_components, quiet_loading
from ..models.devices import keep_on_device
from ..models.dtypes import DTYPES, torch_dtype
from ..models.families import family_for, get_preset
from ..models.folder import choose_preset
from ..parallel.sharding import DEFAULT_STRATEGY
from ..runtimes.fsdp import under_torchrun
from ..runtimes.names import VAE_RUNTIMES, runtime_choices, runtime_name, vae_runtime_for
from ..runtimes.step import cached_step
from .denoiser import Denoiser, decode_video
from .encoder_device import ENCODERS, resolve_text_device
from .image import check_task, first_frame
from .settings import ResolvedSettings, Stage2Settings, check_vae_model, check_vae_settings, resolve_settings
from .text import encode_pair
from .video_io import check_fps, check_mp4_path, write_mp4


@dataclass
class Video:
    """One generated video: ``frames`` uint8 [F, H, W, 3], ``latents`` fp32 (what stage 2 writes: [1, C, T, h, w];
    CogVideoX's [1, T', C, h, w] with its padded frames) and ``config`` (what generation_config.json would hold)."""

    frames: np.ndarray
    latents: torch.Tensor
    config: dict[str, Any] = field(default_factory=dict)

    def save(self, path: str, fps: float | None = None) -> str:
        """Write the frames as an H.264 mp4 at ``fps`` (default: the preset's), atomically; returns the path written
        (``~`` expanded to the home folder, as a shell would)."""
        check_mp4_path(path)
        path = os.path.expanduser(os.fspath(path))  # "~/x.mp4" made a folder named "~" in the working directory
        fps = check_fps(self.config.get("fps") if fps is None else fps, "fps")
        if fps is None:
            raise HyvInputError("fps", "give the frames per second: this video's config has no fps")
        ensure_output_dir(os.path.dirname(os.path.abspath(path)), "path")
        write_mp4(self.frames, path, fps)
        return path


class VideoPipeline:
    """Text encoders, transformer step and VAE kept in memory: each :meth:`generate` runs the three stages on
    them and returns a :class:`Video` (nothing is written unless :meth:`Video.save` is called).

    Made by :func:`load_pipeline`, or from already-loaded ``components`` (the names of
    :func:`hyv_lib.models.components.load_components`: tokenizer, text_encoder, tokenizer_2, text_encoder_2, transformer,
    scheduler, vae). The transformer step is built once (``runtime``, ``mesh``, ``sharding``, ``attention`` as for
    :func:`hyv_lib.runtimes.step.make_step`, which installs hyv_lib's attention on the transformer in place) and reused
    by every call, so on the jax runtime only the first video of each size compiles. ``vae_runtime`` (default: jax
    with the jax runtime, else torch) and ``vae_dtype`` as for :func:`hyv_lib.pipeline.stages.stage3`. ``offload``
    (torch runtime): ``block``, the transformer's weights stay on the host and stream to the GPU block by block;
    ``model``, the transformer is on the GPU while it denoises and on the host while the VAE decodes.
    ``shard_weights="fsdp"`` (under torchrun, runtime ulysses or torch): each rank keeps 1/N of the transformer's
    weights (:func:`hyv_lib.runtimes.fsdp.shard_weights`); with ``runtime="ulysses"`` (under torchrun only) each rank
    denoises its part of the sequence. Every rank calls :meth:`generate` with the same arguments and gets the same
    video.
    ``vae_memory_gb`` (GiB): decode with the largest tiles that fit (see :func:`hyv_lib.pipeline.stages.stage3`).
    ``text_device`` (``auto``: this process's GPU when CUDA is available, else the host CPU; the host CPU with the jax
    runtime; see :func:`hyv_lib.pipeline.encoder_device.resolve_text_device`): where the encoders of stage 1 run.
    Without ``offload`` or ``shard_weights`` they move there once and stay, next to the transformer (Qwen2.5-VL-7B's
    language model: 7.07B parameters, 13.2 GiB in bf16); with either (GPU memory tight) they stay on the host and each goes to the device for its own call
    only, one at a time, and back right after, before the transformer denoises. The VAE that encodes a first frame
    goes back to the host after each call either way (stage 3 places it for its decode).
    ``compile=True`` (torch or ulysses runtime): the transformer's blocks are torch.compiled in place
    (:func:`hyv_lib.runtimes.compiled.compile_blocks`); the first video of each size and frame count compiles them, in
    an untimed warm-up call before its first step.

    Calls of :meth:`generate` on one pipeline run one at a time (a lock; other threads wait): they share the models,
    and a DeepCache or MagCache step keeps its cached features on the shared transformer, an offloaded transformer
    moves between devices, the VAE decode patches the shared VAE: two at once would corrupt each other's videos.
    For videos in parallel, load one pipeline per device or process.

    ``settings``: these arguments already resolved (:func:`hyv_lib.pipeline.settings.resolve_settings`), as
    :func:`load_pipeline` hands them over, so they are not resolved a second time.
    """

    def __init__(self, preset: str | Preset, components: dict[str, Any], *, runtime: str = "torch",
                 mesh: str | None = None, sharding: str = DEFAULT_STRATEGY, attention: str | None = None,
                 sparse_attn: bool = False, ssta: Any = None, vae_runtime: str | None = None, vae_dtype: str = "fp32", tiling: bool = True,
                 model_path: str | None = None, offload: str | None = None, vae_memory_gb: float | None = None,
                 shard_weights: str | None = None, lora: str | None = None, lora_scale: float = 1.0,
                 compile: bool = False, text_device: str | torch.device | None = "auto",
                 settings: ResolvedSettings | None = None):
        self.preset = get_preset(preset)
        #: where stage 1's encoders run (:func:`hyv_lib.pipeline.encoder_device.resolve_text_device`)
        self.text_device = resolve_text_device(text_device, runtime)
        if not isinstance(components, dict):
            raise HyvInputError("components", f"must be a dict of loaded components, got {type(components).__name__}")
        first_frame = family_for(self.preset).first_frame_components  # only where the preset needs an image
        needed = [name for name in pipeline_components(self.preset)
                  if name not in first_frame or "t2v" not in self.preset.tasks]
        missing = [name for name in needed if name not in components]
        if missing:
            raise HyvInputError("components", f"missing {', '.join(missing)} (hyv_lib.load_pipeline loads them all)")
        run_settings = settings or resolve_settings(self.preset, runtime=runtime, mesh=mesh, sharding=sharding,
                                                    attention=attention, sparse_attn=sparse_attn, ssta=ssta,
                                                    offload=offload, shard_weights=shard_weights, lora=lora,
                                                    lora_scale=lora_scale, compile=compile)
        if runtime == "ulysses" and not under_torchrun():
            raise HyvInputError("runtime", "an in-memory pipeline runs with torch or jax, or with ulysses in "
                                           "each process of a torchrun launch (one per device)")
        runtime = runtime_name(runtime)
        vae_runtime = runtime_name(vae_runtime) or vae_runtime_for(runtime)
        if vae_runtime not in VAE_RUNTIMES:
            raise HyvInputError("vae_runtime", f"must be {runtime_choices(VAE_RUNTIMES)}, got {vae_runtime!r}")
        self.vae_memory_gb = check_vae_settings(vae_dtype, vae_memory_gb, tiling, vae_runtime)
        check_vae_model(self.preset, self.vae_memory_gb)
        self.components = components
        self.lock = threading.Lock()  # held by each generate call (see the class docstring)
        self.model_path = model_path
        self.runtime, self.mesh, self.sharding = runtime, mesh, sharding
        #: the attention backend (the preset's when none was given) and SSTA's options (a dict, or None)
        self.attention, self.ssta = run_settings.attention, run_settings.ssta
        self.offload, self.shard_weights = offload, shard_weights
        self.compile = compile
        self.vae_runtime, self.vae_dtype, self.tiling = vae_runtime, vae_dtype, tiling
        # the LoRA merged before the weights are placed, sharded or traced: no work per step
        self.denoiser = Denoiser.prepare(components["transformer"], run_settings)
        self.device, self.step = self.denoiser.device, self.denoiser.step
        lora = self.denoiser.lora
        #: generation_config.json's LoRA fields (path, sha256, scale, rank); empty without a LoRA
        self.lora_record = {} if lora is None else lora.record(run_settings.lora_scale)
        #: generation_config.json's ``attention_kernel``: the backend ``auto`` picked and SDPA's own kernel choice
        self.attention_kernel = self.denoiser.attention_kernel
        #: the encoders stay on ``text_device`` between calls (nothing offloaded or sharded), else each visits it
        self.encoders_resident = offload is None and shard_weights is None and self.text_device.type != "cpu"
        if self.encoders_resident:
            keep_on_device([components[name] for name in ENCODERS if name in components], self.text_device)

    @property
    def dtype(self) -> str:
        """The transformer's dtype as the CLI spells it (fp32, bf16, fp16)."""
        param_dtype = next(self.components["transformer"].parameters()).dtype
        return next(name for name, value in DTYPES.items() if value == param_dtype)

    @property
    def compilations(self) -> int | None:
        """Compilations of the transformer step so far (jax runtime), else None."""
        return getattr(self.step, "compilations", None)

    def step_for(self, cache, no_cache_blocks: int):
        """The uncached step, or (``cache``: a :class:`hyv_lib.runtimes.deepcache.DeepCacheSchedule` or an adaptive
        :class:`hyv_lib.runtimes.magcache.MagCacheSchedule`) a DeepCache step around the same runtime that recomputes
        ``no_cache_blocks`` blocks on cached steps (the jax programs are shared; over sharded weights each call is
        still one forward of the sharded root: :func:`hyv_lib.runtimes.step.cached_step`)."""
        if cache is None:
            return self.step
        return cached_step(self.step, self.components["transformer"], cache, no_cache_blocks)

    def encode(self, prompt: str, negative_prompt: str = "", image=None) -> dict[str, torch.Tensor]:
        """Stage 1 in memory: the stage-1 tensors of ``prompt`` and ``negative_prompt`` (and of ``image``, a first
        frame already cropped to its bucket: :func:`hyv_lib.pipeline.image.crop_to_bucket`)."""
        for name, value in (("prompt", prompt), ("negative_prompt", negative_prompt)):
            if not isinstance(value, str):
                raise HyvInputError(name, f"must be a string, got {type(value).__name__}")
        with torch.no_grad():
            return encode_pair(self.components, self.preset, prompt, negative_prompt, self.dtype, image, "image",
                               device=self.text_device)

    @torch.no_grad()
    def generate(self, prompt: str, negative_prompt: str = "", height: int | None = None, width: int | None = None,
                 aspect_ratio: str = Stage2Settings.aspect_ratio,
                 video_length: int | None = None, num_inference_steps: int | None = None,
                 guidance_scale: float | None = None, flow_shift: float | None = None, seed: int = DEFAULT_SEED,
                 cache=None, no_cache_blocks: int = 1, progress: bool = True, image=None) -> Video:
        """One video from ``prompt``. Each None setting takes the preset's default; ``cache`` is a
        :class:`hyv_lib.runtimes.deepcache.DeepCacheSchedule`, an adaptive :class:`hyv_lib.runtimes.magcache.MagCacheSchedule`
        (e.g. :func:`hyv_lib.pipeline.calibration.magcache_schedule`) or None (``no_cache_blocks`` recomputed on cached
        steps).
        ``image`` (a PIL image or the path of a PNG/JPEG): the first frame of an image-to-video run; its bucket sets
        the height and width. ``aspect_ratio`` (W:H) picks the preset's bucket when ``height`` and ``width`` are not
        given, as ``--aspect_ratio`` does. Every setting is checked before any model runs. One call at a time runs
        on a pipeline: a second thread's call waits for the first to finish."""
        with self.lock:
            return self._generate(prompt, negative_prompt, height, width, aspect_ratio, video_length,
                                  num_inference_steps, guidance_scale, flow_shift, seed, cache, no_cache_blocks,
                                  progress, image)

    def _generate(self, prompt, negative_prompt, height, width, aspect_ratio, video_length, num_inference_steps,
                  guidance_scale, flow_shift, seed, cache, no_cache_blocks, progress, image) -> Video:
        """:meth:`generate`'s work, under the pipeline's lock."""
        start = time.perf_counter()
        task = check_task(self.preset, image is not None, argument="image")
        if image is not None:
            fixed, image = first_frame(self.preset, image, Stage2Settings(height=height, width=width), "image")
            height, width = fixed.height, fixed.width
        settings = resolve_settings(
            self.preset, aspect_ratio=aspect_ratio, height=height, width=width, video_length=video_length,
            num_inference_steps=num_inference_steps, guidance_scale=guidance_scale, flow_shift=flow_shift,
            seed=seed, runtime=self.runtime, mesh=self.mesh, sharding=self.sharding, attention=self.attention,
            ssta=self.ssta, offload=self.offload, shard_weights=self.shard_weights, compile=self.compile)
        step = self.step_for(cache, no_cache_blocks)
        if cache is not None and cache.num_steps != settings.num_inference_steps:
            raise HyvInputError("cache", f"the schedule has {cache.num_steps} steps but num_inference_steps is "
                                         f"{settings.num_inference_steps}")
        calibrated = getattr(cache, "calibration", None) or {}
        for name, mine in (("preset", self.preset.name), ("flow_shift", settings.flow_shift),
                           ("no_cache_blocks", no_cache_blocks)):
            if name in calibrated and calibrated[name] != mine:
                raise HyvInputError("cache", f"the magcache schedule was calibrated with {name} {calibrated[name]!r} "
                                             f"but this video has {mine!r}")
        encode_start = time.perf_counter()
        embeds = self.encode(prompt, negative_prompt, image)  # on the host; the encoders off the GPU unless resident
        encode_s = time.perf_counter() - encode_start
        denoise_start = time.perf_counter()
        latents = self.denoiser.denoise(self.components["scheduler"].config, self.preset, embeds, settings, step=step,
                                        progress=progress)
        denoise_s = time.perf_counter() - denoise_start
        # torch: on this process's GPU if any, in vae_dtype, and the VAE put back after (image conditioning shares it)
        decoded = family_for(self.preset).vae_latents(self.preset, latents, settings.video_length)  # VAE layout
        frames, tile_px = decode_video(self.components["vae"], decoded, runtime=self.vae_runtime,
                                       vae_dtype=self.vae_dtype, tiling=self.tiling, memory_gb=self.vae_memory_gb)
        frames = family_for(self.preset).video_frames(self.preset, frames)  # the frames its pipeline returns
        config = dict(prompt=prompt, negative_prompt=negative_prompt, preset=self.preset.name, task=task,
                      model_path=self.model_path, dtype=self.dtype, **settings.config(), fps=self.preset.fps,
                      stage3_runtime=self.vae_runtime, vae_dtype=self.vae_dtype, vae_tiling=self.tiling,
                      **self.lora_record,
                      **({} if tile_px is None else dict(vae_memory_gb=self.vae_memory_gb, vae_tile_px=tile_px)),
                      time_s=round(time.perf_counter() - start, 3), stage1_device=str(self.text_device),
                      stage1_encode_time_s=round(encode_s, 3), denoise_time_s=round(denoise_s, 3),
                      **({} if self.attention_kernel is None else {"attention_kernel": self.attention_kernel}))
        if cache is not None:
            config.update(enable_cache=True, **cache.settings(), no_cache_blocks=no_cache_blocks,
                          cache_full_steps=step.full_calls, cache_cached_steps=step.cached_calls,
                          cache_skipped_steps=list(step.skipped_steps))
        return Video(frames=frames.numpy(), latents=latents, config=config)


def load_pipeline(preset: str | Preset | None = None, model_path: str | None = None, dtype: str | None = None,
                  runtime: str = "torch", mesh: str | None = None, attention: str | None = None,
                  sparse_attn: bool = False, ssta: Any = None, sharding: str = DEFAULT_STRATEGY, vae_runtime: str | None = None, vae_dtype: str = "fp32",
                  tiling: bool = True, progress: bool = True, offload: str | None = None,
                  vae_memory_gb: float | None = None, shard_weights: str | None = None, lora: str | None = None,
                  lora_scale: float = 1.0, compile: bool = False,
                  text_device: str | torch.device | None = "auto",
                  settings: ResolvedSettings | None = None) -> VideoPipeline:
    """Load every component of ``preset`` once (``model_path``: a diffusers-format folder; None: the preset's
    bundled or in-code tiny weights; ``preset=None`` with a folder: the preset its configs say, see
    :func:`hyv_lib.models.folder.choose_preset`, and a preset that contradicts the folder is refused) in ``dtype``
    (default: the preset's) and return a :class:`VideoPipeline`.

    ``progress=False`` also silences the weight-loading bars; ``offload`` (``block`` or ``model``) keeps the transformer
    off the GPU when it is not needed there; ``shard_weights="fsdp"`` (in each process of a torchrun launch) splits its
    weights over the ranks (see :class:`VideoPipeline`). ``lora``: a LoRA file in diffusers' format (or its folder),
    merged at ``lora_scale`` into the transformer's weights before the step is built, on every runtime
    (:func:`hyv_lib.models.lora.merge_lora`); a LoRA for another model or other shapes is refused. ``attention``
    (None: the preset's, ``ssta`` for the sparse 720p checkpoints), ``sparse_attn`` and ``ssta`` (a
    :class:`hyv_lib.SstaConfig`) as for :func:`hyv_lib.pipeline.stages.stage2`. ``compile=True``: torch.compile the
    transformer's blocks (torch or ulysses runtime; see :class:`VideoPipeline`). ``text_device``: where the encoders
    run (``auto``: the GPU when CUDA is available; resident there unless ``offload`` or ``shard_weights``; see
    :class:`VideoPipeline`). ``settings``: these arguments already resolved by the caller
    (:class:`hyv_lib.pipeline.batch.BatchRunner`), checked once only. Example::

        pipe = hyv_lib.load_pipeline("tiny_trained")
        video = pipe.generate("a red circle moving left on a gray background", seed=1)
        video.save("circle.mp4")
    """
    preset = choose_preset(preset, model_path).preset  # None: the folder's configs say which (or the default)
    dtype = dtype or preset.default_dtype
    torch_dtype(dtype)

    settings = settings or resolve_settings(preset, runtime=runtime, mesh=mesh, sharding=sharding,
                                            attention=attention, sparse_attn=sparse_attn, ssta=ssta, offload=offload,
                                            shard_weights=shard_weights, lora=lora, lora_scale=lora_scale,
                                            compile=compile)  # before any model loads
    resolve_text_device(text_device, runtime)
    context = contextlib.nullcontext() if progress else quiet_loading()
    with context:
        components = load_components(preset, model_path, pipeline_components(preset), dtype=dtype)
    return VideoPipeline(preset, components, runtime=runtime, mesh=mesh, sharding=sharding, attention=attention,
                         sparse_attn=sparse_attn, ssta=ssta,
                         vae_runtime=vae_runtime, vae_dtype=vae_dtype, tiling=tiling, model_path=model_path,
                         vae_memory_gb=vae_memory_gb,
                         offload=offload, shard_weights=shard_weights, lora=lora, lora_scale=lora_scale,
                         compile=compile, text_device=text_device, settings=settings)

"""The three stages (text -> embeddings -> latents -> video), the denoising loop and input validation."""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any, Protocol

import numpy as np
import torch

from . import __version__
from .errors import HyvInputError, python_names
from .memory import PeakMemory
from .models import load_components, torch_dtype
from .presets import Preset, bucket_size, get_preset
from .stage_io import (
    CONFIG_FILE, FRAMES_FILE, STAGE1_FILE, STAGE2_FILE, VIDEO_FILE, ensure_output_dir, load_stage1, load_stage2,
    read_config, save_tensors, update_config,
)
from .video import check_mp4_path

class TransformerStep(Protocol):
    """A transformer step: called with the keyword arguments of HunyuanVideo15Transformer3DModel.forward
    (hidden_states, timestep, encoder_hidden_states, ...), returns the noise prediction tensor. Every runtime (eager
    torch, JAX jit, sharded, cached) implements this one interface; the loop never branches on platform.

    Optional, looked up with ``hasattr``: ``reset()``, which :func:`denoise` calls before the first step (after any
    warmup calls), and ``full_calls`` / ``cached_calls``, counts that :func:`stage2` records in
    generation_config.json when the cache is on (:class:`hyv_lib.cache.DeepCacheStep` has all three).
    """

    def __call__(self, **forward_kwargs: Any) -> torch.Tensor: ...


def torch_step(transformer) -> TransformerStep:
    """The eager-torch transformer step: diffusers' own forward (the oracle)."""

    def step(**kwargs) -> torch.Tensor:
        return transformer(**kwargs, return_dict=False)[0]

    return step


#: The step caches (``--cache_method``): DeepCache's fixed schedule, or the adaptive MagCache-style one
#: (:mod:`hyv_lib.adaptive_cache`). Both run DeepCache's full and cached programs.
CACHE_METHODS = ("deepcache", "magcache")
#: The transformer runtimes (``--runtime``): eager diffusers, torchax/JAX jit (TPU), Ulysses sequence parallel.
RUNTIMES = ("torch", "tpu", "ulysses")
#: ``--attention`` values besides hyv_lib's backends (:data:`hyv_lib.attention.BACKENDS`): ``auto`` (the best exact
#: backend for the runtime's tensors) and ``diffusers`` (diffusers' stock processor, which builds a dense
#: [B, 1, S, S] mask: the oracle, torch runtime only).
ATTENTION_CHOICES = ("auto", "diffusers")


def parse_mesh(text: str | None) -> dict[str, int] | None:
    """'data=2,tensor=4' -> {'data': 2, 'tensor': 4}; None or '' -> None (one device)."""
    if text is None or text == "":
        return None
    if not isinstance(text, str):
        raise HyvInputError("--mesh", f"must be a string such as 'tensor=8' or 'data=2,tensor=4', got "
                                      f"{type(text).__name__} {text!r}")
    from .sharding import AXES

    axes = {}
    for part in text.split(","):
        name, _, value = part.partition("=")
        if name.strip() not in AXES or not value.strip().isdigit() or int(value) < 1:
            raise HyvInputError("--mesh", f"must be comma-separated AXIS=SIZE with AXIS in {', '.join(AXES)} "
                                          f"(e.g. tensor=8 or data=2,tensor=4), got {text!r}")
        axes[name.strip()] = int(value)
    return axes


def make_step(transformer, runtime: str = "torch", mesh: str | None = None,
              sharding: str = "tp_replicated_out", cache=None, uncached_blocks: int = 1,
              attention: str = "auto") -> TransformerStep:
    """The transformer step of a runtime: ``torch`` (eager diffusers), ``tpu`` (torchax/JAX jit on
    whatever JAX backend is present: the TPU on a TPU VM, the CPU here; JAX's persistent compile cache is the
    caller's choice, :func:`hyv_lib.tpu.enable_compile_cache`, which the CLI turns on) or
    ``ulysses`` (sequence parallel over the torchrun processes: nccl on GPUs, gloo on CPU).

    ``attention``: every runtime installs hyv_lib's exact masked attention on ``transformer`` (in place): ``auto``
    picks flash varlen on CUDA when installed, else SDPA on each sample's valid tokens (Splash or XLA under the tpu
    runtime); a name of :data:`hyv_lib.attention.BACKENDS` forces one. ``diffusers`` keeps diffusers' own processor
    on the torch runtime (the oracle: it builds a dense [B, 1, S, S] mask, 24 GiB at 720p/121f for the CFG batch).
    The step reads the model's device and dtype when it runs, not when it is built.
    ``mesh`` ('tensor=8', 'data=2,tensor=4', ...) shards the tpu step with the rule set ``sharding``.
    ``cache`` (a :class:`hyv_lib.cache.DeepCacheSchedule`, or the adaptive
    :class:`hyv_lib.adaptive_cache.MagCacheSchedule`) wraps the torch or tpu step in DeepCache, recomputing the last
    ``uncached_blocks`` blocks on cached steps.
    """
    if attention == "diffusers" and runtime != "torch":
        raise HyvInputError("--attention", f"diffusers' own processor runs on --runtime torch only, not {runtime!r}")
    if cache is not None:
        from .cache import DeepCacheStep, TorchDeepCache

        if runtime not in ("torch", "tpu"):
            raise HyvInputError("--enable_cache", f"DeepCache runs on --runtime torch or tpu, not {runtime!r}")
        if runtime == "torch":
            _install_attention(transformer, attention)
            runtime_impl = TorchDeepCache(transformer)
        else:
            runtime_impl = make_step(transformer, runtime, mesh, sharding, attention=attention)
        try:
            return DeepCacheStep(runtime_impl, cache, uncached_blocks)
        except ValueError as err:
            raise HyvInputError("--no_cache_blocks", str(err)) from None
    if runtime == "torch":
        _install_attention(transformer, attention)
        return torch_step(transformer)
    if runtime == "tpu":
        from .sharding import make_mesh
        from .tpu import TpuTransformer

        axes = parse_mesh(mesh)
        if axes is None:
            return TpuTransformer(transformer, attention=attention)
        try:
            device_mesh = make_mesh(**axes)
            return TpuTransformer(transformer, mesh=device_mesh, sharding=sharding, attention=attention)
        except ValueError as err:  # device count, head or batch splits
            raise HyvInputError("--mesh", str(err)) from None
    if runtime == "ulysses":
        from .parallel import UlyssesTransformer, init_distributed

        if "RANK" not in os.environ and not torch.distributed.is_initialized():
            raise HyvInputError("--runtime", "ulysses runs one process per device under torchrun: "
                                             "torchrun --nproc_per_node=N -m hyv_lib stage2 --runtime ulysses ...")
        init_distributed()
        try:
            return UlyssesTransformer(transformer, attention_backend=attention)
        except ValueError as err:  # heads that do not split over the ranks
            raise HyvInputError("--nproc_per_node", str(err)) from None
    raise HyvInputError("--runtime", f"must be one of {', '.join(RUNTIMES)}, got {runtime!r}")


def _install_attention(transformer, attention: str) -> None:
    """hyv_lib's exact attention on a model for the torch runtime, unless ``diffusers`` keeps the stock one."""
    if attention != "diffusers":
        from .attention import use_attention

        use_attention(transformer, attention)


def check_attention(attention: str, runtime: str) -> None:
    """``--attention`` against what this machine can run, for ``runtime`` (HyvInputError naming the flag)."""
    from .attention import BACKENDS, JAX_BACKENDS, available_backends

    valid = (*ATTENTION_CHOICES, *BACKENDS)
    if attention not in valid:
        raise HyvInputError("--attention", f"must be one of {', '.join(valid)}, got {attention!r}")
    if attention == "diffusers" and runtime != "torch":
        raise HyvInputError("--attention", f"diffusers' own processor runs on --runtime torch only, not {runtime!r}")
    if runtime == "tpu" and attention not in ("auto", *JAX_BACKENDS):
        raise HyvInputError("--attention", f"--runtime tpu runs JAX kernels: auto, {', '.join(JAX_BACKENDS)}; "
                                           f"got {attention!r}")
    reason = available_backends().get(attention) if attention not in ATTENTION_CHOICES else None
    if reason is not None:
        raise HyvInputError("--attention", f"{attention!r} cannot run here: {reason}")


def _rank() -> int:
    """This process's rank under torch.distributed (0 when not distributed): only rank 0 writes files."""
    return torch.distributed.get_rank() if torch.distributed.is_initialized() else 0


# ----------------------------------------------------------------------------------------------- validation
def _check_type(name: str, value: Any, kind: type) -> None:
    """HyvInputError unless ``value`` is None or of ``kind`` (an int for int; an int or float for float; never a
    bool or a string): '720' or 33.0 would otherwise fail deep inside, or flow into float shapes."""
    valid = (int, float) if kind is float else (int,)
    if value is None or (isinstance(value, valid) and not isinstance(value, bool)):
        return
    import numbers

    if kind is int and isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return  # numpy integers
    if kind is float and isinstance(value, numbers.Real) and not isinstance(value, bool):
        return
    raise HyvInputError(name, f"must be {'an integer' if kind is int else 'a number'}, "
                              f"got {type(value).__name__} {value!r}")


@dataclasses.dataclass(frozen=True)
class Stage2Settings:
    """Every stage-2 setting, with its default: the one list that :func:`stage2`, :func:`generate`,
    :class:`hyv_lib.batch.Pipeline` and the CLI's stage-2 flags (same names) share. None takes the preset's value;
    :func:`resolve_settings` checks types and ranges."""

    aspect_ratio: str = "16:9"  #: W:H bucket used when height and width are not given
    height: int | None = None
    width: int | None = None
    video_length: int | None = None  #: frames, 4n+1
    num_inference_steps: int | None = None
    guidance_scale: float | None = None
    flow_shift: float | None = None
    seed: int = 42
    warmup_steps: int = 0  #: untimed calls before the loop (they do not touch the scheduler)
    runtime: str = "torch"  #: one of :data:`RUNTIMES`
    mesh: str | None = None  #: tpu runtime: e.g. ``data=2,tensor=4``
    sharding: str = "tp_replicated_out"  #: a rule set of :data:`hyv_lib.sharding.RULE_SETS`
    enable_cache: bool = False  #: DeepCache (torch and tpu runtimes)
    cache_method: str | None = None  #: ``deepcache`` (the default with enable_cache) or ``magcache`` (adaptive)
    cache_start_step: int = 11
    cache_end_step: int = 45
    cache_step_interval: int = 4
    no_cache_blocks: int = 1  #: trailing blocks recomputed on cached steps
    cache_threshold: float | None = None  #: magcache: skip while the accumulated error stays under this
    cache_max_skip: int | None = None  #: magcache: at most this many cached steps in a row
    cache_retention: float | None = None  #: magcache: this fraction of the first steps always runs full
    cache_calibration: str | None = None  #: magcache: a file of ``python -m hyv_lib calibrate_cache``
    multi_host: bool = False  #: tpu runtime on a multi-host slice
    attention: str = "auto"  #: ``auto``, ``diffusers`` or a backend of :data:`hyv_lib.attention.BACKENDS`

    @classmethod
    def from_kwargs(cls, kwargs: dict[str, Any]) -> "Stage2Settings":
        """The settings of ``kwargs``; an unknown name is a HyvInputError listing the valid ones."""
        names = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(kwargs) - set(names))
        if unknown:
            raise HyvInputError(f"--{unknown[0]}", f"is not a stage-2 setting; valid: {', '.join(names)}")
        return cls(**kwargs)


STAGE2_SETTINGS = tuple(f.name for f in dataclasses.fields(Stage2Settings))


def resolve_settings(preset: Preset, settings: Stage2Settings | None = None, **kwargs: Any) -> dict[str, Any]:
    """Fill unset stage-2 settings (a :class:`Stage2Settings`, or its fields as keyword arguments) from the preset,
    validate them, and resolve (height, width).

    Bad values raise HyvInputError naming the flag. Height and width come from the ``aspect_ratio``
    bucket unless both are given.
    """
    if settings is not None and kwargs:
        raise HyvInputError("settings", "give a Stage2Settings or keyword arguments, not both")
    settings = settings if settings is not None else Stage2Settings.from_kwargs(kwargs)
    s = settings
    aspect_ratio, height, width, video_length = s.aspect_ratio, s.height, s.width, s.video_length
    num_inference_steps, guidance_scale, flow_shift = s.num_inference_steps, s.guidance_scale, s.flow_shift
    seed, warmup_steps, runtime, mesh, sharding = s.seed, s.warmup_steps, s.runtime, s.mesh, s.sharding
    enable_cache, cache_start_step, cache_end_step = s.enable_cache, s.cache_start_step, s.cache_end_step
    cache_step_interval, no_cache_blocks, cache_method = s.cache_step_interval, s.no_cache_blocks, s.cache_method
    multi_host, attention = s.multi_host, s.attention
    for name, value, kind in (("--height", height, int), ("--width", width, int), ("--video_length", video_length, int),
                              ("--num_inference_steps", num_inference_steps, int), ("--seed", seed, int),
                              ("--warmup_steps", warmup_steps, int), ("--guidance_scale", guidance_scale, float),
                              ("--flow_shift", flow_shift, float)):
        _check_type(name, value, kind)
    # numpy scalars pass the check; from here on they are Python numbers (torch's manual_seed takes no np.int64)
    height, width, video_length, num_inference_steps, seed, warmup_steps = (
        None if v is None else int(v) for v in (height, width, video_length, num_inference_steps, seed, warmup_steps))
    guidance_scale, flow_shift = (None if v is None else float(v) for v in (guidance_scale, flow_shift))
    video_length = preset.default_video_length if video_length is None else video_length
    num_inference_steps = preset.default_steps if num_inference_steps is None else num_inference_steps
    guidance_scale = preset.guidance_scale if guidance_scale is None else guidance_scale
    flow_shift = preset.flow_shift if flow_shift is None else flow_shift
    if video_length < 1 or (video_length - 1) % preset.temporal_compression:
        raise HyvInputError("--video_length", f"must be 4n+1 (e.g. 9, 33, 61, 121), got {video_length}")
    if (height is None) != (width is None):
        raise HyvInputError("--height" if height is None else "--width",
                            "give both --height and --width, or neither (then --aspect_ratio picks a bucket)")
    stride = preset.spatial_compression
    for name, value in (("--height", height), ("--width", width)):
        if value is not None and (value <= 0 or value % stride):
            raise HyvInputError(name, f"must be a positive multiple of {stride}, got {value}")
    if num_inference_steps < 1:
        raise HyvInputError("--num_inference_steps", f"must be >= 1, got {num_inference_steps}")
    if not guidance_scale >= 1.0:
        raise HyvInputError("--guidance_scale", f"must be >= 1 (1 disables CFG's effect), got {guidance_scale}")
    if not flow_shift > 0:
        raise HyvInputError("--flow_shift", f"must be > 0, got {flow_shift}")
    if not 0 <= seed < 2**63:
        raise HyvInputError("--seed", f"must be in [0, 2**63), got {seed}")
    if warmup_steps < 0:
        raise HyvInputError("--warmup_steps", f"must be >= 0, got {warmup_steps}")
    if runtime not in RUNTIMES:
        raise HyvInputError("--runtime", f"must be one of {', '.join(RUNTIMES)}, got {runtime!r}")
    check_attention(attention, runtime)
    axes = parse_mesh(mesh)
    if axes and runtime != "tpu":
        raise HyvInputError("--mesh", "needs --runtime tpu")
    if axes and axes.get("data", 1) > 1 and guidance_scale == 1.0:
        raise HyvInputError("--mesh", f"data={axes['data']} splits the CFG pair, but --guidance_scale 1 runs one "
                                      "sample per step; put the devices on tensor (e.g. tensor=8)")
    if multi_host:
        if runtime != "tpu":
            raise HyvInputError("--multi_host", "needs --runtime tpu")
        from .tpu import init_multi_host

        init_multi_host()  # before the mesh check: until then a host sees only its own devices
    from .sharding import RULE_SETS, make_mesh

    if axes:
        try:
            make_mesh(**axes)  # the device count must match before any stage writes a file
        except ValueError as err:
            raise HyvInputError("--mesh", str(err)) from None
    if sharding not in RULE_SETS:
        raise HyvInputError("--sharding", f"must be one of {', '.join(RULE_SETS)}, got {sharding!r}")
    bucket = bucket_size(preset, aspect_ratio)  # validates --aspect_ratio even when a size is given
    height, width = bucket if height is None else (height, width)
    cache = {}
    magcache_flags = {"--cache_threshold": s.cache_threshold, "--cache_max_skip": s.cache_max_skip,
                      "--cache_retention": s.cache_retention, "--cache_calibration": s.cache_calibration}
    if cache_method is not None and cache_method not in CACHE_METHODS:
        raise HyvInputError("--cache_method", f"must be one of {', '.join(CACHE_METHODS)}, got {cache_method!r}")
    if cache_method is not None and not enable_cache:
        raise HyvInputError("--cache_method", "needs --enable_cache")
    given = [flag for flag, value in magcache_flags.items() if value is not None]
    if given and cache_method != "magcache":
        raise HyvInputError(given[0], "applies to --enable_cache --cache_method magcache only")
    if enable_cache:
        if runtime not in ("torch", "tpu"):
            raise HyvInputError("--enable_cache", f"DeepCache runs on --runtime torch or tpu, not {runtime!r}")
        for name, value, low in (("--cache_start_step", cache_start_step, 0), ("--cache_end_step", cache_end_step, 0),
                                 ("--cache_step_interval", cache_step_interval, 1),
                                 ("--no_cache_blocks", no_cache_blocks, 0)):
            if not isinstance(value, int) or value < low:
                raise HyvInputError(name, f"must be an integer >= {low}, got {value!r}")
        if cache_end_step < cache_start_step:
            raise HyvInputError("--cache_end_step", f"must be >= --cache_start_step ({cache_start_step}), "
                                                    f"got {cache_end_step}")
        num_layers = preset.transformer.get("num_layers")
        if num_layers is not None and no_cache_blocks > num_layers:
            raise HyvInputError("--no_cache_blocks", f"must be at most the model's {num_layers} blocks, "
                                                     f"got {no_cache_blocks}")
        if cache_method == "magcache":
            from .adaptive_cache import resolve_magcache

            cache = dict(**resolve_magcache(preset, num_inference_steps, flow_shift, no_cache_blocks,
                                            s.cache_threshold, s.cache_max_skip, s.cache_retention,
                                            s.cache_calibration), no_cache_blocks=no_cache_blocks)
        else:
            cache = dict(cache_method="deepcache", cache_start_step=cache_start_step, cache_end_step=cache_end_step,
                         cache_step_interval=cache_step_interval, no_cache_blocks=no_cache_blocks)
    return dict(aspect_ratio=aspect_ratio, height=height, width=width, video_length=video_length,
                num_inference_steps=num_inference_steps, guidance_scale=guidance_scale, flow_shift=flow_shift,
                seed=seed, warmup_steps=warmup_steps, runtime=runtime, attention=attention, mesh=mesh,
                sharding=sharding if mesh else None, enable_cache=bool(enable_cache), **cache,
                **({"multi_host": True} if multi_host else {}))


def cache_schedule(settings: dict[str, Any], preset: Preset | None = None, model_path: str | None = None):
    """The schedule of resolved settings: a DeepCacheSchedule, a :class:`hyv_lib.adaptive_cache.MagCacheSchedule`
    (``cache_method`` magcache; ``preset`` and ``model_path`` serve a calibration made on the fly for a tiny preset
    without a calibration file), or None when the cache is off."""
    if not settings.get("enable_cache"):
        return None
    if settings.get("cache_method") == "magcache":
        from .adaptive_cache import schedule_for

        if preset is None:
            raise ValueError("a magcache schedule needs the preset")
        return schedule_for(settings, preset, model_path)
    from .cache import DeepCacheSchedule

    return DeepCacheSchedule(settings["num_inference_steps"], settings["cache_start_step"],
                             settings["cache_end_step"], settings["cache_step_interval"])


def memory_fields(stage: str, memory: PeakMemory) -> dict[str, float]:
    """generation_config.json fields of a stage's memory: the process's peak RSS while the stage's main work
    ran (stage 1: loading and running the text encoders; stage 2: the denoising loop; stage 3: the VAE decode),
    and how far it rose above the RSS at the start of that work."""
    mib = 2**20
    return {f"{stage}_peak_rss_mib": round(memory.peak_bytes / mib, 1),
            f"{stage}_rss_growth_mib": round(memory.growth_bytes / mib, 1)}


def _require_folder(name: str, value: Any) -> None:
    """The stage functions write or read files: the folder is the caller's choice, never an invented default (the
    CLI's default is ``stage_outputs``)."""
    if not isinstance(value, (str, os.PathLike)) or not str(value):
        raise HyvInputError(f"--{name}", f"a folder is required, got {value!r}")


def _preset_from_config(config: dict[str, Any], input_dir: str) -> Preset:
    if "preset" not in config:
        raise HyvInputError("--input_dir", f"{os.path.join(input_dir, CONFIG_FILE)!r} is missing or has no "
                                           "'preset'; run stage1 into this folder first")
    return get_preset(config["preset"])


def encode_pair(components: dict[str, Any], preset: Preset, prompt: str, negative_prompt: str = "",
                dtype: str = "fp32", image=None, argument: str = "--image_path") -> dict[str, torch.Tensor]:
    """The stage-1 tensors of a prompt and its negative prompt (one text-encoder batch [negative, positive]):
    ``prompt_embeds``, ``prompt_embeds_mask``, ``prompt_embeds_2``, ``prompt_embeds_mask_2`` and their
    ``negative_`` twins, batch 1 each, floats in ``dtype``. With ``image`` (a first frame already cropped to its
    bucket, :func:`hyv_lib.image.crop_to_bucket`) also ``image_embeds`` (in ``dtype``) and ``cond_latents`` (fp32),
    which need SigLIP and the VAE in ``components`` (a HyvInputError naming ``argument`` otherwise)."""
    from .text import encode_prompts

    encoded = encode_prompts(components, preset, [negative_prompt, prompt])
    tensors = {}
    for index, prefix in ((0, "negative_"), (1, "")):
        for name, value in encoded.items():
            value = value[index : index + 1]
            tensors[prefix + name] = value.to(torch_dtype(dtype)) if value.is_floating_point() else value
    if image is not None:
        from .image import encode_image
        from .models import IMAGE_COMPONENTS

        missing = [n for n in (*IMAGE_COMPONENTS, "vae") if n not in components]
        if missing:
            raise HyvInputError(argument, f"encoding a first frame needs {', '.join(missing)}; load the components "
                                          "of a preset that takes an image")
        frame = encode_image(components, preset, image)
        tensors.update(image_embeds=frame["image_embeds"].to(torch_dtype(dtype)), cond_latents=frame["cond_latents"])
    return tensors


def sample_latents(step: TransformerStep, transformer, scheduler_config, preset: Preset,
                   embeds: dict[str, torch.Tensor], settings: dict[str, Any], *, progress: bool = True,
                   device: torch.device | None = None) -> torch.Tensor:
    """Stage 2's work without files: seeded noise denoised by ``step`` with CFG, conditioned on the stage-1
    tensors ``embeds`` (with ``image_embeds`` and ``cond_latents``: image-to-video), with resolved ``settings``
    (:func:`resolve_settings`); fp32 latents on the CPU. ``transformer`` supplies the dtype and widths (and whether
    it is a MeanFlow model); the scheduler is built from ``scheduler_config`` with the settings' flow shift."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    config = transformer.config
    for key, dim in (("prompt_embeds", config.text_embed_dim), ("prompt_embeds_2", config.text_embed_2_dim)):
        if embeds[key].shape[-1] != dim:
            raise HyvInputError("--input_dir", f"{STAGE1_FILE}: {key} has width {embeds[key].shape[-1]} but the "
                                               f"transformer expects {dim}; stage1 used a different model")
    model_dtype = next(transformer.parameters()).dtype
    device = device or torch.device("cpu")
    scheduler = FlowMatchEulerDiscreteScheduler.from_config(scheduler_config, shift=settings["flow_shift"])
    shape = preset.latent_shape(settings["height"], settings["width"], settings["video_length"])
    shape = (shape[0], config.out_channels, *shape[2:])  # the model decides the channels
    cond_latents = embeds.get("cond_latents")
    if cond_latents is not None and tuple(cond_latents.shape[-2:]) != shape[-2:]:
        raise HyvInputError("--height", f"the first frame's latents are {list(cond_latents.shape[-2:])} but the "
                                        f"video's are {list(shape[-2:])}: the image decides the size")
    conditioning = {k: v.to(device) for k, v in prepare_conditioning(
        embeds, preset, model_dtype, image_dim=config.image_embed_dim).items()}
    return denoise(step, initial_latents(shape, settings["seed"]).to(device), conditioning, scheduler,
                   num_inference_steps=settings["num_inference_steps"], guidance_scale=settings["guidance_scale"],
                   model_dtype=model_dtype, warmup_steps=settings["warmup_steps"], progress=progress,
                   cond_latents=None if cond_latents is None else cond_latents.to(device),
                   meanflow=bool(getattr(config, "use_meanflow", False))).cpu()


# ------------------------------------------------------------------------------------------------- stage 1
def check_task(preset: Preset, has_image: bool, argument: str = "--image_path") -> str:
    """"i2v" with a first frame, else "t2v"; a HyvInputError naming ``argument`` when the preset's checkpoint was not
    trained for that task (an image for a text-to-video checkpoint, or none for an image-to-video one)."""
    from .presets import PRESETS

    task = "i2v" if has_image else "t2v"
    if task not in preset.tasks:
        if not has_image:
            raise HyvInputError(argument, f"preset {preset.name} is an image-to-video checkpoint: give the first "
                                          "frame (a PNG or JPEG image)")
        others = ", ".join(n for n, p in PRESETS.items() if task in p.tasks and not p.is_tiny)
        raise HyvInputError(argument, f"preset {preset.name} is a text-to-video checkpoint; image-to-video presets: "
                                      f"{others} (or the tiny ones)")
    return task


def image_size_settings(settings: Stage2Settings, size: tuple[int, int]) -> Stage2Settings:
    """Image-to-video: the first frame's bucket (height, width) is the video's size; a different --height/--width is
    a HyvInputError (the condition latents could not be placed)."""
    for name, given, fixed in (("--height", settings.height, size[0]), ("--width", settings.width, size[1])):
        if given is not None and given != fixed:
            raise HyvInputError(name, f"is {given}, but the first frame was bucketed to {size[0]}x{size[1]} in stage "
                                      "1 and decides the video's size; leave --height and --width unset")
    return dataclasses.replace(settings, height=size[0], width=size[1])


def first_frame(spec, image, settings: Stage2Settings, argument: str = "--image_path") -> tuple[Stage2Settings, Any]:
    """Image-to-video's first frame: ``image`` (a path, or a PIL image) loaded and checked (HyvInputError naming
    ``argument``), ``settings`` with the size of its bucket (:func:`image_size_settings`), and the frame cropped to
    that bucket (what stage 1 encodes)."""
    from .image import check_image, crop_to_bucket, image_bucket, load_image

    image = load_image(image, argument) if isinstance(image, (str, os.PathLike)) else check_image(image, argument)
    return image_size_settings(settings, image_bucket(spec, image)), crop_to_bucket(spec, image)


@python_names()  # called from Python: errors name parameters; from the CLI: flags
def stage1(
    preset: str = "tiny", prompt: str = "", negative_prompt: str = "", output_dir: str | None = None,
    model_path: str | None = None, dtype: str | None = None, components: dict[str, Any] | None = None,
    image_path: str | None = None,
) -> dict[str, torch.Tensor]:
    """Encode the prompt and negative prompt (and, with ``image_path``, the first frame of an image-to-video run);
    write stage1_embeddings.safetensors + generation_config.json.

    The image is cropped to its bucket as diffusers' I2V pipeline does, then encoded by SigLIP (``image_embeds``)
    and the VAE (``cond_latents``); the bucket fixes the video's height and width for stage 2. ``components``
    (tokenizer, text_encoder, tokenizer_2, text_encoder_2, and for an image image_encoder, feature_extractor, vae;
    already loaded for this preset, model path and dtype) skips loading them: :class:`hyv_lib.batch.Pipeline` keeps
    them between prompts."""
    start = time.perf_counter()
    _require_folder("output_dir", output_dir)
    spec = get_preset(preset)
    dtype = dtype or spec.default_dtype
    torch_dtype(dtype)  # validates --dtype
    if not isinstance(prompt, str) or not isinstance(negative_prompt, str):
        raise HyvInputError("--prompt", "prompt and negative prompt must be strings")
    task = check_task(spec, image_path is not None)
    image = None
    if image_path is not None:
        from .image import crop_to_bucket, load_image

        image = crop_to_bucket(spec, load_image(image_path))
    if model_path is None and not spec.is_tiny:
        load_components(spec, None, [])  # raises the "needs --model_path" error before any work
    ensure_output_dir(output_dir)
    names = ["tokenizer", "text_encoder", "tokenizer_2", "text_encoder_2"]
    if image is not None:
        from .models import IMAGE_COMPONENTS

        names += [*IMAGE_COMPONENTS, "vae"]
    with PeakMemory() as memory:
        if components is None:
            components = load_components(spec, model_path, names, dtype=dtype)
        tensors = encode_pair(components, spec, prompt, negative_prompt, dtype, image)
    save_tensors(tensors, os.path.join(output_dir, STAGE1_FILE), metadata={"preset": spec.name})
    image_fields = {} if image is None else dict(image_path=os.path.abspath(image_path), image_height=image.size[1],
                                                 image_width=image.size[0])
    update_config(
        output_dir, base={}, prompt=prompt, negative_prompt=negative_prompt, preset=spec.name, task=task,
        **image_fields, model_path=model_path, dtype=dtype, hyv_lib_version=__version__,
        stage1_time_s=round(time.perf_counter() - start, 3), **memory_fields("stage1", memory),
    )
    return tensors


# ------------------------------------------------------------------------------------------------- stage 2
def prepare_conditioning(embeds: dict[str, torch.Tensor], preset: Preset, dtype: torch.dtype,
                         image_dim: int | None = None) -> dict[str, Any]:
    """Stage-1 tensors -> the forward's conditioning kwargs as a CFG batch of 2 ([negative, positive]).

    t2v passes all-zero image embeddings (the model then masks those tokens out), as diffusers does; i2v passes the
    first frame's SigLIP tokens to both halves (diffusers does not drop the image for the negative prompt).
    ``image_dim`` (default: the preset's) is the transformer's ``image_embed_dim``.
    """
    image = embeds.get("image_embeds")
    if image is None:
        image = torch.zeros(1, preset.image_tokens, image_dim or preset.image_dim)

    def pair(name: str) -> torch.Tensor:
        return torch.cat([embeds["negative_" + name], embeds[name]], dim=0)

    return {
        "encoder_hidden_states": pair("prompt_embeds").to(dtype),
        "encoder_attention_mask": pair("prompt_embeds_mask").to(torch.int64),
        "encoder_hidden_states_2": pair("prompt_embeds_2").to(dtype),
        "encoder_attention_mask_2": pair("prompt_embeds_mask_2").to(torch.int64),
        "image_embeds": image.to(dtype).repeat(2, 1, 1),
    }


def sampling_schedule(scheduler, num_inference_steps: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """The loop's schedule: sets ``scheduler``'s sigmas to linspace(1, 0, N+1)[:-1], which a
    FlowMatchEulerDiscreteScheduler shifts by its flow shift s (sigma' = s sigma / (1 + (s - 1) sigma)), and returns
    (timesteps [N], timestep_r [N]): timestep i is 1000 sigma'_i, and timestep_r[i] is the next timestep (0 after the
    last), what a step-distilled (MeanFlow) model gets with each step, as diffusers' I2V pipeline passes it.
    :func:`denoise` runs exactly this schedule."""
    scheduler.set_timesteps(sigmas=np.linspace(1.0, 0.0, num_inference_steps + 1)[:-1], device=device)
    timesteps = scheduler.timesteps
    timestep_r = torch.cat([timesteps[1:], torch.zeros(1, dtype=timesteps.dtype, device=timesteps.device)])
    return timesteps, timestep_r


def condition_channels(latents: torch.Tensor, cond_latents: torch.Tensor | None = None) -> torch.Tensor:
    """What the DiT gets after the noisy ``latents`` [B, C, F, h, w] on the channel axis (its in_channels are
    2 C + 1): C condition channels and one mask channel, [B, C + 1, F, h, w]. Image to video (``cond_latents``
    [1, C, 1, h, w], the first frame's VAE latents): the condition channels hold them in latent frame 0 and zeros
    after, and the mask is 1 on frame 0, 0 elsewhere. Text to video (None): all zeros. As diffusers' pipelines
    build them (``prepare_cond_latents_and_mask``)."""
    b, c, f, h, w = latents.shape
    condition = torch.zeros(b, c + 1, f, h, w, dtype=latents.dtype, device=latents.device)
    if cond_latents is not None:
        condition[:, :c, :1] = cond_latents.to(latents.dtype)
        condition[:, c, 0] = 1.0
    return condition


def initial_latents(shape: tuple[int, ...], seed: int) -> torch.Tensor:
    """Gaussian starting latents from a CPU generator: the same seed gives the same bits anywhere."""
    return torch.randn(shape, generator=torch.Generator("cpu").manual_seed(seed), dtype=torch.float32)


@torch.no_grad()
def denoise(
    step: TransformerStep, latents: torch.Tensor, conditioning: dict[str, Any], scheduler, *,
    num_inference_steps: int, guidance_scale: float, model_dtype: torch.dtype = torch.float32,
    warmup_steps: int = 0, progress: bool = True, cond_latents: torch.Tensor | None = None, meanflow: bool = False,
) -> torch.Tensor:
    """Flow-matching Euler loop with CFG as one batch of 2 (one sample when ``guidance_scale`` is 1, as diffusers'
    guider runs it); returns fp32 latents.

    Sigmas are linspace(1, 0, N+1)[:-1] shifted by the scheduler, as diffusers' pipeline sets them
    (:func:`sampling_schedule`).
    Warmup calls run the step on the first input and discard the result without touching the
    scheduler, so they cannot change the latents (gpu-tpu-pedia's warmup advanced the step index).
    ``cond_latents`` [1, C, 1, h, w] (image-to-video): the first frame's latents go into latent frame 0 of the
    condition channels and the mask channel is 1 there, 0 elsewhere (:func:`condition_channels`). ``meanflow``: each
    call also gets ``timestep_r``, the next timestep (0 after the last), as diffusers' I2V pipeline passes it.
    """
    from tqdm import tqdm  # plain text bar: works in terminals and in executed notebooks alike

    timesteps, timesteps_r = sampling_schedule(scheduler, num_inference_steps, device=latents.device)
    latents = latents.float()
    # After the noisy latents: C condition channels and a mask channel (t2v: all zero).
    condition = condition_channels(latents, cond_latents)
    cfg = guidance_scale != 1.0
    if not cfg:  # the [negative, positive] pair's positive half: uncond + 1 * (cond - uncond) is cond
        conditioning = {k: v[1:] for k, v in conditioning.items()}
    batch = 2 if cfg else 1

    def model_kwargs(x: torch.Tensor, i: int) -> dict[str, Any]:
        hidden = torch.cat([x, condition], dim=1).to(model_dtype)
        kwargs = {"hidden_states": hidden.repeat(batch, 1, 1, 1, 1),
                  "timestep": timesteps[i].expand(batch).to(model_dtype), **conditioning}
        if meanflow:
            kwargs["timestep_r"] = timesteps_r[i].expand(batch).to(model_dtype)
        return kwargs

    for _ in range(warmup_steps):
        step(**model_kwargs(latents, 0))
    if hasattr(step, "reset"):  # stateful steps (DeepCache) count steps from here: warmup must not shift them
        step.reset()
    schedule = getattr(step, "schedule", None)
    if schedule is not None:  # a DeepCache schedule that does not fit this loop is worth a word
        import warnings

        if schedule.num_steps != num_inference_steps:
            warnings.warn(f"the DeepCache schedule has {schedule.num_steps} steps but the loop runs "
                          f"{num_inference_steps}", stacklevel=2)
        if schedule.cached_in(num_inference_steps) == 0:
            warnings.warn(f"DeepCache caches none of these {num_inference_steps} steps ({schedule.describe()}): "
                          "every step runs full", stacklevel=2)
    for i, t in enumerate(tqdm(timesteps, desc="denoising", disable=not progress, leave=False)):
        noise = step(**model_kwargs(latents, i)).float()
        if cfg:
            noise_uncond, noise_cond = noise.chunk(2)
            noise = noise_uncond + guidance_scale * (noise_cond - noise_uncond)
        latents = scheduler.step(noise, t, latents, return_dict=False)[0]
    return latents


@python_names()  # called from Python: errors name parameters; from the CLI: flags
def stage2(
    input_dir: str | None = None, output_dir: str | None = None, *, quiet: bool = False,
    step: TransformerStep | None = None, components: dict[str, Any] | None = None, **settings: Any,
) -> torch.Tensor:
    """Denoise from the stage-1 embeddings; write stage2_latents.safetensors and extend the config.

    ``settings`` are the fields of :class:`Stage2Settings` (``height``, ``video_length``, ``num_inference_steps``,
    ``seed``, ``runtime``, ``mesh``, ``enable_cache``, ...); unset ones take the preset's defaults, and an unknown
    name is an error. ``runtime``, ``mesh`` and ``sharding`` pick the
    transformer step (see :func:`make_step`); ``step`` overrides it with any callable of that interface, and
    ``components`` (transformer and scheduler, already loaded for this folder) skips loading them.
    ``multi_host``: this process is one host of a multi-host TPU slice (:func:`hyv_lib.tpu.init_multi_host`); every
    host runs the same command and writes the same latents to its own ``output_dir``. ``attention``: see
    :func:`make_step` (checked before anything is loaded or written).
    """
    start = time.perf_counter()
    _require_folder("input_dir", input_dir)
    requested = Stage2Settings.from_kwargs(settings)
    runtime, mesh, sharding, attention = requested.runtime, requested.mesh, requested.sharding, requested.attention
    config = read_config(input_dir) if os.path.isdir(input_dir) else {}
    embeds = load_stage1(input_dir)
    spec = _preset_from_config(config, input_dir)
    if "cond_latents" in embeds:  # image-to-video: the size is the first frame's
        requested = image_size_settings(
            requested, tuple(n * spec.spatial_compression for n in embeds["cond_latents"].shape[-2:]))
    settings = resolve_settings(spec, requested)
    output_dir = ensure_output_dir(output_dir or input_dir)
    dtype = config.get("dtype", spec.default_dtype)
    if components is None:
        components = load_components(spec, config.get("model_path"), ["transformer", "scheduler"], dtype=dtype)
    transformer = components["transformer"]
    device = torch.device("cpu")
    if runtime in ("torch", "ulysses") and torch.cuda.is_available():  # a GPU (per rank); untested here: no GPU
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        transformer.to(device)  # before the step is built (a no-op when a kept model is already there)
    owns_group = runtime == "ulysses" and not torch.distributed.is_initialized()  # else the caller's: left as found
    step = step or make_step(transformer, runtime, mesh, sharding,
                             cache=cache_schedule(settings, spec, config.get("model_path")),
                             uncached_blocks=settings.get("no_cache_blocks", 1), attention=attention)
    with PeakMemory() as memory:
        latents = sample_latents(step, transformer, components["scheduler"].config, spec, embeds, settings,
                                 progress=not quiet and _rank() == 0, device=device)
    if _rank() == 0:  # every rank holds the same latents; one writes them
        save_tensors({"latents": latents}, os.path.join(output_dir, STAGE2_FILE), metadata={"preset": spec.name})
        counts = {}
        if settings["enable_cache"] and hasattr(step, "full_calls"):  # what the cache did, next to what was asked
            counts = dict(cache_full_steps=step.full_calls, cache_cached_steps=step.cached_calls,
                          cache_skipped_steps=list(getattr(step, "skipped_steps", [])))
        update_config(output_dir, base=config, **settings, **counts,
                      stage2_time_s=round(time.perf_counter() - start, 3), **memory_fields("stage2", memory))
    if runtime == "ulysses":
        from .parallel import barrier

        barrier()
        if owns_group:
            torch.distributed.destroy_process_group()
    return latents


# ------------------------------------------------------------------------------------------------- stage 3
def _check_stage3_settings(output_video: str | None, fps: Any, vae_dtype: str) -> None:
    """Stage 3's own settings (HyvInputError naming the flag): checked by :func:`stage3` before it loads anything
    and by :func:`generate` before stage 1 writes anything."""
    _check_type("--fps", fps, float)
    if fps is not None and not fps > 0:
        raise HyvInputError("--fps", f"must be > 0, got {fps}")
    if vae_dtype not in ("fp32", "bf16"):
        raise HyvInputError("--vae_dtype", f"must be fp32 or bf16, got {vae_dtype!r}")
    if output_video is not None:
        check_mp4_path(output_video, "--output_video")


@python_names()  # called from Python: errors name parameters; from the CLI: flags
def stage3(
    input_dir: str | None = None, output_video: str | None = None, fps: float | None = None,
    disable_tiling: bool = False, save_frames: bool = False, runtime: str = "torch", vae_dtype: str = "fp32",
    components: dict[str, Any] | None = None,
) -> torch.Tensor:
    """Decode the stage-2 latents with the VAE and write the mp4 (and optionally the frames).

    ``runtime``: ``torch`` (eager, on the GPU when CUDA is available, else the host CPU; tiles spread over the
    ranks under torchrun) or ``tpu`` (the decoder jitted through torchax on JAX's device: the TPU on a TPU VM).
    ``vae_dtype``: ``fp32`` (default) or ``bf16``, what the decoder computes in. ``components`` ({"vae": ...},
    already loaded) skips loading it.
    """
    start = time.perf_counter()
    _require_folder("input_dir", input_dir)
    _check_stage3_settings(output_video, fps, vae_dtype)
    if runtime not in ("torch", "tpu"):
        raise HyvInputError("--runtime", f"stage 3 runs on torch or tpu, got {runtime!r}")
    config = read_config(input_dir) if os.path.isdir(input_dir) else {}
    latents = load_stage2(input_dir)
    spec = _preset_from_config(config, input_dir)
    fps = spec.fps if fps is None else fps
    output_video = output_video or os.path.join(input_dir, VIDEO_FILE)
    out_dir = os.path.dirname(os.path.abspath(output_video))
    ensure_output_dir(out_dir, "--output_video")
    if components is None:
        components = load_components(spec, config.get("model_path"), ["vae"], dtype=config.get("dtype", "fp32"))
    vae = components["vae"]
    if runtime == "torch" and vae_dtype == "bf16":
        torch.nn.Module.to(vae, torch.bfloat16)  # (diffusers' to() warns about fp32-pinned modules: this VAE has none)
    if runtime == "torch" and torch.cuda.is_available():  # this rank's GPU (nccl's tile exchange needs GPU tensors)
        vae.to(torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))))  # untested here: no GPU
    if latents.shape[1] != vae.config.latent_channels:
        raise HyvInputError("--input_dir", f"{STAGE2_FILE}: latents have {latents.shape[1]} channels but the VAE "
                                           f"expects {vae.config.latent_channels}")
    from .video import decode_latents, write_mp4

    # Under torchrun (WORLD_SIZE > 1) the VAE tiles are spread over the ranks; rank 0 writes the files.
    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    if distributed and runtime == "tpu":
        raise HyvInputError("--runtime", "stage 3 with --runtime tpu runs in one process, not under torchrun")
    owns_group = distributed and not torch.distributed.is_initialized()  # else the caller's: left as found
    if distributed:
        from .parallel import init_distributed

        init_distributed()
    with PeakMemory() as memory:
        frames = decode_latents(vae, latents, tiling=not disable_tiling, tile_parallel=distributed, runtime=runtime,
                                dtype=torch_dtype(vae_dtype) if runtime == "tpu" else None)
    if _rank() == 0:
        write_mp4(frames.numpy(), output_video, fps)
        fields = {"output_video": os.path.abspath(output_video), "fps": fps, "vae_tiling": not disable_tiling,
                  "stage3_runtime": runtime, "vae_dtype": vae_dtype}
        if save_frames:
            frames_path = os.path.join(out_dir, FRAMES_FILE)
            save_tensors({"frames": frames.permute(3, 0, 1, 2).unsqueeze(0)}, frames_path)  # [1,3,F,H,W] uint8
            fields["frames_file"] = frames_path
        update_config(input_dir, base=config, **fields, stage3_time_s=round(time.perf_counter() - start, 3),
                      **memory_fields("stage3", memory))
    if distributed:
        from .parallel import barrier

        barrier()
        if owns_group:
            torch.distributed.destroy_process_group()
    return frames


@python_names()  # called from Python: errors name parameters; from the CLI: flags
def generate(
    preset: str = "tiny", prompt: str = "", negative_prompt: str = "", output_dir: str | None = None,
    model_path: str | None = None, dtype: str | None = None, output_video: str | None = None,
    fps: float | None = None, disable_tiling: bool = False, save_frames: bool = False, vae_dtype: str = "fp32",
    image_path: str | None = None, **stage2_kwargs: Any,
) -> torch.Tensor:
    """Run stage 1, 2 and 3 into ``output_dir``; returns the uint8 frames [F,H,W,3]. ``image_path``: the first
    frame of an image-to-video run (see :func:`stage1`). ``stage2_kwargs``: the fields of :class:`Stage2Settings`,
    and ``quiet``.

    Stage-2 settings (and the image) are checked before the text encoders run, so bad input fails fast. With
    ``runtime="tpu"`` stage 3 decodes on JAX too.
    """
    _require_folder("output_dir", output_dir)
    stage2_settings = {k: v for k, v in stage2_kwargs.items() if k not in ("quiet", "step", "components")}
    spec = get_preset(preset)
    requested = Stage2Settings.from_kwargs(stage2_settings)
    check_task(spec, image_path is not None)
    if image_path is not None:
        requested = first_frame(spec, image_path, requested)[0]
    resolve_settings(spec, requested)
    _check_stage3_settings(output_video, fps, vae_dtype)
    stage1(preset=preset, prompt=prompt, negative_prompt=negative_prompt, output_dir=output_dir,
           model_path=model_path, dtype=dtype, image_path=image_path)
    stage2(input_dir=output_dir, **stage2_kwargs)
    return stage3(input_dir=output_dir, output_video=output_video, fps=fps, disable_tiling=disable_tiling,
                  save_frames=save_frames, vae_dtype=vae_dtype,
                  runtime="tpu" if stage2_kwargs.get("runtime") == "tpu" else "torch")

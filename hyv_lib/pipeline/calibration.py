"""MagCache calibration: run the pipeline once and record how much the cached tokens change per step; resolve a schedule's curve."""

from __future__ import annotations

import warnings
from typing import Any, Callable

import torch

from ..base.errors import HyvInputError
from ..base.presets import Preset
from ..models.components import load_components, text_components
from ..models.dtypes import torch_dtype
from ..models.families import DEFAULT_PRESET, family_for, get_preset
from ..models.folder import choose_preset
from ..parallel.distributed import local_device
from ..parallel.sharding import DEFAULT_STRATEGY
from ..runtimes.deepcache import DeepCacheSchedule
from ..runtimes.magcache import (
    CALIBRATION_PROMPT,
    CALIBRATION_SEED,
    MagCacheCalibration,
    MagCacheSchedule,
    calibration_path,
    load_calibration,
)
from ..runtimes.jax_step import to_cpu
from ..runtimes.step import make_step
from .image import check_task, first_frame
from .sampling import sample_latents
from .settings import ResolvedSettings, Stage2Settings, resolve_settings
from .text import encode_pair


def _video_tokens(cache: Any):
    """The video tokens of a runtime's cache: (video, context, mask, rope) from TorchDeepCache, or
    ((video, context), mask, cos, sin) from the TPU runtime."""
    return cache[0][0] if isinstance(cache[0], (tuple, list)) else cache[0]


def _relative_change(runtime, previous, current) -> float:
    """mean over tokens of ||current - previous|| / ||previous|| (last axis), computed where the tensors live."""
    import contextlib

    env = getattr(runtime, "env", None)  # torchax tensors (TPU runtime): eager JAX ops on the device
    with env if env is not None else contextlib.nullcontext(), torch.no_grad():
        before, now = previous.float(), current.float()
        value = ((now - before).norm(dim=-1) / before.norm(dim=-1).clamp_min(1e-12)).mean()
        if env is not None:
            value = to_cpu(value)
    return float(value)


class CalibrationStep:
    """A transformer step that runs every step full through a cache runtime (``run_and_cache``: the uncached
    result) and records the curve of :data:`QUANTITY`; the denoising loop's :meth:`reset` starts a new curve."""

    def __init__(self, runtime, no_cache_blocks: int = 1):
        self.runtime, self.no_cache_blocks = runtime, no_cache_blocks
        self.reset()

    def reset(self) -> None:
        self.curve: list[float] = []
        self._previous = None

    def __call__(self, **kwargs) -> torch.Tensor:
        out, cache = self.runtime.run_and_cache(self.no_cache_blocks, **kwargs)
        tokens = _video_tokens(cache)
        self.curve.append(0.0 if self._previous is None else _relative_change(self.runtime, self._previous, tokens))
        self._previous = tokens
        return out


def calibrate(preset: str | Preset | None = None, model_path: str | None = None, *, prompt: str = CALIBRATION_PROMPT,
              negative_prompt: str = "", image_path: str | None = None, seed: int = CALIBRATION_SEED,
              num_inference_steps: int | None = None, flow_shift: float | None = None,
              guidance_scale: float | None = None, aspect_ratio: str = "16:9", height: int | None = None,
              width: int | None = None, video_length: int | None = None, no_cache_blocks: int = 1,
              runtime: str = "torch", mesh: str | None = None, sharding: str = DEFAULT_STRATEGY,
              attention: str | None = None, dtype: str | None = None, components: dict[str, Any] | None = None,
              progress: bool = False) -> MagCacheCalibration:
    """One uncached run of ``prompt`` (the first frame ``image_path`` for image-to-video presets) through DeepCache's
    full program, recording the curve a :class:`MagCacheSchedule` needs. Settings as for
    :func:`hyv_lib.pipeline.stages.stage2` (None: the preset's); ``components`` already loaded are reused, the missing
    ones (text encoders, transformer, scheduler) are loaded. The curve is rounded to 6 decimals. ``preset=None``:
    the one ``model_path``'s configs say (:func:`hyv_lib.models.folder.choose_preset`), else the default."""
    preset = choose_preset(preset, model_path).preset
    dtype = dtype or preset.default_dtype
    torch_dtype(dtype)
    if not isinstance(prompt, str) or not isinstance(negative_prompt, str):
        raise HyvInputError("prompt", "prompt and negative prompt must be strings")
    check_task(preset, image_path is not None)
    requested = Stage2Settings(
        aspect_ratio=aspect_ratio, height=height, width=width, video_length=video_length,
        num_inference_steps=num_inference_steps, guidance_scale=guidance_scale, flow_shift=flow_shift, seed=seed,
        runtime=runtime, mesh=mesh, sharding=sharding, attention=attention, enable_cache=True,
        no_cache_blocks=no_cache_blocks)
    image = None
    if image_path is not None:
        requested, image = first_frame(preset, image_path, requested)
    if runtime == "ulysses":
        raise HyvInputError("runtime", "calibration runs with torch or jax")
    settings = resolve_settings(preset, requested)
    names = [*text_components(preset), "transformer", "scheduler"]
    if image is not None:
        names += list(family_for(preset).image_components)
    components = dict(components or {})
    missing = [n for n in names if n not in components]
    if missing:
        components.update(load_components(preset, model_path, missing, dtype=dtype))
    transformer = components["transformer"]
    runtime = settings.runtime  # "tpu" given: recorded as "jax"
    device = local_device() if runtime == "torch" else torch.device("cpu")
    if device.type == "cuda":  # untested here: no GPU
        transformer.to(device)
    with torch.no_grad():
        embeds = encode_pair(components, preset, prompt, negative_prompt, dtype, image)
    steps = settings.num_inference_steps
    probe = make_step(transformer, runtime, mesh, sharding, cache=DeepCacheSchedule(steps, 0, steps, 1),
                      no_cache_blocks=no_cache_blocks, attention=settings.attention,
                      attention_options=settings.attention_options())
    step = CalibrationStep(probe.runtime, probe.no_cache_blocks)
    sample_latents(step, transformer, components["scheduler"].config, preset, embeds, settings,
                   progress=progress, device=device)
    return MagCacheCalibration(
        preset=preset.name, num_inference_steps=steps, flow_shift=float(settings.flow_shift),
        no_cache_blocks=no_cache_blocks, curve=tuple(round(c, 6) for c in step.curve),
        guidance_scale=float(settings.guidance_scale), height=settings.height, width=settings.width,
        video_length=settings.video_length, prompt=prompt, seed=seed, runtime=runtime)


def resolve_calibration(settings: ResolvedSettings, preset: Preset) -> str | None:
    """The calibration file of a MagCache run (:func:`hyv_lib.runtimes.magcache.calibration_path`): the one given
    (checked against the run), the one shipped with the preset when it fits, or None (a tiny preset calibrated on
    the fly). Also called before any work starts, so that a missing or unfitting file fails fast."""
    return calibration_path(preset, settings.num_inference_steps, settings.flow_shift, settings.no_cache_blocks,
                            settings.cache_calibration)


def schedule_for(settings: ResolvedSettings, preset: Preset, model_path: str | None = None,
                 calibrate_fn: Callable[..., MagCacheCalibration] | None = None) -> MagCacheSchedule:
    """The :class:`MagCacheSchedule` of resolved settings (:func:`hyv_lib.pipeline.settings.resolve_settings`): from
    their calibration file (:func:`resolve_calibration`), or, without one (tiny presets only), from a calibration run
    made now with the run's steps, shift, guidance and size on the eager torch runtime, with a warning saying so."""
    path = resolve_calibration(settings, preset)
    if path is not None:
        calibration = load_calibration(path)
    else:
        warnings.warn(f"magcache: no calibration file for {preset.name} at {settings.num_inference_steps} steps, "
                      f"flow shift {settings.flow_shift}: calibrating with one uncached run now (write a file once "
                      f"with python -m hyv_lib calibrate_cache --preset {preset.name} --num_inference_steps "
                      f"{settings.num_inference_steps} --output PATH.json and pass --cache_calibration PATH.json)",
                      stacklevel=2)
        calibration = (calibrate_fn or calibrate)(
            preset.name, model_path, num_inference_steps=settings.num_inference_steps,
            flow_shift=settings.flow_shift, guidance_scale=settings.guidance_scale, height=settings.height,
            width=settings.width, video_length=settings.video_length,
            no_cache_blocks=settings.no_cache_blocks)
    return MagCacheSchedule.from_calibration(calibration, settings.cache_threshold, settings.cache_max_skip,
                                             settings.cache_retention)


def magcache_schedule(preset: str = DEFAULT_PRESET, num_inference_steps: int | None = None,
                      flow_shift: float | None = None, cache_threshold: float | None = None,
                      cache_max_skip: int | None = None, cache_retention: float | None = None,
                      cache_calibration: str | None = None, no_cache_blocks: int = 1,
                      model_path: str | None = None) -> MagCacheSchedule:
    """A :class:`MagCacheSchedule` for ``hyv_lib.load_pipeline(preset).generate(..., cache=...)``, resolved as the
    CLI resolves ``--cache_method magcache`` and the flags of these names (None: the preset's or the default)::

        pipe = hyv_lib.load_pipeline("tiny_trained")
        video = pipe.generate(prompt, cache=magcache_schedule("tiny_trained", cache_threshold=0.1))
    """
    preset = get_preset(preset)
    settings = resolve_settings(preset, num_inference_steps=num_inference_steps, flow_shift=flow_shift,
                                enable_cache=True, cache_method="magcache", cache_threshold=cache_threshold,
                                cache_max_skip=cache_max_skip, cache_retention=cache_retention,
                                cache_calibration=cache_calibration, no_cache_blocks=no_cache_blocks)
    return schedule_for(settings, preset, model_path)


def cache_schedule(settings: ResolvedSettings, preset: Preset, model_path: str | None = None):
    """The step cache of resolved settings, decided here where the step is built: a DeepCacheSchedule, a
    :class:`hyv_lib.runtimes.magcache.MagCacheSchedule` (``cache_method`` magcache: its calibration is resolved now;
    ``model_path`` serves a calibration made on the fly for a tiny preset without a file), or None (cache off)."""
    if not settings.enable_cache:
        return None
    if settings.cache_method == "magcache":
        return schedule_for(settings, preset, model_path)
    return DeepCacheSchedule(settings.num_inference_steps, settings.cache_start_step, settings.cache_end_step,
                             settings.cache_step_interval)

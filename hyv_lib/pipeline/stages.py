"""The three stages (text -> embeddings -> latents -> video) with their files, and generate (all three)."""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import os
import time
from typing import Any

import torch

from .. import __version__
from ..base.errors import HyvInputError
from ..base.files import clean_partials, ensure_output_dir, make_folder
from ..base.lock import FolderInUseError, folder_lock
from ..base.memory import PeakMemory
from ..base.presets import Preset
from ..models.components import load_components, text_components
from ..models.dtypes import torch_dtype
from ..models.families import PRESETS, family_for, get_preset
from ..models.folder import PresetChoice, choose_preset
from ..models.lora import RECORD_FIELDS, check_lora_file
from ..parallel.distributed import barrier, init_distributed, launched_ranks, rank
from ..runtimes.names import VAE_RUNTIMES, runtime_choices, runtime_name, vae_runtime_for
from ..runtimes.step import TransformerStep
from .calibration import cache_schedule, resolve_calibration
from .denoiser import Denoiser, decode_video
from .encoder_device import resolve_text_device
from .image import check_task, crop_to_bucket, first_frame, image_size_settings, load_image
from .settings import (
    ResolvedSettings,
    Stage2Settings,
    check_vae_model,
    check_vae_settings,
    prepare_runtime,
    resolve_settings,
)
from .stage_io import (
    CONFIG_FILE,
    FRAMES_FILE,
    STAGE1_FILE,
    STAGE2_FILE,
    VIDEO_FILE,
    load_stage1,
    load_stage2,
    read_config,
    save_tensors,
    update_config,
)
from .text import encode_pair, tokens_dropped
from .video_io import check_fps, check_mp4_path, write_mp4

logger = logging.getLogger(__name__)


def memory_fields(stage: str, memory: PeakMemory) -> dict[str, float]:
    """generation_config.json fields of a stage's memory: the process's peak RSS while the stage's main work
    ran (stage 1: loading and running the text encoders; stage 2: the denoising loop; stage 3: the VAE decode),
    how far it rose above the RSS at the start of that work, and on a GPU the allocator's allocated and reserved
    peaks over the same work."""
    mib = 2**20
    fields = {f"{stage}_peak_rss_mib": round(memory.peak_bytes / mib, 1),
              f"{stage}_rss_growth_mib": round(memory.growth_bytes / mib, 1)}
    if memory.gpu_peak_allocated_bytes is not None:  # a GPU stage: torch's allocator peaks next to the host RSS
        fields.update({f"{stage}_gpu_peak_allocated_mib": round(memory.gpu_peak_allocated_bytes / mib, 1),
                       f"{stage}_gpu_peak_reserved_mib": round(memory.gpu_peak_reserved_bytes / mib, 1)})
    return fields


def _require_folder(name: str, value: Any) -> None:
    """The stage functions write or read files: the folder is the caller's choice, never an invented default (the
    CLI's default is ``stage_outputs``)."""
    if not isinstance(value, (str, os.PathLike)) or not str(value):
        raise HyvInputError(f"{name}", f"a folder is required, got {value!r}")


def _preset_from_config(config: dict[str, Any], input_dir: str) -> Preset:
    """The preset stage 1 ran with: a named one, or a custom :class:`Preset` that stage 1 recorded whole."""
    if "preset" not in config:
        raise HyvInputError("input_dir", f"{os.path.join(input_dir, CONFIG_FILE)!r} is missing or has no "
                                         "'preset'; run stage1 into this folder first (a stage-1 folder of the "
                                         "staged scripts: give `preset` and `model_path`)")
    if "preset_fields" in config:
        return Preset.from_dict(config["preset_fields"])
    return get_preset(config["preset"])


def _with_given_preset(config: dict[str, Any], input_dir: str, preset: Any, model_path: str | None) -> dict[str, Any]:
    """Stage 1's config with a preset and model folder given to a later stage: refused when stage 1 recorded another
    preset; else recorded (a staged script's stage-1 folder has none: :func:`stage2`)."""
    if preset is None and model_path is None:
        return config
    config = dict(config)
    if model_path is not None:
        config["model_path"] = os.path.abspath(os.path.expanduser(model_path)) if os.path.isdir(
            os.path.expanduser(model_path)) else model_path
    if "preset" in config:
        if preset is not None and get_preset(preset).name != config["preset"]:
            raise HyvInputError("preset", f"{get_preset(preset).name} is not the preset stage 1 ran with in "
                                          f"{input_dir!r} ({config['preset']}); leave `preset` out")
        return config
    choice = choose_preset(preset, config.get("model_path"))
    return {**config, "preset": choice.preset.name, **choice.record()}


def one_run_per_folder(*names: str):
    """Decorate a stage: while it runs, this process holds the folder's run lock
    (:func:`hyv_lib.base.lock.folder_lock`: a second run on the folder is refused with one error line, and a killed
    run's lock goes with its process) and the hidden partial files a killed writer left there are removed first
    (:func:`hyv_lib.base.files.clean_partials`). The folder is the first of the parameters ``names`` that is given.
    An ``output_dir`` that does not exist yet is created and locked before any work (two runs racing to create it:
    the one that gets the lock first runs, the other is refused and leaves the folder alone); if the stage then
    refuses its input, a folder it created and left empty is removed. A missing input folder is not locked (the
    stage says it is missing). Under torchrun only rank 0, the rank that writes, takes the lock. A stage called
    inside another's lock (generate, a prompts file) nests."""

    def wrap(fn):
        signature = inspect.signature(fn)

        @functools.wraps(fn)
        def run(*args, **kwargs):
            bound = signature.bind_partial(*args, **kwargs).arguments
            name = next((n for n in names if bound.get(n)), None)
            folder = bound.get(name) if name else None
            if (not isinstance(folder, (str, os.PathLike)) or os.environ.get("RANK", "0") != "0"
                    or (name != "output_dir" and not os.path.isdir(folder))):
                return fn(*args, **kwargs)
            folder = os.fspath(folder)
            created = False
            try:
                with contextlib.ExitStack() as held:
                    try:
                        created = make_folder(folder)
                        held.enter_context(folder_lock(folder, argument=name))
                    except FolderInUseError:  # another run holds it (and may have just made it): left as it is
                        created = False
                        raise
                    except OSError:  # a full or read-only place: the stage's own first write names what it refused
                        pass
                    else:
                        clean_partials(folder)
                    return fn(*args, **kwargs)
            except HyvInputError:
                if created:  # made by this call and still empty (bad input found before any write): removed
                    with contextlib.suppress(OSError):
                        os.rmdir(folder)
                raise

        return run

    return wrap


@one_run_per_folder("output_dir")
def stage1(
    preset: str | Preset | PresetChoice | None = None, prompt: str = "", negative_prompt: str = "",
    output_dir: str | None = None, model_path: str | None = None, dtype: str | None = None, components: dict[str, Any] | None = None,
    image_path: str | None = None, text_device: str | torch.device | None = "auto",
) -> dict[str, torch.Tensor]:
    """Encode the prompt and negative prompt (and, with ``image_path``, the first frame of an image-to-video run);
    write stage1_embeddings.safetensors + generation_config.json.

    ``preset=None``: the preset ``model_path``'s configs say (:func:`hyv_lib.models.folder.choose_preset`; printed and
    recorded as ``preset_source``), else the default; a ``preset`` that contradicts the folder is refused before
    anything loads.

    ``text_device`` (:data:`hyv_lib.pipeline.encoder_device.TEXT_DEVICES`): where the encoders run; ``auto`` (the
    default) is this process's GPU when CUDA is available, else the host CPU
    (:func:`hyv_lib.pipeline.encoder_device.resolve_text_device`). On a GPU each encoder is moved there for its own
    call, one at a time, and leaves it right after (encoders loaded here are dropped, given ``components`` go back
    where they were), so stage 2 has the card; the tensors written are the host's, in ``dtype``. The device and the
    encoders' seconds (moves included, loading not) are recorded as ``stage1_device`` and ``stage1_encode_time_s``,
    next to ``stage1_time_s`` (the whole stage). A prompt longer than its encoder reads is cut there, with a warning;
    how many of its tokens were dropped is recorded (``prompt_tokens_dropped``, ``negative_prompt_tokens_dropped``,
    and ByT5's ``..._quoted_tokens_dropped``; 0 when all fit: :func:`hyv_lib.pipeline.text.tokens_dropped`).

    The image is cropped to its bucket as diffusers' I2V pipeline does, then encoded by SigLIP (``image_embeds``)
    and the VAE (``cond_latents``); the bucket fixes the video's height and width for stage 2. ``components``
    (tokenizer, text_encoder, tokenizer_2, text_encoder_2, and for an image image_encoder, feature_extractor, vae;
    already loaded for this preset, model path and dtype) skips loading them: :class:`hyv_lib.pipeline.batch.BatchRunner` keeps
    them between prompts."""
    start = time.perf_counter()
    _require_folder("output_dir", output_dir)
    if launched_ranks() > 1:
        raise HyvInputError("stage1", f"runs in one process, not in each of {launched_ranks()} torchrun ranks (they "
                                      "would all write the same files): run stage 1 without torchrun, then "
                                      "torchrun ... stage2 `runtime` ulysses and torchrun ... stage3")
    choice = choose_preset(preset, model_path)  # a folder's configs say which preset; a contradicting one is refused
    preset = choice.preset
    dtype = dtype or preset.default_dtype
    torch_dtype(dtype)  # validates --dtype
    if not isinstance(prompt, str) or not isinstance(negative_prompt, str):
        raise HyvInputError("prompt", "prompt and negative prompt must be strings")
    task = check_task(preset, image_path is not None)
    device = resolve_text_device(text_device)
    image = None
    if image_path is not None:
        image = crop_to_bucket(preset, load_image(image_path))
    if model_path is None and not preset.is_tiny:
        load_components(preset, None, [])  # raises the "needs --model_path" error before any work
    ensure_output_dir(output_dir)
    names = list(text_components(preset))
    if image is not None:
        names += list(family_for(preset).image_components)
    with PeakMemory() as memory:
        loaded = components is None  # loaded here: each encoder's weights are dropped after its call
        if loaded:
            components = load_components(preset, model_path, names, dtype=dtype)
        dropped = tokens_dropped(components, preset, prompt, negative_prompt)  # encode_pair warns when one was cut
        encode_start = time.perf_counter()
        tensors = encode_pair(components, preset, prompt, negative_prompt, dtype, image, device=device, release=loaded)
        encode_s = time.perf_counter() - encode_start
    save_tensors(tensors, os.path.join(output_dir, STAGE1_FILE), metadata={"preset": preset.name})
    image_fields = {} if image is None else dict(image_path=os.path.abspath(image_path), image_height=image.size[1],
                                                 image_width=image.size[0])
    custom = {} if PRESETS.get(preset.name) == preset else {"preset_fields": preset.to_dict()}  # stages 2-3 rebuild it
    update_config(
        output_dir, base={}, prompt=prompt, negative_prompt=negative_prompt, preset=preset.name, **choice.record(),
        task=task, **custom,
        **image_fields, model_path=model_path, dtype=dtype, hyv_lib_version=__version__,
        stage1_time_s=round(time.perf_counter() - start, 3), stage1_encode_time_s=round(encode_s, 3),
        stage1_device=str(device), **memory_fields("stage1", memory), **dropped,
    )
    logger.info("stage 1: %s in %.1f s, encoders %.1f s on %s (peak RSS %.0f MiB)",
                os.path.join(output_dir, STAGE1_FILE), time.perf_counter() - start, encode_s, device,
                memory.peak_bytes / 2**20)
    return tensors


@one_run_per_folder("output_dir", "input_dir")
def stage2(
    input_dir: str | None = None, output_dir: str | None = None, *, quiet: bool = False,
    step: TransformerStep | None = None, components: dict[str, Any] | None = None,
    preset: str | Preset | None = None, model_path: str | None = None, **settings: Any,
) -> torch.Tensor:
    """Denoise from the stage-1 embeddings; write stage2_latents.safetensors and extend the config.

    The preset and model folder are stage 1's (its generation_config.json). A stage-1 folder written by the staged
    scripts (their 8 tensors, no ``preset`` in its config) runs with ``preset`` and ``model_path`` given here (either
    may be left out when the other says it: :func:`hyv_lib.models.folder.choose_preset`); both are then recorded, so
    stage 3 reads them. A ``preset`` other than the one stage 1 recorded is refused; ``model_path`` replaces the
    recorded folder (weights that moved).

    ``settings`` are the fields of :class:`Stage2Settings` (``height``, ``video_length``, ``num_inference_steps``,
    ``seed``, ``runtime``, ``mesh``, ``enable_cache``, ...); unset ones take the preset's defaults, and an unknown
    name is an error. ``runtime``, ``mesh`` and ``sharding`` pick the
    transformer step (see :func:`hyv_lib.runtimes.step.make_step`); ``step`` overrides it with any callable of that interface, and
    ``components`` (transformer and scheduler, already loaded for this folder) skips loading them.
    ``multi_host``: this process is one host of a multi-host TPU slice (:func:`hyv_lib.parallel.jax_env.init_multi_host`); every
    host runs the same command and writes the same latents to its own ``output_dir``. ``attention``: see
    :func:`hyv_lib.runtimes.step.make_step` (checked before anything is loaded or written; None: the preset's); ``sparse_attn=True`` (the
    official scripts' flag) and ``ssta`` (a :class:`hyv_lib.SstaConfig` or a dict of its fields) run SSTA. ``offload`` (torch runtime): ``block`` keeps the
    weights on the host and streams each block to the GPU as it runs, ``model`` moves the transformer to the GPU for
    the denoising loop only (:data:`hyv_lib.runtimes.placement.OFFLOAD_MODES`). ``shard_weights="fsdp"`` (under
    torchrun, runtime ulysses or torch): each rank keeps 1/N of the transformer's weights on its device and gathers
    one block at a time (:func:`hyv_lib.runtimes.fsdp.shard_weights`). ``compile=True`` (torch and ulysses runtimes):
    the transformer's blocks are torch.compiled (:func:`hyv_lib.runtimes.compiled.compile_blocks`); with
    ``warmup_steps=0`` one untimed warm-up call compiles before the first step. A given ``step`` is used as it is.
    """
    start = time.perf_counter()
    _require_folder("input_dir", input_dir)
    requested = Stage2Settings.from_kwargs(settings)
    runtime = requested.runtime
    ranks = launched_ranks()
    if ranks > 1 and runtime != "ulysses" and requested.shard_weights is None:
        raise HyvInputError("runtime", f"this process is one of {ranks} torchrun ranks, and `runtime` {runtime} would "
                                       "run the whole stage in each of them into the same files: split the work "
                                       "with `runtime` ulysses (or `shard_weights` fsdp), or run it without torchrun")
    config, embeds, preset = _read_stage1(input_dir, preset, model_path)
    prepare_runtime(requested)  # a multi-host run's hosts join: the settings then see every device
    if "cond_latents" in embeds:  # image-to-video: the size is the first frame's
        requested = image_size_settings(
            requested, tuple(n * preset.spatial_compression for n in embeds["cond_latents"].shape[-2:]))
    return _denoise_into(input_dir, output_dir, config, embeds, preset, resolve_settings(preset, requested), step=step,
                         components=components, quiet=quiet, start=start)


def _read_stage1(input_dir: str, preset: str | Preset | None,
                 model_path: str | None) -> tuple[dict[str, Any], dict[str, torch.Tensor], Preset]:
    """A stage-1 folder's config (with a given ``preset`` / ``model_path`` checked against it and recorded), its
    tensors and its preset."""
    config = read_config(input_dir) if os.path.isdir(input_dir) else {}
    config = _with_given_preset(config, input_dir, preset, model_path)
    # the preset says which stage-1 tensors to expect (HunyuanVideo-1.5's 8, CogVideoX's 2)
    embeds = load_stage1(input_dir, _preset_from_config(config, input_dir) if "preset" in config else None)
    return config, embeds, _preset_from_config(config, input_dir)


def _denoise_into(input_dir: str, output_dir: str | None, config: dict[str, Any], embeds: dict[str, torch.Tensor],
                  preset: Preset, settings: ResolvedSettings, *, step: TransformerStep | None,
                  components: dict[str, Any] | None, quiet: bool, start: float) -> torch.Tensor:
    """:func:`stage2`'s work once its settings are resolved (:func:`generate` resolves them once, before stage 1)."""
    runtime = settings.runtime
    # the step cache, decided before any model loads (a MagCache run's calibration file is resolved here)
    schedule = None if step is not None else cache_schedule(settings, preset, config.get("model_path"))
    output_dir = ensure_output_dir(output_dir or input_dir)
    dtype = config.get("dtype", preset.default_dtype)
    if components is None:
        components = load_components(preset, config.get("model_path"), ["transformer", "scheduler"], dtype=dtype)
    distributed = runtime == "ulysses" or settings.shard_weights is not None  # one process per device, torchrun
    owns_group = distributed and not torch.distributed.is_initialized()  # else the caller's: left as found
    denoiser = Denoiser.prepare(components["transformer"], settings, step=step, cache=schedule)
    with PeakMemory() as memory:
        latents = denoiser.denoise(components["scheduler"].config, preset, embeds, settings,
                                   progress=not quiet and rank() == 0)
    if rank() == 0:  # every rank holds the same latents; one writes them
        save_tensors({"latents": latents}, os.path.join(output_dir, STAGE2_FILE), metadata={"preset": preset.name})
        fields = settings.config()
        if denoiser.attention_kernel is not None:  # the backend `auto` chose, and SDPA's own kernel choice
            fields["attention_kernel"] = denoiser.attention_kernel
        if denoiser.lora is not None:  # the file's path, SHA-256, scale and rank
            fields.update(denoiser.lora.record(settings.lora_scale))
        else:  # a rerun without the LoRA (or from a folder made with one) records none
            config = {k: v for k, v in config.items() if k not in RECORD_FIELDS}
        step = denoiser.step
        used = getattr(step, "schedule", None)  # the cache's own fields (MagCache: the calibration file it used)
        if settings.enable_cache and used is not None:
            fields.update(used.settings())
        if settings.enable_cache and hasattr(step, "full_calls"):  # what the cache did, next to what was asked
            fields.update(cache_full_steps=step.full_calls, cache_cached_steps=step.cached_calls,
                          cache_skipped_steps=list(getattr(step, "skipped_steps", [])))
        update_config(output_dir, base=config, **fields, stage2_time_s=round(time.perf_counter() - start, 3),
                      **memory_fields("stage2", memory))
        logger.info("stage 2: %s in %.1f s, %d steps on the %s runtime (peak RSS %.0f MiB)",
                    os.path.join(output_dir, STAGE2_FILE), time.perf_counter() - start,
                    settings.num_inference_steps, runtime, memory.peak_bytes / 2**20)
    if distributed:
        barrier()
        if owns_group:
            torch.distributed.destroy_process_group()
    return latents


# ------------------------------------------------------------------------------------------------- stage 3
def _check_stage3_settings(output_video: str | None, fps: Any, vae_dtype: str, vae_memory_gb: Any = None,
                           tiling: bool = True, runtime: str = "torch") -> tuple[float | None, float | None]:
    """Stage 3's own settings (HyvInputError naming the parameter): checked by :func:`stage3` before it loads anything
    and by :func:`generate` before stage 1 writes anything. Returns ``fps`` and ``vae_memory_gb`` as Python floats
    (or None)."""
    fps = check_fps(fps, "fps")  # the frame rates an mp4 holds, before any work
    budget = check_vae_settings(vae_dtype, vae_memory_gb, tiling, runtime)
    if output_video is not None:
        check_mp4_path(output_video, "output_video")
        if os.path.isdir(output_video):
            raise HyvInputError("output_video", f"{output_video!r} is a folder; give the path of an .mp4 file")
        # an unwritable folder is refused now, not after the denoising loop (the folder is created if needed)
        ensure_output_dir(os.path.dirname(os.path.abspath(output_video)), "output_video")
    return fps, budget


@one_run_per_folder("input_dir")
def stage3(
    input_dir: str | None = None, output_video: str | None = None, fps: float | None = None,
    disable_tiling: bool = False, save_frames: bool = False, runtime: str = "torch", vae_dtype: str = "fp32",
    components: dict[str, Any] | None = None, vae_memory_gb: float | None = None,
) -> torch.Tensor:
    """Decode the stage-2 latents with the VAE and write the mp4 (and optionally the frames).

    ``runtime``: ``torch`` (eager, on the GPU when CUDA is available, else the host CPU; tiles spread over the
    ranks under torchrun) or ``jax`` (alias ``tpu``: the decoder jitted through torchax on JAX's device: the TPU on a TPU VM).
    ``vae_dtype``: ``fp32`` (default) or ``bf16``, what the decoder computes in. ``components`` ({"vae": ...},
    already loaded) skips loading it; the decode moves it to this rank's device and ``vae_dtype`` for the call only.
    ``vae_memory_gb`` (GiB, torch runtime): the largest square tiles whose decode fits that much device memory
    (:func:`hyv_lib.runtimes.vae_memory.tile_for_budget`) instead of diffusers' 256 px; recorded as ``vae_tile_px``.
    """
    start = time.perf_counter()
    _require_folder("input_dir", input_dir)
    runtime = runtime_name(runtime)
    if runtime not in VAE_RUNTIMES:
        raise HyvInputError("runtime", f"stage 3 runs on {runtime_choices(VAE_RUNTIMES)}, got {runtime!r}")
    fps, budget = _check_stage3_settings(output_video, fps, vae_dtype, vae_memory_gb, not disable_tiling, runtime)
    config = read_config(input_dir) if os.path.isdir(input_dir) else {}
    latents = load_stage2(input_dir)
    preset = _preset_from_config(config, input_dir)
    check_vae_model(preset, budget)
    latents = family_for(preset).vae_latents(preset, latents, config.get("video_length"))  # the VAE's [1, C, T, h, w]
    fps = preset.fps if fps is None else fps
    output_video = output_video or os.path.join(input_dir, VIDEO_FILE)
    out_dir = os.path.dirname(os.path.abspath(output_video))
    ensure_output_dir(out_dir, "output_video")
    if components is None:
        components = load_components(preset, config.get("model_path"), ["vae"], dtype=config.get("dtype", "fp32"))
    # Under torchrun (WORLD_SIZE > 1) the VAE tiles are spread over the ranks; rank 0 writes the files.
    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    if distributed and runtime == "jax":
        raise HyvInputError("runtime", "stage 3 with `runtime` jax runs in one process, not under torchrun")
    owns_group = distributed and not torch.distributed.is_initialized()  # else the caller's: left as found
    if distributed:
        init_distributed()
    with PeakMemory() as memory:  # the VAE moves to this rank's device and vae_dtype for the decode only
        frames, tile_px = decode_video(components["vae"], latents, runtime=runtime, vae_dtype=vae_dtype,
                                       tiling=not disable_tiling, memory_gb=budget, tile_parallel=distributed,
                                       argument="input_dir")
    frames = family_for(preset).video_frames(preset, frames)  # the frames the model's pipeline returns
    if rank() == 0:
        write_mp4(frames.numpy(), output_video, fps)
        fields = {"output_video": os.path.abspath(output_video), "fps": fps, "vae_tiling": not disable_tiling,
                  "stage3_runtime": runtime, "vae_dtype": vae_dtype}
        if budget is not None:
            fields.update(vae_memory_gb=budget, vae_tile_px=tile_px)
        if save_frames:
            frames_path = os.path.join(out_dir, FRAMES_FILE)
            save_tensors({"frames": frames.permute(3, 0, 1, 2).unsqueeze(0)}, frames_path)  # [1,3,F,H,W] uint8
            fields["frames_file"] = frames_path
        update_config(input_dir, base=config, **fields, stage3_time_s=round(time.perf_counter() - start, 3),
                      **memory_fields("stage3", memory))
        logger.info("stage 3: %s (%d frames at %g fps) in %.1f s (peak RSS %.0f MiB)", output_video, frames.shape[0],
                    fps, time.perf_counter() - start, memory.peak_bytes / 2**20)
    if distributed:
        barrier()
        if owns_group:
            torch.distributed.destroy_process_group()
    return frames


@one_run_per_folder("output_dir")
def generate(
    preset: str | Preset | PresetChoice | None = None, prompt: str = "", negative_prompt: str = "",
    output_dir: str | None = None, model_path: str | None = None, dtype: str | None = None, output_video: str | None = None,
    fps: float | None = None, disable_tiling: bool = False, save_frames: bool = False, vae_dtype: str = "fp32",
    image_path: str | None = None, vae_memory_gb: float | None = None, text_device: str | torch.device | None = "auto",
    **stage2_kwargs: Any,
) -> torch.Tensor:
    """Run stage 1, 2 and 3 into ``output_dir``; returns the uint8 frames [F,H,W,3]. ``image_path``: the first
    frame of an image-to-video run (see :func:`stage1`). ``stage2_kwargs``: the fields of :class:`Stage2Settings`,
    and ``quiet``. ``text_device``: where stage 1's encoders run (see :func:`stage1`; ``auto`` is the host CPU with
    ``runtime="jax"``); they leave the GPU before stage 2 loads the transformer.

    Stage-2 settings (and the image) are checked before the text encoders run, so bad input fails fast. With
    ``runtime="jax"`` stage 3 decodes on JAX too.
    """
    _require_folder("output_dir", output_dir)
    if launched_ranks() > 1:
        raise HyvInputError("generate", f"runs in one process, not in each of {launched_ranks()} torchrun ranks "
                                        "(stage 1 would run in every one into the same files): run stage1 without "
                                        "torchrun, then torchrun ... stage2 `runtime` ulysses and torchrun ... stage3")
    stage2_settings = {k: v for k, v in stage2_kwargs.items() if k not in ("quiet", "step", "components")}
    choice = choose_preset(preset, model_path)  # a folder's configs say which preset; a contradicting one is refused
    preset = choice.preset
    requested = Stage2Settings.from_kwargs(stage2_settings)
    check_task(preset, image_path is not None)
    if image_path is not None:
        requested = first_frame(preset, image_path, requested)[0]
    prepare_runtime(requested)
    settings = resolve_settings(preset, requested)
    if settings.cache_method == "magcache":  # a missing or unfitting calibration file fails before stage 1 writes
        resolve_calibration(settings, preset)
    if settings.lora:  # so does a corrupt LoRA, or one for another model or other shapes
        check_lora_file(settings.lora, preset.model, preset.transformer, model_path)
    vae_runtime = vae_runtime_for(settings.runtime)
    fps, budget = _check_stage3_settings(output_video, fps, vae_dtype, vae_memory_gb, not disable_tiling, vae_runtime)
    check_vae_model(preset, budget)
    device = resolve_text_device(text_device, settings.runtime)
    stage1(preset=choice, prompt=prompt, negative_prompt=negative_prompt, output_dir=output_dir,
           model_path=model_path, dtype=dtype, image_path=image_path, text_device=device)
    config, embeds, preset = _read_stage1(output_dir, None, None)
    _denoise_into(output_dir, None, config, embeds, preset, settings, step=stage2_kwargs.get("step"),
                  components=stage2_kwargs.get("components"), quiet=bool(stage2_kwargs.get("quiet", False)),
                  start=time.perf_counter())
    return stage3(input_dir=output_dir, output_video=output_video, fps=fps, disable_tiling=disable_tiling,
                  save_frames=save_frames, vae_dtype=vae_dtype, runtime=vae_runtime, vae_memory_gb=vae_memory_gb)

"""The flags of the commands that run the stages (stage1, stage2, stage3, generate, calibrate_cache): the gpu-tpu-pedia
scripts' names, grouped by stage."""

from __future__ import annotations

import argparse
import dataclasses
import typing
from typing import Any

from ..models.families import DEFAULT_PRESET, PRESETS
from ..parallel.sharding import DEFAULT_STRATEGY
from ..pipeline.settings import SETTING_GROUPS, Stage2Settings
from ..runtimes.magcache import CALIBRATION_PROMPT, CALIBRATION_SEED
from .attention_flags import add_ssta_arguments, str_to_bool
from .official_flags import add_official_arguments, add_preset_arguments


def add_stage1_arguments(p: argparse.ArgumentParser, output_dir: bool = True) -> None:
    """Stage 1's flags (preset, model folder, prompts, image, text device; ``--output_dir`` unless ``output_dir`` is False)."""
    g = p.add_argument_group("stage 1: text (and image) encoders")
    g.add_argument("--preset", default=None,
                   help=f"{' | '.join(PRESETS)} (default: with --model_path, the preset the folder's configs say "
                        f"(printed and recorded; a --preset that contradicts them is refused), else {DEFAULT_PRESET}; "
                        "tiny has random weights)")
    g.add_argument("--model_path", default=None,
                   help="diffusers-format folder or hub id; required for real presets")
    add_preset_arguments(g)
    g.add_argument("--prompt", default="", help="text prompt; quoted text also goes to ByT5 (default: empty)")
    g.add_argument("--negative_prompt", default="", help="negative prompt for CFG (default: empty)")
    g.add_argument("--image_path", default=None,
                   help="image-to-video: the first frame (PNG or JPEG), cropped to the preset's bucket nearest its "
                        "aspect ratio, which sets the video's size; required by the i2v presets")
    if output_dir:
        g.add_argument("--output_dir", default="stage_outputs", help="where the stage files go")
    g.add_argument("--dtype", default=None, help="fp32 | bf16 | fp16 (default: the preset's)")
    g.add_argument("--text_device", default="auto",
                   help="where the encoders run: auto | cpu | cuda | cuda:N. auto: this process's GPU when CUDA is "
                        "available, else the host CPU (the host CPU with --runtime jax). On a GPU each encoder "
                        "(Qwen2.5-VL, ByT5, SigLIP; CogVideoX's T5) goes there for its own call, one at a time, and "
                        "leaves it before stage 2; with --prompts_file they stay there between prompts unless "
                        "--offload is set (default: auto)")


def add_stage2_arguments(p: argparse.ArgumentParser, dirs: bool = True) -> None:
    """Stage 2's flags (size, steps, guidance, runtime, mesh, attention, offload, compile, LoRA, caches; the folders
    unless ``dirs`` is False, as for generate)."""
    g = p.add_argument_group("stage 2: denoising")
    if dirs:
        g.add_argument("--input_dir", default="stage_outputs", help="folder with stage1_embeddings.safetensors")
        g.add_argument("--output_dir", default=None, help="where stage2_latents.safetensors goes (default: input_dir)")
        g.add_argument("--preset", default=None,
                       help="stage 1's preset (default: the one stage 1 recorded); for a stage-1 folder written by the "
                            "staged scripts (their 8 tensors, no preset recorded) give it, or --model_path")
        g.add_argument("--model_path", default=None,
                       help="the model folder (default: the one stage 1 recorded; for a staged scripts' folder: the "
                            "preset is read from its configs when --preset is not given)")
    add_settings_arguments(p, {"denoising": g})
    add_official_arguments(p)


def add_settings_arguments(parser: argparse.ArgumentParser, groups: dict[str, Any] | None = None,
                           only: tuple[str, ...] | None = None) -> None:
    """One flag per :class:`hyv_lib.pipeline.settings.Stage2Settings` field (``only``: those fields), built from the
    field (:func:`hyv_lib.pipeline.settings.setting`): ``--<name>`` with its default, its type (a switch for a bool)
    and its help, in the argument group of its ``group`` (``groups`` holds those made already, or the parser itself;
    the others are made here, titled by :data:`hyv_lib.pipeline.settings.SETTING_GROUPS`)."""
    groups = dict(groups or {})
    hints = typing.get_type_hints(Stage2Settings)
    for field in dataclasses.fields(Stage2Settings):
        if only is not None and field.name not in only:
            continue
        meta = field.metadata
        group_name = meta["group"]
        if group_name not in groups:
            groups[group_name] = parser.add_argument_group(SETTING_GROUPS[group_name])
        group, flag, text = groups[group_name], f"--{field.name}", meta["help"].replace("%", "%%")
        kind = meta["kind"]
        if kind == "ssta_fields":
            add_ssta_arguments(parser, group)
        elif kind == "true_false":
            group.add_argument(flag, type=str_to_bool, nargs="?", const=True, default=field.default, help=text)
        elif hints[field.name] is bool:
            group.add_argument(flag, action="store_true", help=text)
        else:
            kinds = [t for t in typing.get_args(hints[field.name]) if t is not type(None)] or [hints[field.name]]
            group.add_argument(flag, type=None if kinds[0] is str else kinds[0], default=field.default, help=text)


def add_stage3_arguments(p: argparse.ArgumentParser, input_dir: bool = True) -> None:
    """Stage 3's flags (video path, fps, tiling, VAE dtype and memory; ``--input_dir`` and ``--runtime`` unless
    ``input_dir`` is False)."""
    g = p.add_argument_group("stage 3: VAE decode")
    if input_dir:
        g.add_argument("--input_dir", default="stage_outputs", help="folder with stage2_latents.safetensors")
        g.add_argument("--runtime", default="torch",
                       help="torch (eager: a GPU if present, else the host CPU; tiles spread over torchrun ranks) | "
                            "jax (the decoder jitted through torchax on JAX's device; tpu is an alias) (default torch)")
    g.add_argument("--output_video", default=None, help="mp4 path (default: <dir>/output_video.mp4)")
    g.add_argument("--fps", type=float, default=None, help="frames per second (default: the preset's)")
    g.add_argument("--disable_tiling", action="store_true", help="decode without spatial VAE tiles")
    g.add_argument("--save_frames", action="store_true", help="also write stage3_frames.safetensors")
    g.add_argument("--vae_dtype", default="fp32", help="fp32 | bf16: what the VAE decoder computes in (default fp32)")
    g.add_argument("--vae_memory_gb", type=float, default=None,
                   help="torch runtime: decode with the largest square tiles whose peak device memory stays within "
                        "this many GiB (a memory model fitted on an H200; default: diffusers' 256 px tiles)")


def add_calibration_arguments(p: argparse.ArgumentParser) -> None:
    """``calibrate_cache``'s flags: one uncached run's preset, prompt and stage-2 settings."""
    p.add_argument("--preset", default=None, help=f"a preset of `info` (default: the --model_path folder's, else "
                                                  f"{DEFAULT_PRESET})")
    p.add_argument("--model_path", default=None, help="diffusers-format folder or hub id; required for real presets")
    p.add_argument("--prompt", default=CALIBRATION_PROMPT, help=f"one sample's prompt (default {CALIBRATION_PROMPT!r})")
    p.add_argument("--negative_prompt", default="", help="negative prompt for CFG (default: empty)")
    p.add_argument("--image_path", default=None, help="first frame, for the image-to-video presets")
    p.add_argument("--seed", type=int, default=CALIBRATION_SEED, help=f"seed (default {CALIBRATION_SEED})")
    p.add_argument("--dtype", default=None, help="fp32 | bf16 | fp16 (default: the preset's)")
    for name, kind, text in (("--num_inference_steps", int, "denoising steps"), ("--flow_shift", float, "sigma shift"),
                             ("--guidance_scale", float, "CFG scale"), ("--height", int, "pixels"),
                             ("--width", int, "pixels"), ("--video_length", int, "frames, 4n+1")):
        p.add_argument(name, type=kind, default=None, help=f"{text} (default: the preset's)")
    p.add_argument("--aspect_ratio", default="16:9", help="W:H bucket (default 16:9)")
    p.add_argument("--no_cache_blocks", type=int, default=1,
                   help="trailing blocks of the cached step, 0..num_layers (default 1)")
    p.add_argument("--runtime", default="torch", help="torch | jax (tpu is an alias) (default torch)")
    p.add_argument("--mesh", default=None, help="jax runtime: device mesh, e.g. tensor=8, or 1 for one device "
                                                "(default: every device, as for stage2)")
    p.add_argument("--sharding", default=DEFAULT_STRATEGY, help="tp | tp_replicated_out | fsdp")
    p.add_argument("--attention", default=None, help="as for stage2 (default: the preset's)")

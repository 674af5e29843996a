"""The flags of the commands that run the stages (stage1, stage2, stage3, generate, calibrate_cache): the gpu-tpu-pedia
scripts' names, grouped by stage."""

from __future__ import annotations

import argparse

from ..base.presets import DEFAULT_SEED
from ..models.families import DEFAULT_PRESET, PRESETS
from ..parallel.sharding import DEFAULT_STRATEGY
from ..runtimes.magcache import CALIBRATION_PROMPT, CALIBRATION_SEED
from .attention_flags import add_attention_arguments
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
    g.add_argument("--aspect_ratio", default="16:9", help="W:H, picks the preset's resolution bucket (default 16:9)")
    g.add_argument("--height", type=int, default=None, help="pixels, multiple of 16 (overrides --aspect_ratio)")
    g.add_argument("--width", type=int, default=None, help="pixels, multiple of 16 (overrides --aspect_ratio)")
    g.add_argument("--video_length", type=int, default=None, help="frames, 4n+1 (default: the preset's)")
    g.add_argument("--num_inference_steps", type=int, default=None, help="denoising steps (default: the preset's)")
    g.add_argument("--guidance_scale", type=float, default=None, help="CFG scale >= 1 (default: the preset's)")
    g.add_argument("--flow_shift", type=float, default=None,
                   help="sigma shift (default: the preset's; HunyuanVideo-1.5 only, CogVideoX's scheduler has none)")
    g.add_argument("--seed", type=int, default=DEFAULT_SEED, help=f"seed of the initial noise (default {DEFAULT_SEED})")
    g.add_argument("--warmup_steps", type=int, default=0,
                   help="untimed transformer calls before the loop; never change the result (default 0)")
    g.add_argument("--runtime", default="torch",
                   help="torch (eager diffusers) | jax (torchax/JAX jit on the present JAX backend; tpu is an alias) | "
                        "ulysses (sequence parallel; launch with torchrun --nproc_per_node=N)")
    g.add_argument("--mesh", default=None,
                   help="jax runtime: device mesh, e.g. tensor=8 or data=2,tensor=4, or 1 for one device "
                        "(default: every device, as compile lays them out: data=2 for the CFG pair, tensor = the "
                        "rest, as far as the heads split; the mesh used is printed and recorded)")
    g.add_argument("--sharding", default=DEFAULT_STRATEGY,
                   help="jax runtime on more than one device (a --mesh, or the default one): tp | tp_replicated_out | "
                        "fsdp (default tp_replicated_out)")
    add_attention_arguments(p, g)
    g.add_argument("--offload", default=None,
                   help="torch runtime: block (the transformer's weights stay on the host, one block at a time is "
                        "streamed to the GPU: about a quarter of the GPU memory at 480p on an H200, 3.5%% slower) | "
                        "model (the transformer is on the GPU for the denoising loop only, so the VAE decode after it "
                        "has the card) (default: off)")
    g.add_argument("--shard_weights", default=None,
                   help="fsdp: split the transformer's weights over the torchrun ranks (PyTorch FSDP2; each rank "
                        "holds 1/N of them and gathers one block at a time) with --runtime ulysses (or torch: every "
                        "rank computes the whole step) (default: off, every rank holds all of them)")
    g.add_argument("--compile", action="store_true",
                   help="torch and ulysses runtimes: torch.compile the transformer blocks (one compiled program shared "
                        "by all of them; inductor fuses the norms, modulation, RoPE and copies around the matmuls and "
                        "the attention). The first step compiles (an extra untimed warm-up call when --warmup_steps is "
                        "0); another size, frame count or batch compiles again. Not with --offload block; the tpu "
                        "runtime is always compiled (default: off)")
    g.add_argument("--multi_host", action="store_true",
                   help="jax runtime on a multi-host slice: join the hosts (jax.distributed.initialize) first; run "
                        "the same command on every host (gcloud ... ssh --worker=all)")
    g.add_argument("--lora", default=None,
                   help="a LoRA in diffusers' format: the .safetensors file, or the folder holding "
                        "pytorch_lora_weights.safetensors (what `train` writes); merged into the transformer's weights "
                        "before the step is built, on every runtime (default: none)")
    g.add_argument("--lora_scale", type=float, default=1.0,
                   help="the LoRA's strength: W += scale * alpha/rank * B @ A (default 1.0; 0 leaves the model as is)")
    add_official_arguments(p)
    c = p.add_argument_group("stage 2: DeepCache (torch, jax and ulysses runtimes)")
    c.add_argument("--enable_cache", action="store_true", help="reuse deep features on the schedule's cached steps")
    c.add_argument("--cache_method", default=None,
                   help="deepcache (the fixed schedule of the --cache_*_step flags) | magcache (adaptive: skips by a "
                        "calibrated per-step curve) (default deepcache)")
    c.add_argument("--cache_start_step", type=int, default=11, help="first step of the cached range (default 11)")
    c.add_argument("--cache_end_step", type=int, default=45, help="steps from here on are full again (default 45)")
    c.add_argument("--cache_step_interval", type=int, default=4,
                   help="in the range, every N-th step is full (default 4)")
    c.add_argument("--no_cache_blocks", type=int, default=1,
                   help="trailing blocks recomputed on cached steps; 0: a cached step runs only the output layer "
                        "(default 1)")
    c.add_argument("--cache_threshold", type=float, default=None,
                   help="magcache: reuse the cache while the accumulated estimated error stays under this; 0 runs "
                        "every step full (default 0.1)")
    c.add_argument("--cache_max_skip", type=int, default=None,
                   help="magcache: at most this many cached steps in a row (default 3)")
    c.add_argument("--cache_retention", type=float, default=None,
                   help="magcache: this fraction of the first steps always runs full (default 0.2)")
    c.add_argument("--cache_calibration", default=None,
                   help="magcache: calibration JSON of `calibrate_cache` (default: the one shipped with "
                        "tiny_trained, or, for a tiny preset, one uncached calibration run first; required for real "
                        "presets)")


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

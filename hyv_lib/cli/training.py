"""The fine-tuning commands of the command line: ``extract_features``, ``train`` and ``merge_lora`` (their flags and
what they run)."""

from __future__ import annotations

import argparse
import sys

from ..base.errors import EXIT_ENTRIES_FAILED, one_line
from ..kernels.ssta import SstaConfig
from ..models.families import DEFAULT_PRESET, get_preset
from ..models.folder import choose_preset
from ..pipeline.settings import resolve_attention
from ..runtimes.torch_train import LR_SCHEDULES
from ..training.features import extract_features
from ..training.loop import train
from ..training.merge import write_merged_model
from ..training.prior import write_prior_clips
from ..training.run_settings import DEFAULTS as TRAIN_DEFAULTS
from .attention_flags import ssta_overrides
from .error_lines import flag_text
from .stage_flags import add_settings_arguments

#: hyv-tiny's own training defaults, named in the help of the flags they change.
HYV_TINY = get_preset("tiny_trained").train_defaults


def add_train_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--features", required=True, help="a folder of python -m hyv_lib extract_features")
    p.add_argument("--preset", default=None, help=f"the features' preset (default: the --model_path folder's, else "
                                                  f"{DEFAULT_PRESET})")
    p.add_argument("--model_path", default=None, help="diffusers-format folder of the model to train (default: the "
                                                      "preset's bundled or built weights)")
    what = p.add_mutually_exclusive_group()
    what.add_argument("--lora_rank", type=int, default=None, help="train a LoRA adapter of this rank (writes "
                                                                  "OUTPUT_DIR/pytorch_lora_weights.safetensors)")
    what.add_argument("--full", action="store_true", help="train every weight (writes OUTPUT_DIR/transformer)")
    p.add_argument("--lora_alpha", type=float, default=None, help="LoRA alpha (default: the rank, a scale of 1)")
    p.add_argument("--lora_targets", default=None,
                   help="the layers the LoRA adapts, groups joined by commas (default: the preset's; attn for "
                        f"the real ones, {HYV_TINY['lora_targets']} for tiny_trained): attn (the attention "
                        "projections) | mlp (the feed-forward layers; attn,mlp is MindSpeed-MM's I2V recipe) | all "
                        "(every nn.Linear, as the official train.py) | the model's own groups (HunyuanVideo-1.5: "
                        "text, the caption's path only; HunyuanVideo: single, its single-stream blocks' linear layers)")
    p.add_argument("--steps", type=int, required=True, help="optimizer updates in all (a rerun resumes; more steps "
                                                            "train a finished run further, unless its learning rate "
                                                            "decayed to zero: --lr_schedule)")
    p.add_argument("--learning_rate", type=float, default=None,
                   help=f"AdamW's peak learning rate (default: the preset's, {TRAIN_DEFAULTS['learning_rate']:g} for "
                        f"the real ones, {HYV_TINY['learning_rate']:g} for tiny_trained)")
    p.add_argument("--warmup_steps", type=int, default=TRAIN_DEFAULTS["warmup_steps"],
                   help=f"linear warmup updates (default {TRAIN_DEFAULTS['warmup_steps']})")
    p.add_argument("--lr_schedule", default=None,
                   help=f"the learning rate after the warmup: {' | '.join(LR_SCHEDULES)} (cosine, linear: to zero at "
                        f"the last step, as diffusers' schedulers of those names; default: the preset's, "
                        f"{TRAIN_DEFAULTS['lr_schedule']} for the real ones, {HYV_TINY['lr_schedule']} for "
                        "tiny_trained)")
    p.add_argument("--batch_size", type=int, default=None,
                   help="clips per update, all of one latent shape; under torchrun split over the ranks (default: the "
                        f"preset's, {TRAIN_DEFAULTS['batch_size']} for the real ones, {HYV_TINY['batch_size']} for "
                        "tiny_trained)")
    p.add_argument("--prior_weight", type=float, default=None,
                   help="the prior captions' share of the loss: each batch also trains the features' prior captions "
                        "(extract_features --prior_captions) towards the frozen model's own prediction, keeping what "
                        "it drew for them; loss = (data + w * prior) / (1 + w); 0: off (default: 1 when the features "
                        "hold prior captions, as tiny_trained's do; a LoRA on --runtime torch)")
    p.add_argument("--dropout_target", default=None,
                   help="what a clip whose caption was dropped (--caption_dropout) trains towards: data (its own "
                        "velocity) | frozen (the frozen model's prediction for the empty prompt, so guidance's "
                        "unconditional half stays put; a LoRA on --runtime torch) (default: the preset's, "
                        f"{TRAIN_DEFAULTS['dropout_target']} for the real ones, {HYV_TINY['dropout_target']} for "
                        "tiny_trained)")
    p.add_argument("--task", default="t2v", help="t2v | i2v (i2v: features extracted with first frames)")
    p.add_argument("--caption_dropout", type=float, default=TRAIN_DEFAULTS["caption_dropout"],
                   help="probability of training a clip on the empty prompt (default "
                        f"{TRAIN_DEFAULTS['caption_dropout']})")
    p.add_argument("--output_dir", required=True, help="checkpoint, train_log.jsonl and the trained weights")
    p.add_argument("--runtime", default="torch", help="torch (one device; FSDP2 under torchrun) | jax (JAX; tpu is an alias)")
    p.add_argument("--mesh", default=None, help="--runtime jax: e.g. data=2,sequence=4 (FSDP over every device)")
    p.add_argument("--checkpoint_every", type=int, default=None, help="steps between checkpoints (default: only at "
                                                                      "the end)")
    p.add_argument("--seed", type=int, default=TRAIN_DEFAULTS["seed"], help="batches, noise, LoRA init (default 0)")
    p.add_argument("--dtype", default=None, help="fp32 | bf16: the transformer's (default: the preset's)")
    p.add_argument("--no_gradient_checkpointing", action="store_true",
                   help="keep every block's activations instead of recomputing them in the backward pass")
    # --attention (default: the preset's: ssta for the sparse checkpoints), --sparse_attn, --ssta_*: stage 2's flags
    add_settings_arguments(p, {"denoising": p}, only=("attention", "sparse_attn", "ssta"))
    p.add_argument("--quiet", action="store_true", help="no progress bar or summary line")


def train_command(args: argparse.Namespace) -> None:
    attention, ssta = resolve_attention(choose_preset(args.preset, args.model_path).preset, args.attention, args.sparse_attn,
                                        ssta_overrides(args))
    train(args.features, preset=args.preset, model_path=args.model_path, lora_rank=args.lora_rank,
          lora_alpha=args.lora_alpha, full=args.full, steps=args.steps, learning_rate=args.learning_rate,
          lora_targets=args.lora_targets, warmup_steps=args.warmup_steps, lr_schedule=args.lr_schedule,
          batch_size=args.batch_size, prior_weight=args.prior_weight,
          dropout_target=args.dropout_target, task=args.task,
          caption_dropout=args.caption_dropout, output_dir=args.output_dir, runtime=args.runtime, mesh=args.mesh,
          checkpoint_every=args.checkpoint_every, seed=args.seed, dtype=args.dtype,
          gradient_checkpointing=not args.no_gradient_checkpointing, attention=attention,
          attention_options=None if ssta is None else {"ssta": SstaConfig(**ssta)}, progress=not args.quiet)


def add_extract_features_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data_json", required=True,
                   help='a JSON list of {"path", "cap", "num_frames", "fps", "resolution": {"height", "width"}} '
                        "(MindSpeed-MM's format; paths relative to the file; a png/jpg is a 1-frame clip)")
    p.add_argument("--preset", default=None, help=f"a preset of `info` (default: the --model_path folder's, else "
                                                  f"{DEFAULT_PRESET})")
    p.add_argument("--model_path", default=None, help="diffusers-format folder or hub id; required for real presets")
    p.add_argument("--output_dir", required=True, help="the features folder (a rerun adds only the missing clips)")
    p.add_argument("--num_frames", type=int, default=None,
                   help="frames per clip, 4n+1 (--frames, --fps say which); a shorter video fails (default: the "
                        "preset's video length)")
    p.add_argument("--fps", type=float, default=None,
                   help="resample each clip to this frame rate before taking frames (MindSpeed-MM's 24: the source "
                        "frame shown at each time k/fps; within 0.1 fps none is; default: the clip's own rate)")
    p.add_argument("--frames", default="first",
                   help="first | random: the first num_frames (default) or a window picked by --frame_seed and the "
                        "clip (the same in every rerun; each clip's frame_start is recorded)")
    p.add_argument("--frame_seed", type=int, default=0, help="--frames random: its seed (default 0)")
    p.add_argument("--max_height", type=int, default=None, help="centre-crop taller buckets to this (multiple of 16)")
    p.add_argument("--max_width", type=int, default=None, help="centre-crop wider buckets to this (multiple of 16)")
    p.add_argument("--task", default=None, help="t2v | i2v: i2v adds each clip's first-frame conditions (default: "
                                                "i2v for an image-to-video preset, else t2v)")
    p.add_argument("--device", default=None, help="where the encoders run (default: cuda if present, else cpu)")
    p.add_argument("--dtype", default=None, help="fp32 | bf16 | fp16: the text and image encoders' (default: the "
                                                 "preset's)")
    p.add_argument("--vae_dtype", default="fp32", help="fp32 | bf16 (default fp32)")
    p.add_argument("--shard_size", type=int, default=32, help="clips per safetensors shard (default 32)")
    p.add_argument("--caption", default="first", help='first | random: which caption of a "cap" list is encoded '
                                                       "(default first; random: picked by the entry's position and "
                                                       "--caption_seed, the same in every rerun)")
    p.add_argument("--caption_seed", type=int, default=0, help="--caption random: its seed (default 0)")
    p.add_argument("--prior_captions", default=None,
                   help="a text file of captions the model already draws, one per line, encoded for train's "
                        "--prior_weight (what a fine-tune keeps); none: no prior captions (default: the preset's, "
                        f"none for the real ones, {len(HYV_TINY['prior_captions'])} of hyv-tiny's training captions "
                        "for tiny_trained)")
    p.add_argument("--quiet", action="store_true", help="no progress bar or summary line")


def extract_features_command(args: argparse.Namespace) -> int:
    """``extract_features``: one ``error:`` line per entry that failed (the others are written); exit code 1 if any."""
    report = extract_features(args.data_json, preset=args.preset, model_path=args.model_path,
                              output_dir=args.output_dir, num_frames=args.num_frames, max_height=args.max_height,
                              max_width=args.max_width, progress=not args.quiet, task=args.task, device=args.device,
                              dtype=args.dtype, vae_dtype=args.vae_dtype, shard_size=args.shard_size,
                              caption=args.caption, caption_seed=args.caption_seed, fps=args.fps,
                              frames=args.frames, frame_seed=args.frame_seed,
                              prior_captions=() if args.prior_captions == "none" else args.prior_captions)
    for bad in report.failed:
        where = f" ({bad['path']})" if bad["path"] is not None else ""
        print(f"error: --data_json: entry {bad['entry']}{where}: {one_line(flag_text(bad['error'], args))} (skipped)",
              file=sys.stderr)
    if not args.quiet:
        print(f"extract_features: {len(report.extracted)} extracted, {len(report.skipped)} already there, "
              f"{len(report.failed)} failed; features in {report.output_dir}", file=sys.stderr)
    return EXIT_ENTRIES_FAILED if report.failed else 0


def add_merge_lora_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--lora", required=True, help="the LoRA: a .safetensors file, or the folder holding "
                                                 "pytorch_lora_weights.safetensors (train's --output_dir)")
    p.add_argument("--model_path", default=None, help="the local diffusers-format model folder to merge into (default: "
                                                      "the preset's bundled or built weights)")
    p.add_argument("--preset", default=None, help="the model's preset (default: read from --model_path's configs, "
                                                  f"else {DEFAULT_PRESET})")
    p.add_argument("--lora_scale", type=float, default=1.0, help="the LoRA's strength, as generate --lora_scale "
                                                                  "(default 1)")
    p.add_argument("--output_dir", required=True,
                   help="a new (or empty) folder: a whole model folder with the merged transformer, the other "
                        "components hardlinked or copied; run it with generate --model_path OUTPUT_DIR")
    p.add_argument("--quiet", action="store_true", help="no summary line")


def merge_lora_command(args: argparse.Namespace) -> int:
    """``merge_lora``: the merged model folder, written atomically; one summary line on stderr."""
    merged = write_merged_model(args.lora, args.output_dir, preset=args.preset, model_path=args.model_path,
                                lora_scale=args.lora_scale)
    if not args.quiet:
        origin = f"the other components from {merged.source} ({merged.linked} files hardlinked, {merged.copied} " \
                 "copied)" if merged.source else f"{merged.preset}'s built weights saved beside it"
        print(f"merge_lora: {merged.record['lora']} (rank {merged.record['lora_rank']}, scale "
              f"{merged.record['lora_scale']:g}) merged into {merged.preset}'s transformer; {origin}; model in "
              f"{merged.output_dir} (generate --model_path {merged.output_dir})", file=sys.stderr)
    return 0


def add_prior_clips_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data_json", required=True, help="the clips of the new concept (MindSpeed-MM's data.json)")
    p.add_argument("--word", required=True, help="the new concept's word as the captions spell it (e.g. up-right)")
    p.add_argument("--known", required=True,
                   help="words the model already knows to put in its place, joined by commas (e.g. "
                        "up,right,left,down): they take turns, one prior clip per caption that holds --word")
    p.add_argument("--output_dir", required=True, help="the prior clips (videos/) and a data.json listing your clips "
                                                       "and them: give it to extract_features")
    p.add_argument("--preset", default=None, help=f"the model that draws them (default: the --model_path folder's, "
                                                  f"else {DEFAULT_PRESET})")
    p.add_argument("--model_path", default=None, help="diffusers-format folder of that model")
    p.add_argument("--seed", type=int, default=0, help="the j-th prior clip is drawn at seed SEED + j (default 0)")
    p.add_argument("--num_inference_steps", type=int, default=None, help="denoising steps (default: the preset's)")
    p.add_argument("--quiet", action="store_true", help="no progress bars or summary line")


def prior_clips_command(args: argparse.Namespace) -> int:
    """``prior_clips``: the model's own clips of the captions with the known words, and the data.json of both."""
    out = write_prior_clips(args.data_json, word=args.word, known=args.known, output_dir=args.output_dir,
                            preset=args.preset, model_path=args.model_path, seed=args.seed,
                            num_inference_steps=args.num_inference_steps, progress=not args.quiet)
    if not args.quiet:
        print(f"prior_clips: {out} lists your clips and the model's own clips of the same captions with "
              f"{args.known!r} for {args.word!r} (extract_features --data_json {out})", file=sys.stderr)
    return 0

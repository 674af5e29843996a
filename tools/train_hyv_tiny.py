"""Reproduce the hyv-tiny weights: train the VAE, then the DiT, then fine-tune the DiT for image-to-video, on the
procedural clips (about 90 min on 2 cores).

    .venv/bin/python tools/train_hyv_tiny.py --out runs/hyv-tiny [--stage vae|vae_decoder|dit|dit_i2v|all]

Writes OUT/vae_image, OUT/vae_clips and OUT/vae (diffusers format), OUT/train_log.jsonl (one record per step),
after the DiT stage the text-to-video pipeline folder OUT/pipeline, and after the image-to-video fine-tune
(``dit_i2v``: half the batches conditioned on each clip's own first frame, half text-only, so one checkpoint
serves both tasks) the complete image-to-video pipeline folder OUT/pipeline_i2v (with the seeded tiny SigLIP).
hyv_lib/weights/hyv-tiny is a copy of the last, with that log, the gate script's gates.json and a model card. The DiT reads only the VAE's
encoder, so ``--stage vae_decoder`` after a DiT run leaves the DiT valid (training is deterministic on CPU:
a rerun of the DiT stage gave bit-identical weights).
"""

from __future__ import annotations

import argparse
import os
import sys

import torch


def main() -> int:
    from hyv_lib.models.hunyuan_video15.presets import TINY_TRAINED
    from hyv_lib.tiny import data, train

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--stage", choices=["vae", "vae_decoder", "dit", "dit_i2v", "all"], default="all",
                        help="vae: all three VAE stages; vae_decoder: only the third, on OUT/vae_clips")
    parser.add_argument("--vae_image_steps", type=int, default=900,
                        help="first VAE stage: 1-frame clips (images), batch 16")
    parser.add_argument("--vae_image_lr", type=float, default=3e-4)
    parser.add_argument("--vae_steps", type=int, default=1200, help="second VAE stage: 9x64x112 clips, batch 4")
    parser.add_argument("--vae_init", default=None, help="start the video stage from this diffusers folder "
                        "(skips the image stage)")
    parser.add_argument("--vae_lr", type=float, default=1.5e-4)
    parser.add_argument("--vae_decoder_steps", type=int, default=600,
                        help="third VAE stage: the decoder alone on 9x64x112 clips, batch 4 (latents unchanged)")
    parser.add_argument("--vae_decoder_lr", type=float, default=1e-4)
    parser.add_argument("--vae_norm_floor", type=float, default=0.3)
    parser.add_argument("--vae_weight_decay", type=float, default=0.05)
    parser.add_argument("--vae_foreground_weight", type=float, default=9.0,
                        help="extra loss weight on the shape and its edge (0: plain MSE)")
    parser.add_argument("--dit_steps", type=int, default=6000)
    parser.add_argument("--dit_batch", type=int, default=16)
    parser.add_argument("--dit_lr", type=float, default=6e-4)
    parser.add_argument("--clips_per_combo", type=int, default=16)
    parser.add_argument("--i2v_steps", type=int, default=2500, help="image-to-video fine-tune of the DiT, batch "
                        "--dit_batch")
    parser.add_argument("--i2v_lr", type=float, default=3e-4)
    parser.add_argument("--i2v_prob", type=float, default=0.5, help="fraction of the fine-tune's batches that are "
                        "image-to-video (the rest keep text-to-video)")
    parser.add_argument("--i2v_init", default=None, help="fine-tune this pipeline folder (default: OUT/pipeline)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(os.cpu_count() or 1)
    os.makedirs(args.out, exist_ok=True)
    log = train.jsonl_logger(os.path.join(args.out, "train_log.jsonl"))
    preset = TINY_TRAINED
    train_combos, held_out = data.split_combos()
    if args.stage in ("vae", "vae_decoder", "all"):
        train_vae_stage(args, preset, train_combos, held_out, log, decoder_only=args.stage == "vae_decoder")
    if args.stage in ("dit", "all"):
        train_dit_stage(args, preset, train_combos, log)
    if args.stage in ("dit_i2v", "all"):
        train_i2v_stage(args, preset, train_combos, log)
    return 0


def train_vae_stage(args, preset, train_combos, held_out, log, decoder_only: bool = False) -> None:
    """Images first, then clips of the size the model is used at, then the decoder alone; OUT/vae_image,
    OUT/vae_clips and OUT/vae are saved. ``decoder_only`` runs the third stage alone, from OUT/vae_clips.

    Why two stages (measured, issue 6): images are ~13x cheaper per sample (0.53 s per batch of 16 vs 1.7 s per
    batch of 4 clips on 2 cores) and teach the spatial code (shape, colour, edges); clips smaller than 9x64x112 did not transfer (a 5-frame model never sees the third latent
    frame's causal context), and 9-frame training from scratch diverged. The decoder-only stage adds PSNR
    without moving the latents: the clip stage ended at 28.0 dB on the gate's clips, still rising.
    """
    import numpy as np
    from diffusers import AutoencoderKLHunyuanVideo15

    from hyv_lib.tiny import data, train

    def held_out_clips(frames):
        return torch.from_numpy(np.stack([data.render_clip(c, seed=10_000 + i, frames=frames)
                                          for i, c in enumerate(held_out[:16])]))

    common = dict(norm_floor=args.vae_norm_floor, weight_decay=args.vae_weight_decay,
                  foreground_weight=args.vae_foreground_weight, seed=args.seed, log=log)
    clips_folder = os.path.join(args.out, "vae_clips")
    if decoder_only:
        vae = AutoencoderKLHunyuanVideo15.from_pretrained(clips_folder)
    elif args.vae_init:  # continue from an earlier run (a fresh warmup and cosine schedule)
        vae = AutoencoderKLHunyuanVideo15.from_pretrained(args.vae_init)
    else:
        torch.manual_seed(args.seed)
        vae = AutoencoderKLHunyuanVideo15(**preset.vae)
        train.zero_init_residual_branches(vae)
        train.train_vae(vae, train_combos, steps=args.vae_image_steps, batch_size=16, lr=args.vae_image_lr,
                        clip_size=(1, 64, 64), eval_clips=held_out_clips(1), eval_every=100, stage="vae_image",
                        **common)
        vae.save_pretrained(os.path.join(args.out, "vae_image"))
    if not decoder_only:
        train.train_vae(vae, train_combos, steps=args.vae_steps, batch_size=4, lr=args.vae_lr,
                        eval_clips=held_out_clips(data.FRAMES), eval_every=100, stage="vae", **common)
        vae.save_pretrained(clips_folder)
    train.train_vae(vae, train_combos, steps=args.vae_decoder_steps, batch_size=4, lr=args.vae_decoder_lr,
                    eval_clips=held_out_clips(data.FRAMES), eval_every=100, stage="vae_decoder", decoder_only=True,
                    **dict(common, seed=args.seed + 1))  # fresh clips, not the clip stage's first ones
    vae.save_pretrained(os.path.join(args.out, "vae"))


def train_dit_stage(args, preset, train_combos, log) -> None:
    """Fix the VAE's scaling factor from the data, encode the dataset once, train the DiT, save the folder."""
    import copy

    from diffusers import AutoencoderKLHunyuanVideo15, HunyuanVideo15Transformer3DModel

    from hyv_lib.models.components import build_tiny_components
    from hyv_lib.models.hunyuan_video15.components import COMPONENTS, save_pipeline
    from hyv_lib.tiny import data, train

    vae = AutoencoderKLHunyuanVideo15.from_pretrained(os.path.join(args.out, "vae")).eval().requires_grad_(False)
    text = build_tiny_components(preset, seed=args.seed, names=["tokenizer", "text_encoder", "tokenizer_2",
                                                                 "text_encoder_2"])
    # Unit-variance latents, as the real VAE's 1.03682 gives for real videos.
    probe = torch.from_numpy(data.make_dataset(train_combos[::9], 2, seed=args.seed + 7)[0])
    vae.register_to_config(scaling_factor=float(1.0 / train.encode_latents(vae, probe, progress=False).std()))
    print(f"VAE scaling factor {vae.config.scaling_factor:.4f}")
    dataset = train.build_latent_dataset(vae, text, preset, train_combos, args.clips_per_combo, seed=args.seed)
    torch.manual_seed(args.seed + 3)
    transformer = HunyuanVideo15Transformer3DModel(**preset.transformer)
    train.train_dit(transformer, dataset["latents"], dataset["caption_index"], dataset["embeds"], dataset["negative"],
                    steps=args.dit_steps, shift=preset.flow_shift, image_tokens=preset.image_tokens,
                    image_dim=preset.image_dim, batch_size=args.dit_batch, lr=args.dit_lr, seed=args.seed, log=log)
    rest = build_tiny_components(preset, seed=args.seed, names=["scheduler", "guider"])
    components = {**text, **rest, "transformer": transformer, "vae": vae}
    # fp16 on disk keeps the folder under 30 MB (ByT5's projection alone is 4.4M parameters); loading
    # casts back to fp32.
    half = {n: copy.deepcopy(m).half() if isinstance(m, torch.nn.Module) else m for n, m in components.items()}
    save_pipeline({n: half[n] for n in COMPONENTS}, os.path.join(args.out, "pipeline"))


def train_i2v_stage(args, preset, train_combos, log) -> None:
    """Fine-tune a trained text-to-video pipeline's DiT on t2v and i2v batches; save the image-to-video folder."""
    import copy

    from hyv_lib.models.components import load_components
    from hyv_lib.models.hunyuan_video15.components import COMPONENTS, IMAGE_COMPONENTS, save_pipeline
    from hyv_lib.tiny import train

    init = args.i2v_init or os.path.join(args.out, "pipeline")
    # The SigLIP is the preset's seeded one (built in code when the folder has none), frozen like the text encoders.
    components = load_components(preset, init, COMPONENTS + IMAGE_COMPONENTS, dtype="fp32", seed=args.seed)
    text = {k: components[k] for k in ("tokenizer", "text_encoder", "tokenizer_2", "text_encoder_2")}
    dataset = train.build_latent_dataset(components["vae"], text, preset, train_combos, args.clips_per_combo,
                                         seed=args.seed, image_components={k: components[k] for k in IMAGE_COMPONENTS})
    transformer = components["transformer"]
    train.train_dit(transformer, dataset["latents"], dataset["caption_index"], dataset["embeds"], dataset["negative"],
                    steps=args.i2v_steps, shift=preset.flow_shift, image_tokens=preset.image_tokens,
                    image_dim=preset.image_dim, batch_size=args.dit_batch, lr=args.i2v_lr, seed=args.seed + 11,
                    log=log, stage="dit_i2v", first_frames=dataset["first_frames"], i2v_prob=args.i2v_prob)
    half = {n: copy.deepcopy(m).half() if isinstance(m, torch.nn.Module) else m for n, m in components.items()}
    save_pipeline(half, os.path.join(args.out, "pipeline_i2v"))


if __name__ == "__main__":
    sys.exit(main())

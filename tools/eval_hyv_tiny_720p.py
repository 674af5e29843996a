"""Measure what hyv-tiny-720p (preset ``tiny_trained_720p``) draws at 1280x720 from held-out captions.

    .venv/bin/python tools/eval_hyv_tiny_720p.py [--transformer DIR] [--vae DIR] [--prompts 15] [--every 3] \\
        [--json hyv_lib/weights/hyv-tiny/gates_720p.json]

The preset's bundled weights, or the given transformer / VAE folders (a run of tools/train_hyv_tiny_720p.py). Two
measures, both on captions never trained on at any size:

* the VAE: PSNR of encode -> tiled decode (as generation decodes) of rendered 720p clips, for hyv-tiny's own
  decoder and for the given one (the encoder is the same);
* the DiT: one 720x1280 video per held-out caption (20 steps, guidance 4.5, seed 1234 + i), read with
  hyv_lib.tiny.quality (foreground colour, direction of the centroid's motion, background) and scored against it.

Prints the rates and, with --json, saves them with every reading (the gates file the tests check).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time


def main() -> int:
    import numpy as np
    import torch

    from hyv_lib.models.families import get_preset
    from hyv_lib.models.components import load_components
    from hyv_lib.pipeline.inference import VideoPipeline
    from hyv_lib.runtimes.vae import decode_latents, to_uint8_frames
    from hyv_lib.tiny import data, quality, train

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--transformer", default=None, help="a diffusers transformer folder (default: the preset's)")
    parser.add_argument("--vae", default=None, help="a diffusers VAE folder (default: the preset's)")
    parser.add_argument("--prompts", type=int, default=15, help="held-out captions")
    parser.add_argument("--every", type=int, default=3, help="take every Nth held-out caption (more colours, shapes)")
    parser.add_argument("--vae_clips", type=int, default=4, help="held-out clips for the VAE's PSNR")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    torch.set_num_threads(2)
    preset = get_preset("tiny_trained_720p")
    names = ["tokenizer", "text_encoder", "tokenizer_2", "text_encoder_2", "scheduler"]
    components = load_components(preset, None, names + [n for n, given in (("transformer", args.transformer),
                                                                          ("vae", args.vae)) if not given])
    if args.transformer:
        from diffusers import HunyuanVideo15Transformer3DModel

        components["transformer"] = HunyuanVideo15Transformer3DModel.from_pretrained(args.transformer).float().eval()
    if args.vae:
        from diffusers import AutoencoderKLHunyuanVideo15

        components["vae"] = AutoencoderKLHunyuanVideo15.from_pretrained(args.vae).float().eval()
    height, width = preset.default_height, preset.default_width
    _, held_out = data.split_combos()
    clips = [data.render_clip(c, seed=args.seed + i, height=height, width=width)
             for i, c in enumerate(held_out[: args.vae_clips])]
    latents = train.encode_latents(components["vae"], torch.from_numpy(np.stack(clips)), batch_size=1, progress=False)
    truth = [to_uint8_frames(clip).numpy().astype(np.float32) for clip in clips]  # [F, H, W, 3]

    def decoder_psnr(vae) -> list[float]:
        """PSNR (peak 255) per clip of the tiled decode, as generation decodes, of the clips' latents."""
        decoded = [decode_latents(vae, latents[i:i + 1], tiling=True).numpy().astype(np.float32)
                   for i in range(len(clips))]
        return [round(quality.psnr(d, t, peak=255.0), 2) for d, t in zip(decoded, truth)]

    hyv_tiny_vae = load_components(get_preset("tiny_trained"), None, ["vae"])["vae"]
    per_clip = {"hyv_tiny_decoder": decoder_psnr(hyv_tiny_vae), "this_decoder": decoder_psnr(components["vae"])}
    vae_psnr = {name: round(float(np.mean(values)), 2) for name, values in per_clip.items()}
    print(f"VAE PSNR at {height}x{width}, {len(clips)} held-out clips: hyv-tiny's decoder "
          f"{vae_psnr['hyv_tiny_decoder']} dB, this one {vae_psnr['this_decoder']} dB", flush=True)
    combos = held_out[:: args.every][: args.prompts]
    pipe = VideoPipeline(preset, components)
    start = time.perf_counter()
    readings = []
    for i, combo in enumerate(combos):
        video = pipe.generate(combo.caption, height=height, width=width, video_length=9,
                              num_inference_steps=args.steps, seed=args.seed + i, progress=False)
        readings.append(quality.read_video(video.frames))
        print(f"{combo.caption!r}: {readings[-1]}", flush=True)
    rates = quality.attribute_rates(readings, combos)
    seconds = round((time.perf_counter() - start) / len(combos), 1)
    print(f"{height}x{width}: " + ", ".join(f"{k} {v:.2f}" for k, v in rates.items())
          + f" ({len(combos)} held-out captions, {seconds} s each)", flush=True)
    if args.json:
        results = dict(preset=preset.name, height=height, width=width, vae_clips=len(clips), vae_psnr_db=vae_psnr,
                       vae_psnr_db_per_clip=per_clip,
                       held_out_prompts=len(combos), every=args.every, rates=rates, seconds_per_video=seconds,
                       num_inference_steps=args.steps, guidance_scale=preset.guidance_scale, seed=args.seed,
                       readings=[dict(caption=c.caption, **dataclasses.asdict(r)) for c, r in zip(combos, readings)])
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1, default=float)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

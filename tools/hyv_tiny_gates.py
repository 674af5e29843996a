"""Measure the hyv-tiny quality gates: VAE PSNR on held-out clips, and color / direction rates of
videos generated from held-out captions (combinations never seen in training).

    .venv/bin/python tools/hyv_tiny_gates.py [--model_path hyv_lib/weights/hyv-tiny] [--json OUT.json]

Gates (issue 6): PSNR >= 28 dB; color and direction each right in >= 80% of >= 40 held-out prompts.
Exit status 1 when a gate fails.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def main() -> int:
    import numpy as np
    import torch

    from hyv_lib import data, quality, train
    from hyv_lib.models import load_components
    from hyv_lib.presets import TINY_TRAINED

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model_path", default=None, help="pipeline folder (default: the bundled hyv-tiny)")
    parser.add_argument("--json", default=None, help="also write the results here")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--guidance_scale", type=float, default=None)
    parser.add_argument("--num_inference_steps", type=int, default=None)
    args = parser.parse_args()
    torch.set_num_threads(os.cpu_count() or 1)
    preset = TINY_TRAINED
    if args.model_path is None and not os.path.isdir(preset.bundled_path):
        parser.error(f"no bundled weights at {preset.bundled_path}: pass --model_path (e.g. RUN/pipeline)")
    components = load_components(preset, args.model_path, ["tokenizer", "text_encoder", "tokenizer_2",
                                                            "text_encoder_2", "transformer", "vae", "scheduler"])
    _, held_out = data.split_combos()
    clips = torch.from_numpy(np.stack([data.render_clip(c, seed=args.seed + i) for i, c in enumerate(held_out)]))
    vae_psnr = train.evaluate_vae(components["vae"], clips)
    start = time.perf_counter()
    videos = quality.generate_videos(components, preset, [c.caption for c in held_out], seed=args.seed,
                                     guidance_scale=args.guidance_scale, num_inference_steps=args.num_inference_steps)
    seconds = time.perf_counter() - start
    readings = [quality.read_video(v) for v in videos]
    rates = quality.attribute_rates(readings, held_out)
    results = {
        "vae_psnr_held_out_db": round(vae_psnr, 2), "held_out_prompts": len(held_out),
        "rates": {k: round(v, 3) for k, v in rates.items()}, "generation_seconds": round(seconds, 1),
        "guidance_scale": args.guidance_scale or preset.guidance_scale,
        "num_inference_steps": args.num_inference_steps or preset.default_steps, "seed": args.seed,
        "misses": [{"caption": c.caption, "read": r.__dict__} for c, r in zip(held_out, readings)
                   if (r.color, r.direction) != (c.color, c.direction)],
    }
    gates = {"vae_psnr >= 28 dB": vae_psnr >= 28, "color >= 80%": rates["color"] >= 0.8,
             "direction >= 80%": rates["direction"] >= 0.8, ">= 40 prompts": len(held_out) >= 40}
    results["gates"] = gates
    print(f"VAE PSNR on {len(clips)} held-out clips: {vae_psnr:.2f} dB")
    print(f"{len(held_out)} held-out prompts, generated in {seconds:.0f} s: " +
          ", ".join(f"{k} {v:.0%}" for k, v in rates.items()))
    for name, ok in gates.items():
        print(f"  {'PASS' if ok else 'FAIL'}  {name}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0 if all(gates.values()) else 1


if __name__ == "__main__":
    sys.exit(main())

"""Read what a fine-tuned hyv-tiny DiT (tools/train_hyv_tiny_720p.py) draws from held-out captions at larger sizes.

    .venv/bin/python tools/eval_hyv_tiny_720p.py --transformer runs/hyv-tiny-720p/transformer \\
        [--sizes 288x512,720x1280] [--prompts 8] [--steps 20] [--json OUT.json]

The bundled hyv-tiny's text encoders and VAE with the given transformer folder; per size, one video per held-out
caption (combinations never trained on at any size), read with hyv_lib.tiny.quality (foreground colour, direction
of the centroid's motion, background) and scored against the caption. The flow shift per size is the one the
fine-tune trained with (3 / 5 / 7 for 64x112 / 288x512 / 720x1280). Prints one line per size and, with --json, saves
the rates and each reading.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time

#: Flow shift per size, as tools/train_hyv_tiny_720p.py trains each.
SHIFTS = {"64x112": 3.0, "288x512": 5.0, "720x1280": 7.0}


def main() -> int:
    import torch
    from diffusers import HunyuanVideo15Transformer3DModel

    from hyv_lib.base.presets import TINY_TRAINED
    from hyv_lib.models.components import load_components
    from hyv_lib.pipeline.inference import VideoPipeline
    from hyv_lib.tiny import data, quality

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--transformer", required=True, help="a diffusers transformer folder (the fine-tuned DiT)")
    parser.add_argument("--sizes", default="288x512,720x1280")
    parser.add_argument("--prompts", type=int, default=8, help="held-out captions per size")
    parser.add_argument("--every", type=int, default=1, help="take every Nth held-out caption (more colours, shapes)")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    torch.set_num_threads(2)
    components = load_components(TINY_TRAINED, None, ["tokenizer", "text_encoder", "tokenizer_2", "text_encoder_2",
                                                      "vae", "scheduler"])
    components["transformer"] = HunyuanVideo15Transformer3DModel.from_pretrained(args.transformer).float().eval()
    _, held_out = data.split_combos()
    combos = held_out[:: args.every][: args.prompts]
    results = {}
    for size in args.sizes.split(","):
        height, width = (int(x) for x in size.split("x"))
        preset = dataclasses.replace(TINY_TRAINED, flow_shift=SHIFTS.get(size, 7.0))
        pipe = VideoPipeline(preset, components)
        start = time.perf_counter()
        readings = []
        for i, combo in enumerate(combos):
            video = pipe.generate(combo.caption, height=height, width=width, video_length=9,
                                  num_inference_steps=args.steps, seed=args.seed + i, progress=False)
            readings.append(quality.read_video(video.frames))
        rates = quality.attribute_rates(readings, combos)
        results[size] = dict(rates=rates, seconds=round(time.perf_counter() - start, 1),
                             readings=[dict(caption=c.caption, **dataclasses.asdict(r)) for c, r in
                                       zip(combos, readings)])
        print(f"{size}: " + ", ".join(f"{k} {v:.2f}" for k, v in rates.items())
              + f" ({len(combos)} held-out captions, {results[size]['seconds']} s)", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

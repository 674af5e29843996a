"""Fine-tune hyv-tiny's DiT to draw at up to 1280x720 (work in progress: no shipped weights come from it yet).

    .venv/bin/python tools/train_hyv_tiny_720p.py --out runs/hyv-tiny-720p [--steps 600]

2026-11-27: a 2000-step run (niced, beside other work) reached step ~550 in 70 minutes; at step 500 its DiT drew
held-out captions at 288x512 with the right colour 6/6 and direction 3/6, at 720x1280 colour 2/6 and direction 1/6
(tools/eval_hyv_tiny_720p.py, 20 steps): better than step 100, not yet good enough to ship. --init continues from a
saved transformer_stepN.

Where it stood (2026-11-26, 2 shared cores): encoding took ~50 s (64x112), ~8 min (288x512) and ~25 min (45 clips
at 720x1280, 11-35 s each under load); a train step at 720x1280 takes 2.1 s alone. After 100 steps of the mix below,
4 held-out captions at 288x512 (10 steps) gave the background 4/4, the colour 2/4 and the direction 1/4, drawn as
many small blobs rather than one large shape: far more steps are needed than one shared session had.

hyv-tiny was trained at 64x112 only; asked for 1280x720 it paints an empty background (its RoPE positions and
shape sizes in latents are 11x past anything it saw). This script renders the same procedural clips at 64x112,
288x512 and 720x1280 (the shapes scale with the frame), encodes them once with hyv-tiny's frozen VAE (cached in
OUT/latents_*.pt, so a rerun skips the encoding), and continues training all of the DiT's weights on a mix of the
three sizes with a flow shift per size (more tokens, more shift, as the real model's 480p/720p presets do). The VAE
and the text encoders are untouched, so the DiT is the only new file: OUT/transformer (diffusers format, fp16).
Held-out captions are never trained on at any size. Log: OUT/train_log.jsonl.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import time

import numpy as np
import torch
from tqdm.auto import tqdm

#: (height, width, frames, flow shift, batch size, share of the steps)
SIZES = {
    "64x112": (64, 112, 9, 3.0, 16, 0.25),
    "288x512": (288, 512, 9, 5.0, 4, 0.35),
    "720x1280": (720, 1280, 9, 7.0, 1, 0.40),
}


def encode_size(vae, combos, name: str, clips_per_combo: int, seed: int, out: str) -> torch.Tensor:
    """Scaled latents [N, C, T, h, w] of ``clips_per_combo`` seeded clips per caption at size ``name`` (cached)."""
    from hyv_lib.tiny import data, train

    path = os.path.join(out, f"latents_{name}.pt")
    if os.path.exists(path):
        return torch.load(path)
    height, width, frames = SIZES[name][:3]
    latents = []
    for i, combo in enumerate(tqdm(combos, desc=f"encode {name}")):
        for j in range(clips_per_combo):
            clip = data.render_clip(combo, seed=seed * 1_000_003 + i * 1009 + j, height=height, width=width,
                                    frames=frames)
            latents.append(train.encode_latents(vae, torch.from_numpy(clip)[None], progress=False))
    latents = torch.cat(latents) * vae.config.scaling_factor
    torch.save(latents, path + ".tmp")
    os.replace(path + ".tmp", path)
    return latents


def main() -> int:
    from hyv_lib.base.presets import get_preset
    from hyv_lib.models.components import load_components
    from hyv_lib.tiny import data, train

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--lr", type=float, default=2e-4)
    parser.add_argument("--hd_every", type=int, default=3, help="encode every Nth training caption at 720x1280")
    parser.add_argument("--save_every", type=int, default=100, help="also keep OUT/transformer_stepN every N steps")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--init", default=None, help="start the DiT from this transformer folder (an earlier run's "
                        "OUT/transformer_stepN) instead of hyv-tiny's; the optimizer starts afresh")
    args = parser.parse_args()
    torch.set_num_threads(os.cpu_count() or 1)
    os.makedirs(args.out, exist_ok=True)
    preset = get_preset("tiny_trained")
    components = load_components(preset, None, ["tokenizer", "text_encoder", "tokenizer_2", "text_encoder_2",
                                                   "transformer", "vae"])
    if args.init:
        from diffusers import HunyuanVideo15Transformer3DModel

        components["transformer"] = HunyuanVideo15Transformer3DModel.from_pretrained(args.init).float()
    vae, transformer = components["vae"], components["transformer"]
    train_combos, _ = data.split_combos()
    embeds = train.encode_captions(components, preset, [c.caption for c in train_combos])
    negative = train.encode_captions(components, preset, [""])
    datasets = {}
    for name in SIZES:
        combos = train_combos if name != "720x1280" else train_combos[:: args.hd_every]
        index = torch.arange(len(train_combos))
        index = index if name != "720x1280" else index[:: args.hd_every]
        per = 2 if name == "64x112" else 1
        datasets[name] = (encode_size(vae, combos, name, per, args.seed, args.out), index.repeat_interleave(per))
    log = train.jsonl_logger(os.path.join(args.out, "train_log.jsonl"))
    generator = torch.Generator().manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    names = list(SIZES)
    shares = np.array([SIZES[n][5] for n in names])
    transformer.train().requires_grad_(True)
    params = list(transformer.parameters())
    optimizer = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.01)
    guard = train.SpikeGuard()
    start = time.perf_counter()
    for step in tqdm(range(args.steps), desc="DiT 720p"):
        for group in optimizer.param_groups:
            group["lr"] = train.cosine_lr(step, args.steps, args.lr, warmup=min(50, args.steps // 10 + 1))
        name = names[rng.choice(len(names), p=shares / shares.sum())]
        _, _, _, shift, batch, _ = SIZES[name]
        latents, caption_index = datasets[name]
        pick = torch.randint(len(latents), (batch,), generator=generator)
        drop = torch.rand(batch, generator=generator) < 0.1
        conditioning = train.select_conditioning(embeds, negative, caption_index[pick], drop, preset.image_tokens,
                                                 preset.image_dim)
        loss = train.dit_loss(transformer, latents[pick], conditioning, shift, generator)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm, skipped = guard.step(optimizer, params)
        log({"stage": "dit_720p", "step": step + 1, "size": name, "loss": loss.item(), "grad_norm": grad_norm,
             "skipped": skipped, "seconds": time.perf_counter() - start})
        if args.save_every and (step + 1) % args.save_every == 0 and step + 1 < args.steps:
            copy.deepcopy(transformer).half().save_pretrained(os.path.join(args.out, f"transformer_step{step + 1}"))
    transformer.eval().requires_grad_(False)
    copy.deepcopy(transformer).half().save_pretrained(os.path.join(args.out, "transformer"))
    with open(os.path.join(args.out, "sizes.json"), "w") as f:
        json.dump({n: dict(zip(("height", "width", "frames", "flow_shift", "batch", "share"), v))
                   for n, v in SIZES.items()}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

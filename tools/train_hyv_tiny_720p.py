"""Train hyv-tiny-720p (preset ``tiny_trained_720p``): hyv-tiny made to draw at 1280x720.

    .venv/bin/python tools/train_hyv_tiny_720p.py --out runs/hyv-tiny-720p   # the shipped weights: ~75 min on 2 cores
    cp -r runs/hyv-tiny-720p/transformer_720p runs/hyv-tiny-720p/vae_720p hyv_lib/weights/hyv-tiny/

hyv-tiny learned at 64x112 (a 4 x 7 latent grid, a shape about one latent wide). Asked for 1280x720 (45 x 80
latents, shapes 12-18 latents wide) it paints a background, and two things stand in the way:

* its VAE: decoding the latents of a real 720p clip gives the wrong background and a dark, colourless disc where
  the shape is (the decoder never saw a latent deep inside a large flat shape). The first stage fine-tunes the
  decoder alone on crops of 720p (and 288x512, 64x112) latents against the rendered pixels; the encoder, and so
  every latent, is unchanged.
* its DiT: 2026-11-27, 1570 steps (2.3 h on 2 cores) of fine-tuning the 3-block, 64-wide DiT on the full 45 x 80
  grid with 64x112 and 288x512 mixed in left it drawing dozens of latent-sized speckles at 720p (colour right 1/8
  held-out captions). The second stage instead re-cuts hyv-tiny's DiT to 5 x 5 latent patches (patch embedding
  averaged over the patch, output layer copied to each position: at step 0 it is hyv-tiny on a 5x pooled grid),
  so a 720p frame is 9 x 16 tokens, and fine-tunes it on 720p latents (one clip per training caption) with random
  15 x 30 crops of 288x512 latents mixed in. 1,500 steps of this took 3 minutes and already drew one shape of the
  right colour for 5/8 held-out captions (a probe on 45 of the clips).

Before both, the clips are rendered and encoded once with hyv-tiny's frozen encoder (cached in OUT; ~9 s per
720p clip on 2 cores, ~21 min for all). Held-out captions are never trained on. --vae_steps 0 or --dit_steps 0
skips a stage; --vae_init / --dit_init continue an earlier run's weights. Logs: OUT/vae_log.jsonl,
OUT/dit_log.jsonl. Reads what the result draws: tools/eval_hyv_tiny_720p.py.
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

#: name -> (height, width, clips per training caption)
SIZES = {"720x1280": (720, 1280, 1), "288x512": (288, 512, 1), "64x112": (64, 112, 2)}
#: The DiT's patch (latents per token side): 45 x 80 latents -> 9 x 16 tokens.
PATCH = 5


def clip_seed(name: str, caption_index: int, j: int) -> int:
    """The seed of clip ``j`` of training caption ``caption_index`` at size ``name``. (720p: the first run encoded
    every third caption with seed (i // 3) * 1009, the second the others with i * 1009 + 500.)"""
    if name == "720x1280":
        return (caption_index // 3) * 1009 if caption_index % 3 == 0 else caption_index * 1009 + 500
    return caption_index * 1009 + j


def encode(vae, train_combos, out: str) -> dict[str, tuple[torch.Tensor, torch.Tensor, list[int]]]:
    """name -> (scaled latents [N, C, T, h, w], caption index [N], clip seeds [N]), encoded once and cached."""
    from hyv_lib.tiny import data, train

    sets = {}
    for name, (height, width, per) in SIZES.items():
        keys = [(i, clip_seed(name, i, j)) for i in range(len(train_combos)) for j in range(per)]
        path = os.path.join(out, f"latents_{name}.pt")
        if os.path.exists(path):
            latents = torch.load(path)
        else:
            latents = []
            for i, seed in tqdm(keys, desc=f"encode {name}"):
                clip = data.render_clip(train_combos[i], seed=seed, height=height, width=width, frames=9)
                latents.append(train.encode_latents(vae, torch.from_numpy(clip)[None], progress=False))
            latents = torch.cat(latents) * vae.config.scaling_factor
            torch.save(latents, path + ".tmp")
            os.replace(path + ".tmp", path)
        sets[name] = (latents, torch.tensor([i for i, _ in keys]), [s for _, s in keys])
    return sets


def shape_crop(clip: np.ndarray, latent_hw: tuple[int, int], crop: tuple[int, int], rng,
               share: float = 0.8) -> tuple[int, int]:
    """Top-left latent corner of a ``crop`` window: with probability ``share`` one holding a random pixel of the
    shape (in the middle frame), else anywhere."""
    (lh, lw), (ch, cw) = latent_hw, crop
    mid = clip[:, clip.shape[1] // 2]
    background = np.median(np.concatenate([mid[:, 0], mid[:, -1]], 1), axis=1)
    ys, xs = np.nonzero(np.abs(mid - background[:, None, None]).sum(0) > 0.1)
    if rng.random() < share and len(ys):
        k = int(rng.integers(len(ys)))
        y0, x0 = ys[k] // 16 - int(rng.integers(ch)), xs[k] // 16 - int(rng.integers(cw))
    else:
        y0, x0 = int(rng.integers(lh - ch + 1)), int(rng.integers(lw - cw + 1))
    return int(np.clip(y0, 0, lh - ch)), int(np.clip(x0, 0, lw - cw))


def train_decoder(vae, sets, train_combos, steps: int, lr: float, seed: int, log, shape_crops: float = 0.8) -> None:
    """Fine-tune the decoder (and post-quant conv) in place on 8 x 8-latent crops (128 px) of the cached latents
    against the same window of the re-rendered clip (``shape_crops`` of them on the shape); foreground-weighted MSE
    as hyv-tiny's VAE was trained."""
    from hyv_lib.models.patches import batched_vae_attention
    from hyv_lib.tiny import data, train
    from hyv_lib.tiny.quality import psnr

    rng = np.random.default_rng(seed)
    names, shares = list(SIZES), np.array([0.6, 0.25, 0.15])
    crop = (8, 8)
    vae.train().requires_grad_(False)
    params = [p for n, p in vae.named_parameters() if n.startswith(("decoder.", "post_quant"))]
    for p in params:
        p.requires_grad_(True)
    optimizer = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    guard, start = train.SpikeGuard(), time.perf_counter()
    with batched_vae_attention():
        for step in tqdm(range(steps), desc="decoder 720p"):
            for group in optimizer.param_groups:
                group["lr"] = train.cosine_lr(step, steps, lr, warmup=20)
            name = names[rng.choice(len(names), p=shares)]
            latents, index, seeds = sets[name]
            height, width, _ = SIZES[name]
            batch_latents, batch_clips = [], []
            for _ in range(4 if name == "64x112" else 2):
                k = int(rng.integers(len(latents)))
                clip = data.render_clip(train_combos[int(index[k])], seed=seeds[k], height=height, width=width,
                                        frames=9)
                lh, lw = latents.shape[-2:]
                ch, cw = min(crop[0], lh), min(crop[1], lw)
                y0, x0 = shape_crop(clip, (lh, lw), (ch, cw), rng, shape_crops)
                batch_latents.append(latents[k, :, :, y0:y0 + ch, x0:x0 + cw] / vae.config.scaling_factor)
                batch_clips.append(torch.from_numpy(clip[:, :, y0 * 16:(y0 + ch) * 16, x0 * 16:(x0 + cw) * 16]))
            target = torch.stack(batch_clips)
            reconstruction = vae.decode(torch.stack(batch_latents)).sample
            weights = train.foreground_weights(target, 9.0)
            loss = (weights * (reconstruction - target).pow(2)).mean() / weights.mean()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            grad_norm, skipped = guard.step(optimizer, params)
            log({"stage": "decoder_720p", "step": step + 1, "size": name, "loss": loss.item(),
                 "psnr": psnr(reconstruction.detach().clamp(-1, 1), target, peak=2.0), "grad_norm": grad_norm,
                 "skipped": skipped, "seconds": time.perf_counter() - start})
    vae.eval().requires_grad_(False)


def patch_transformer(transformer, patch: int):
    """hyv-tiny's DiT with ``patch`` x ``patch`` latent patches: the patch embedding is the old one averaged over
    the patch, the output layer the old one for every position in it (diffusers orders the outputs (C, p_t, p_h,
    p_w)); every other weight is copied."""
    from diffusers import HunyuanVideo15Transformer3DModel

    config = {k: v for k, v in transformer.config.items() if not k.startswith("_")}
    model = HunyuanVideo15Transformer3DModel(**{**config, "patch_size": patch, "target_size": 960})
    state = {}
    for key, value in transformer.state_dict().items():
        if key == "x_embedder.proj.weight":
            value = value.repeat(1, 1, 1, patch, patch) / patch**2
        elif key in ("proj_out.weight", "proj_out.bias"):
            value = value.repeat_interleave(patch * patch, dim=0)
        state[key] = value
    model.load_state_dict(state)
    return model.float()


def train_dit(model, sets, embeds, negative, preset, steps: int, lr: float, batch: int, shift: float,
              share_288: float, seed: int, log, save_every: int = 0, out: str | None = None) -> None:
    """Flow-matching fine-tune in place: 720p latents, or (``share_288`` of the steps) random 15 x 30 crops of
    288x512 latents (3 x 6 tokens), ``batch`` clips a step, 10% of captions dropped for CFG; every ``save_every``
    steps a copy goes to ``out``/transformer_720p_stepN (fp16)."""
    from hyv_lib.tiny import train

    generator = torch.Generator().manual_seed(seed)
    rng = np.random.default_rng(seed)
    model.train().requires_grad_(True)
    params = list(model.parameters())
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.01)
    guard, start = train.SpikeGuard(), time.perf_counter()
    for step in tqdm(range(steps), desc="DiT 720p"):
        for group in optimizer.param_groups:
            group["lr"] = train.cosine_lr(step, steps, lr, warmup=50)
        name = "288x512" if rng.random() < share_288 else "720x1280"
        latents, index, _ = sets[name]
        pick = torch.randint(len(latents), (batch,), generator=generator)
        x0 = latents[pick]
        if name == "288x512":
            y0, x_0 = int(rng.integers(x0.shape[-2] - 3 * PATCH + 1)), int(rng.integers(x0.shape[-1] - 6 * PATCH + 1))
            x0 = x0[..., y0:y0 + 3 * PATCH, x_0:x_0 + 6 * PATCH]
        drop = torch.rand(batch, generator=generator) < 0.1
        conditioning = train.select_conditioning(embeds, negative, index[pick], drop, preset.image_tokens,
                                                 preset.image_dim)
        loss = train.dit_loss(model, x0, conditioning, shift, generator)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm, skipped = guard.step(optimizer, params)
        log({"stage": "dit_720p", "step": step + 1, "size": name, "loss": loss.item(), "grad_norm": grad_norm,
             "skipped": skipped, "seconds": time.perf_counter() - start})
        if save_every and (step + 1) % save_every == 0 and step + 1 < steps:
            copy.deepcopy(model).half().save_pretrained(os.path.join(out, f"transformer_720p_step{step + 1}"))
    model.eval().requires_grad_(False)


def main() -> int:
    from hyv_lib.models.families import get_preset
    from hyv_lib.models.components import load_components
    from hyv_lib.tiny import data, train

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--vae_steps", type=int, default=1500)
    parser.add_argument("--vae_lr", type=float, default=3e-4)
    parser.add_argument("--shape_crops", type=float, default=0.8, help="share of decoder crops on the shape")
    parser.add_argument("--vae_init", default=None, help="start the decoder from this VAE folder (an earlier run's "
                        "OUT/vae_720p) instead of hyv-tiny's; its encoder must be hyv-tiny's")
    parser.add_argument("--dit_init", default=None, help="start the DiT from this patch-5 transformer folder (an "
                        "earlier run's OUT/transformer_720p) instead of re-cutting hyv-tiny's")
    parser.add_argument("--dit_steps", type=int, default=10000)
    parser.add_argument("--dit_lr", type=float, default=3e-4)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--shift", type=float, default=5.0, help="flow shift of training (the preset's)")
    parser.add_argument("--share_288", type=float, default=0.25, help="share of DiT steps on 288x512 crops")
    parser.add_argument("--save_every", type=int, default=2500, help="keep OUT/transformer_720p_stepN every N steps")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(os.cpu_count() or 1)
    os.makedirs(args.out, exist_ok=True)
    preset = get_preset("tiny_trained")
    components = load_components(preset, None, ["tokenizer", "text_encoder", "tokenizer_2", "text_encoder_2",
                                                   "transformer", "vae"])
    train_combos, _ = data.split_combos()
    sets = encode(components["vae"], train_combos, args.out)
    vae = components["vae"]
    if args.vae_init:
        from diffusers import AutoencoderKLHunyuanVideo15

        vae = AutoencoderKLHunyuanVideo15.from_pretrained(args.vae_init).float()
    if args.vae_steps:
        train_decoder(vae, sets, train_combos, args.vae_steps, args.vae_lr, args.seed,
                      train.jsonl_logger(os.path.join(args.out, "vae_log.jsonl")), args.shape_crops)
    vae.half().save_pretrained(os.path.join(args.out, "vae_720p"))  # fp16 on disk (half the bytes); loads as fp32
    if args.dit_steps:
        embeds = train.encode_captions(components, preset, [c.caption for c in train_combos])
        negative = train.encode_captions(components, preset, [""])
        if args.dit_init:
            from diffusers import HunyuanVideo15Transformer3DModel

            model = HunyuanVideo15Transformer3DModel.from_pretrained(args.dit_init).float()
        else:
            model = patch_transformer(components["transformer"].float(), PATCH)
        train_dit(model, sets, embeds, negative, preset, args.dit_steps, args.dit_lr, args.batch, args.shift,
                  args.share_288, args.seed, train.jsonl_logger(os.path.join(args.out, "dit_log.jsonl")),
                  args.save_every, args.out)
        copy.deepcopy(model).half().save_pretrained(os.path.join(args.out, "transformer_720p"))
    with open(os.path.join(args.out, "recipe.json"), "w") as f:
        json.dump(vars(args) | {"patch": PATCH, "sizes": SIZES}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Issue 45's diagnostics: why a LoRA on hyv-tiny draws the new colour for some seeds and not others.

    .venv/bin/python tools/finetune_diagnostics.py [--sections tokens,guidance,start,curve,vae] [--output FILE]

``tokens``: how hyv-tiny's word tokenizer spells the new colour, and how much the frozen text encoder's features of
the words after it (shape, direction, background, template) change against a known colour's caption (cosine per
position, the same words aligned). ``guidance``: LoRAs of one recipe (``--set``, the sweep's; default lr 3e-3, rank 8,
500 steps on the issue's 12 clips), the held-out new-colour rate at several CFG scales. ``start``: the same LoRAs and
the base model denoising a training clip's latents noised to sigma s (10 Euler steps of the preset's schedule from s,
CFG at the preset's scale): where along the trajectory the colour is decided. ``curve``: one seed's held-out rate
and each video's green/red ratio every 100 steps of a constant-rate run. ``vae``: clips of colours hyv-tiny never saw
(:data:`VAE_COLOURS`) through its VAE and back (encode, decode), on each background: the foreground's mean colour and
its read against the training colours plus that one; a colour the VAE cannot give back no fine-tune of the DiT
can draw. Results go to ``--output`` (JSON).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import finetune_sweep as sweep  # noqa: E402

import hyv_lib  # noqa: E402
from hyv_lib.models.flow_matching import condition_channels, shift_sigmas  # noqa: E402
from hyv_lib.models.hunyuan_video15.training import TEXT_KEYS  # noqa: E402
from hyv_lib.pipeline.text import encode_prompts  # noqa: E402
from hyv_lib.runtimes.vae import decode_latents  # noqa: E402
from hyv_lib.tiny import finetune_gate as gate  # noqa: E402
from hyv_lib.tiny import quality  # noqa: E402
from hyv_lib.training import loop  # noqa: E402
from hyv_lib.training.feature_set import FeatureSet  # noqa: E402

PRESET = "tiny_trained"


#: ``vae``'s colours (RGB, 0..1): the two of :data:`hyv_lib.tiny.data.UNSEEN_COLORS` and five more around the hue circle.
VAE_COLOURS = {"orange": (1.0, 0.5, 0.05), "cyan": (0.05, 0.9, 0.9), "magenta": (0.95, 0.1, 0.85),
               "pink": (1.0, 0.45, 0.7), "violet": (0.6, 0.2, 1.0), "brown": (0.55, 0.3, 0.1), "lime": (0.6, 1.0, 0.1)}


def vae_round_trip() -> dict:
    """Each of :data:`VAE_COLOURS` as a circle moving left on each background (seed 3), through hyv-tiny's VAE and
    back: the foreground's mean RGB before and after, and the read (nearest of the training colours and that one)."""
    import numpy as np

    from hyv_lib.tiny import data

    vae = hyv_lib.load_pipeline(PRESET, progress=False).components["vae"]
    out = {}
    for name, rgb in VAE_COLOURS.items():
        palette = {**data.COLORS, name: rgb}
        rows = {}
        for background in data.BACKGROUNDS:
            # the red circle's clip, recoloured: its red channel, bg (1 - a) + red a, gives the coverage a
            red = (data.render_clip(data.Combo("red", "circle", "left", background), seed=3)[0] + 1) / 2
            bg = np.array(data.BACKGROUNDS[background], np.float32)[:, None, None, None]
            cover = (red - bg[0]) / (data.COLORS["red"][0] - bg[0])
            video = bg * (1 - cover) + np.array(rgb, np.float32)[:, None, None, None] * cover
            x = torch.from_numpy(video * 2 - 1).float()[None]
            with torch.no_grad():
                y = vae.decode(vae.encode(x).latent_dist.mode()).sample[0].clamp(-1, 1)
            frames = ((y + 1) / 2).permute(1, 2, 3, 0).numpy()
            fg = quality.foreground_rgb(frames)
            source = quality.read_video(video.transpose(1, 2, 3, 0), colors=palette).color  # the clip itself
            rows[background] = {"source_read": source,
                                "decoded_rgb": None if fg is None else [round(float(v), 2) for v in fg],
                                "read": quality.read_video(frames, colors=palette).color}
        out[name] = {"rgb": list(rgb), "by_background": rows}
        print(name, {b: r["read"] for b, r in rows.items()}, flush=True)
    return out


def tokens() -> dict:
    pipe = hyv_lib.load_pipeline(PRESET, progress=False)
    tok = pipe.components["tokenizer"]
    words = ["red", "green", "orange", "cyan", "magenta"]
    caps = [f"a {w} circle moving left on a black background" for w in words]
    pieces = {w: tok.convert_ids_to_tokens(tok(c)["input_ids"])[1:-7] for w, c in zip(words, caps)}
    enc = encode_prompts(pipe.components, pipe.preset, caps)
    e, m = enc["prompt_embeds"].float(), enc["prompt_embeds_mask"]
    out = {"pieces": pieces, "valid_tokens": dict(zip(words, m.sum(1).tolist())), "suffix_cosine_vs_red": {}}
    for i, w in enumerate(words[1:], 1):
        a0, b0 = 1 + len(pieces["red"]), 1 + len(pieces[w])  # "circle" onwards
        n = min(int(m[0].sum()) - a0, int(m[i].sum()) - b0)
        cos = torch.nn.functional.cosine_similarity(e[0, a0:a0 + n], e[i, b0:b0 + n], dim=-1)
        out["suffix_cosine_vs_red"][w] = {"mean": round(float(cos.mean()), 3), "min": round(float(cos.min()), 3),
                                          "per_position": [round(float(c), 2) for c in cos]}
    return out


def held_out_rate(pipe, guidance: float | None = None) -> tuple[int, list]:
    videos = [pipe.generate(gate.caption(c), seed=gate.PROBE_SEED + i, num_inference_steps=gate.PROBE_STEPS,
                            guidance_scale=guidance, progress=False).frames for i, c in enumerate(gate.HELD_OUT)]
    reads = gate.read_colors(videos)
    return sum(r == gate.NEW_COLOR for r in reads), videos


def green_over_red(video) -> float | None:
    rgb = quality.foreground_rgb(video)
    return None if rgb is None else round(float(rgb[1] / max(rgb[0], 1e-3)), 2)


def start_from(pipe, fs: FeatureSet, start: float, clips: int = 6) -> list:
    """Each of the first ``clips`` clips' latents noised to ``start`` and denoised with CFG: the colour read."""
    tr, vae, preset = pipe.components["transformer"], pipe.components["vae"], pipe.preset
    dtype = tr.dtype

    def text(i, negative):
        out = {}
        for key, name in TEXT_KEYS.items():
            t = (fs.negative[name] if negative else fs[i][name])
            t = t.reshape(-1) if "mask" in name else t.reshape(-1, t.shape[-1])
            out[key] = t[None].long() if "mask" in name else t[None].to(dtype)
        out["image_embeds"] = torch.zeros(1, preset.image_tokens, tr.config.image_embed_dim, dtype=dtype)
        return out

    reads = []
    sigmas = shift_sigmas(torch.linspace(1, 0, gate.PROBE_STEPS + 1), preset.flow_shift)
    sigmas = torch.cat([torch.tensor([start]), sigmas[sigmas < start - 1e-6]])
    for i in range(clips):
        x0 = fs[i]["latents"].float().reshape(1, *fs[i]["latents"].shape[-4:])
        noise = torch.randn(x0.shape, generator=torch.Generator().manual_seed(i))
        x = (1 - start) * x0 + start * noise
        cond, uncond = text(i, False), text(i, True)
        with torch.no_grad():
            for a, b in zip(sigmas[:-1], sigmas[1:]):
                h = torch.cat([x, condition_channels(x)], 1).to(dtype)
                t = (a * 1000).reshape(1).to(dtype)
                vc = tr(hidden_states=h, timestep=t, **cond, return_dict=False)[0].float()
                vu = tr(hidden_states=h, timestep=t, **uncond, return_dict=False)[0].float()
                x = x + (b - a) * (vu + preset.guidance_scale * (vc - vu))
        reads.append(quality.read_video(decode_latents(vae, x), colors=gate.PALETTE).color)
    return reads


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sections", default="tokens,guidance,start,curve")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3])
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "hyv_finetune_sweep"))
    p.add_argument("--output", default="benchmarks/results/finetune_diagnostics_2026-11-27_cpu.json")
    args = p.parse_args(argv)
    recipe = sweep.resolved({"lora_rank": 8, "steps": 500, "learning_rate": 3e-3,
                             **{k: sweep.value(v) for k, v in (s.split("=", 1) for s in args.set)}})
    torch.set_num_threads(1)
    os.makedirs(args.work, exist_ok=True)
    results = {}
    if os.path.exists(args.output):
        with open(args.output) as f:
            results = json.load(f)
    sections = args.sections.split(",")

    def save():
        with open(args.output, "w") as f:
            json.dump(results, f, indent=1)

    if "tokens" in sections:
        results["tokens"] = tokens()
        print(json.dumps(results["tokens"]["suffix_cosine_vs_red"]), flush=True)
        save()
    loras = {}
    if "vae" in sections:
        results["vae"] = vae_round_trip()
        save()
    if "guidance" in sections or "start" in sections:
        for seed in args.seeds:
            loras[seed] = sweep.one_run(args.work, "issue", recipe, seed, gate.NEW_COLOR)["lora"]
    if "guidance" in sections:
        scales = [1.0, 1.5, 2.5, 3.5, 4.5, 6.0]
        rows = {str(s): [] for s in scales}
        for seed, path in loras.items():
            pipe = hyv_lib.load_pipeline(PRESET, lora=path, progress=False)
            for s in scales:
                rows[str(s)].append(held_out_rate(pipe, s)[0])
        results["guidance"] = {"recipe": recipe, "seeds": args.seeds, "new_colour_by_guidance": rows}
        print("guidance", rows, flush=True)
        save()
    if "start" in sections:
        fs = FeatureSet(sweep.features(args.work, "issue", gate.NEW_COLOR))
        starts = [0.3, 0.5, 0.7, 0.85, 1.0]
        table = {}
        for name, path in [("base", None)] + [(f"seed {s}", p) for s, p in loras.items()]:
            pipe = hyv_lib.load_pipeline(PRESET, lora=path, progress=False)
            table[name] = {str(s): start_from(pipe, fs, s) for s in starts}
            print(name, {s: sum(r == gate.NEW_COLOR for r in v) for s, v in table[name].items()}, flush=True)
        results["start"] = {"recipe": recipe, "clips": "the issue data's first 6 (training captions)",
                            "reads_by_start_sigma": table}
        save()
    if "curve" in sections:
        seed, out, rows = args.seeds[-1], tempfile.mkdtemp(prefix="curve-", dir=args.work), []
        kwargs = {k: v for k, v in recipe.items() if k not in ("schedule", "uncond_target", "ema", "guided_target",
                                                               "steps")}
        for steps in range(100, 1001, 100):
            loop.train(sweep.features(args.work, "issue", gate.NEW_COLOR), preset=PRESET, output_dir=out, steps=steps, seed=seed,
                       progress=False, **kwargs)
            n, videos = held_out_rate(hyv_lib.load_pipeline(PRESET, lora=out, progress=False))
            rows.append({"step": steps, "new": n, "reads": gate.read_colors(videos),
                         "green_over_red": [green_over_red(v) for v in videos]})
            print(rows[-1], flush=True)
        results["curve"] = {"recipe": {**recipe, "steps": "100..1000"}, "seed": seed, "rows": rows,
                            "palette_green_over_red": {c: round(v[1] / v[0], 2) for c, v in gate.PALETTE.items()
                                                       if c in ("red", "orange", "yellow")}}
        save()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Quality frontier of SSTA on the trained tiny models: each tile setting against dense attention on held-out captions."""

from __future__ import annotations

import dataclasses
import math
import os
import platform
import time
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from ..base.errors import HyvInputError
from ..kernels.ssta import SstaConfig, density, ssta_mask, window_mask
from ..kernels.ssta_torch import ssta_inputs
from ..models.attention_qkv import context_qkv, video_qkv
from ..models.registry import adapter_for
from ..pipeline.inference import VideoPipeline
from . import data
from .quality import attribute_rates, psnr, read_video

#: The record's format tag (``benchmarks/ssta_frontier.py`` writes it; tests/test_ssta_frontier.py reads it back).
FORMAT = "hyv_lib.ssta_frontier/1"
#: The name of the dense reference row (hyv_lib's exact masked attention, the preset's ``auto`` backend).
DENSE = "dense"
#: Seed of the random q/k whose SSTA mask gives each row's ``density_random_qk`` (recomputable from the record alone).
RANDOM_QK_SEED = 0


def held_out_combos(count: int, every: int = 1) -> list[data.Combo]:
    """``count`` of the 45 held-out captions (:func:`hyv_lib.tiny.data.split_combos`), every ``every``-th: 1 as the
    step-cache frontier and hyv-tiny's gates take them, 3 as ``tools/eval_hyv_tiny_720p.py`` does."""
    held_out = data.split_combos()[1][::every]
    if not 1 <= count <= len(held_out):
        raise HyvInputError("count", f"must be in 1..{len(held_out)} (held-out captions, every {every}), got {count}")
    return held_out[:count]


def window_density(grid: tuple[int, int, int], config: SstaConfig) -> float:
    """The share of video tile pairs the sliding window alone attends on ``grid`` (0 for ``block_attn``, which has no
    window): the floor of a setting's video density (top-k tiles only add to it)."""
    config = config.for_grid(tuple(grid))
    if config.sparse_type == "block_attn":
        return 0.0
    tiles = tuple(-(-n // s) for n, s in zip(grid, config.tile))
    return float(window_mask(tiles, config.window).float().mean())


def topk_bound(grid: tuple[int, int, int], config: SstaConfig) -> float:
    """The most a setting's top-k tiles can add to the video density on ``grid`` (k per query tile, as halved by
    :meth:`SstaConfig.for_grid`, over the video tiles; 0 for ``sta``)."""
    config = config.for_grid(tuple(grid))
    if config.sparse_type == "sta":
        return 0.0
    tiles = math.prod(-(-n // s) for n, s in zip(grid, config.tile))
    return min(config.topk, tiles) / tiles


def random_qk_density(grid: tuple[int, int, int], config: SstaConfig, heads: int = 2, head_dim: int = 32,
                      seed: int = RANDOM_QK_SEED) -> float:
    """Video tile density of :func:`hyv_lib.kernels.ssta.ssta_mask` on seeded random q and k of ``grid`` (no text):
    what the mask alone gives on that grid, independent of the model's features."""
    generator = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(1, heads, math.prod(grid), head_dim, generator=generator) for _ in range(2))
    return density(ssta_mask(q, k, tuple(grid), 0, None, config))


class MaskRecorder:
    """Records the SSTA tile mask of the transformer's first sparse dual-stream block at every call, as the ``ssta``
    kernel builds it (:func:`hyv_lib.kernels.ssta_torch.ssta_inputs` on the block's q, k, v and key mask): a forward
    pre-hook on the block's attention, recomputing q and k as :class:`hyv_lib.models.hunyuan_video15.processors.JointAttnProcessor`
    does. ``seconds``: the time spent recording (subtracted from the videos' times)."""

    def __init__(self, transformer, config: SstaConfig):
        self.transformer, self.config = transformer, config
        self.densities: list[float] = []  # all tile pairs, per call (CFG batch and heads averaged)
        self.video_densities: list[float] = []  # the video x video tile pairs only
        self.grid: tuple[int, int, int] | None = None
        self.text_len: int | None = None
        self.text_valid: list[int] = []
        self.seconds = 0.0
        blocks = transformer.transformer_blocks
        first = next((i for i in range(len(blocks)) if not config.is_dense(i, len(blocks))), None)
        if first is None:
            raise HyvInputError("settings", f"{config} runs every block dense (dense_every): no SSTA mask to record")
        #: the first block that runs SSTA (the first block unless ``dense_every`` is 1)
        self.block = first
        self.handle = blocks[first].attn.register_forward_pre_hook(self.record, with_kwargs=True)

    @torch.no_grad()
    def record(self, module, args, kwargs) -> None:
        start = time.perf_counter()
        hidden = kwargs.get("hidden_states", args[0] if args else None)
        context = kwargs.get("encoder_hidden_states")
        attention_mask = kwargs.get("attention_mask")
        q, k, v = video_qkv(module, hidden, kwargs.get("image_rotary_emb"))
        if context is not None:
            cq, ck, cv = context_qkv(module, context)
            q, k, v = torch.cat([q, cq], 1), torch.cat([k, ck], 1), torch.cat([v, cv], 1)
        kv_mask = None
        if attention_mask is not None:
            kv_mask = F.pad(attention_mask.bool(), (q.shape[1] - attention_mask.shape[1], 0), value=True)
        grid = adapter_for(self.transformer).video_grid(self.transformer, hidden.shape[1])
        _, _, _, layout, mask = ssta_inputs(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), kv_mask, grid,
                                            self.config)
        n = layout.video_tiles
        self.densities.append(density(mask))
        self.video_densities.append(density(mask[:, :, :n, :n]))
        self.grid, self.text_len = tuple(grid), layout.text_len
        if kv_mask is not None:
            self.text_valid = [int(x) for x in kv_mask[:, hidden.shape[1]:].sum(1)]
        self.seconds += time.perf_counter() - start

    def take(self) -> tuple[float, float, float]:
        """(mean density, mean video density, recording seconds) since the last take, then reset."""
        out = (float(np.mean(self.densities)), float(np.mean(self.video_densities)), self.seconds)
        self.densities, self.video_densities, self.seconds = [], [], 0.0
        return out

    def remove(self) -> None:
        self.handle.remove()


def measure_sparse_frontier(pipe: VideoPipeline, combos: list[data.Combo], settings: list[tuple[str, SstaConfig]],
                            *, seed: int = 1234, height: int | None = None, width: int | None = None,
                            num_inference_steps: int | None = None, guidance_scale: float | None = None,
                            budget_s: float | None = None, log=None,
                            keep_frames: dict[str, list] | None = None) -> dict[str, Any]:
    """Generate every caption of ``combos`` (seeds ``seed``, ``seed + 1``, ...) with dense attention and with each
    SSTA setting of ``settings`` ((name, :class:`hyv_lib.SstaConfig`) pairs, tiles sized for the preset's token grid)
    through the models of ``pipe`` (torch runtime), and grade each setting against the dense videos: PSNR of the uint8
    frames (dB, peak 255; per video and pooled over the captions), the tile density SSTA used (recorded from the run:
    the first block's mask, averaged over steps, the CFG batch and heads; over all tile pairs, text included, and over
    the video tiles only), the colour / direction / background rates read from the frames
    (:func:`hyv_lib.tiny.quality.read_video`) and how often the reading equals the dense video's, and seconds per video.

    The settings take turns per caption in a rotating order (the machine's drift hits all alike); the first caption's
    times are left out of the means when more than one ran (first-call costs: allocations, FlexAttention's compile).
    ``budget_s``: start no new caption that would end past this many seconds at the mean pace so far (the record
    says how many ran). ``log``: a callable
    given one line per video. ``keep_frames``: a dict, filled with each setting's frames (name -> list of uint8
    [F, H, W, 3]). ``pipe``'s own attention is put back on its transformer at the end.
    Returns a JSON-able record (format :data:`FORMAT`; the dense row's PSNR is infinite)."""
    if pipe.runtime != "torch":
        raise HyvInputError("pipe", f"the sparse frontier runs on the torch runtime, got {pipe.runtime!r}")
    if not combos:
        raise HyvInputError("combos", "give at least one caption")
    names = [name for name, _ in settings]
    if DENSE in names or len(set(names)) != len(names):
        raise HyvInputError("settings", f"each setting needs its own name, and {DENSE!r} is the reference's")
    for name, config in settings:
        if not isinstance(config, SstaConfig):
            raise HyvInputError("settings", f"{name!r}: needs a hyv_lib.SstaConfig, got {type(config).__name__}")
    rows = [(DENSE, None), *settings]
    transformer = pipe.components["transformer"]
    per = {name: dict(frames=[], readings=[], seconds=[], denoise=[], density=[], video_density=[])
           for name, _ in rows}
    recorded: dict[str, Any] = {}
    start = time.perf_counter()
    try:
        for i, combo in enumerate(combos):
            elapsed = time.perf_counter() - start
            if budget_s is not None and i > 0 and elapsed + elapsed / i > budget_s:  # the next caption would overrun
                break
            for k in [(i + j) % len(rows) for j in range(len(rows))]:
                name, config = rows[k]
                video_pipe = VideoPipeline(pipe.preset, pipe.components, attention="auto" if config is None
                                           else "ssta", ssta=config)  # installs its attention on the transformer
                recorder = None if config is None else MaskRecorder(transformer, config)
                try:
                    video = video_pipe.generate(combo.caption, seed=seed + i, height=height, width=width,
                                                num_inference_steps=num_inference_steps,
                                                guidance_scale=guidance_scale, progress=False)
                    d, vd, extra = (1.0, 1.0, 0.0) if recorder is None else recorder.take()
                finally:
                    if recorder is not None:
                        recorder.remove()
                if recorder is not None:
                    recorded.update(grid=list(recorder.grid), text_len=recorder.text_len,
                                    text_valid=recorder.text_valid)
                row = per[name]
                row["frames"].append(video.frames)
                row["readings"].append(read_video(video.frames))
                row["seconds"].append(video.config["time_s"] - extra)
                row["denoise"].append(video.config["denoise_time_s"] - extra)
                row["density"].append(d)
                row["video_density"].append(vd)
                recorded.setdefault("video", dict(height=video.config["height"], width=video.config["width"],
                                                  video_length=video.config["video_length"],
                                                  steps=video.config["num_inference_steps"],
                                                  guidance_scale=video.config["guidance_scale"]))
                if log is not None:
                    log(f"{i + 1}/{len(combos)} {combo.caption!r} {name}: density {d:.3f} (video {vd:.3f}), "
                        f"{row['seconds'][-1]:.1f} s")
    finally:  # pipe's own attention back on the shared transformer
        VideoPipeline(pipe.preset, pipe.components, attention=pipe.attention, ssta=pipe.ssta)
    if keep_frames is not None:
        keep_frames.update({name: per[name]["frames"] for name, _ in rows})
    ran = combos[:len(per[DENSE]["frames"])]
    timed = slice(1, None) if len(ran) > 1 else slice(None)
    dense = per[DENSE]
    grid = recorded.get("grid")
    out_rows = []
    for name, config in rows:
        row = per[name]
        psnrs = [psnr(f, r, peak=255.0) for f, r in zip(row["frames"], dense["frames"])]
        mse = float(np.mean([np.mean((f.astype(np.float64) - r.astype(np.float64)) ** 2)
                             for f, r in zip(row["frames"], dense["frames"])]))
        rates = attribute_rates(row["readings"], ran)
        same = {attr: float(np.mean([getattr(a, attr) == getattr(b, attr)
                                     for a, b in zip(row["readings"], dense["readings"])]))
                for attr in ("color", "direction", "background")}
        effective = None if config is None or grid is None else config.for_grid(tuple(grid))
        out_rows.append(dict(
            name=name, ssta=None if config is None else dataclasses.asdict(config),
            sparse_type=None if config is None else config.sparse_type,
            topk_effective=None if effective is None or effective.sparse_type == "sta" else effective.topk,
            density=float(np.mean(row["density"])), video_density=float(np.mean(row["video_density"])),
            video_density_per_video=row["video_density"],
            window_density=1.0 if config is None or grid is None else window_density(grid, config),
            density_random_qk=1.0 if config is None or grid is None else random_qk_density(grid, config),
            psnr_db=float("inf") if mse == 0 else float(10 * np.log10(255.0**2 / mse)),
            psnr_db_per_video=psnrs, psnr_db_min=min(psnrs),
            color=rates["color"], direction=rates["direction"], background=rates["background"],
            same_as_dense=same,
            seconds_per_video=float(np.mean(row["seconds"][timed])),
            denoise_seconds_per_video=float(np.mean(row["denoise"][timed])),
            readings=[dict(caption=c.caption, **dataclasses.asdict(r)) for c, r in zip(ran, row["readings"])]))
    threads = torch.get_num_threads()
    return dict(format=FORMAT, preset=pipe.preset.name, **recorded.get("video", {}), grid=grid,
                text_len=recorded.get("text_len"), text_valid=recorded.get("text_valid"), seed=seed,
                prompts=len(ran), captions=[c.caption for c in ran], timed_prompts=len(ran[timed]),
                budget_s=budget_s, wall_s=round(time.perf_counter() - start, 1),
                machine=f"{platform.machine()}, {os.cpu_count()} CPU cores ({threads} torch threads), torch "
                        f"{torch.__version__} on CPU",
                date=time.strftime("%Y-%m-%d"), rows=out_rows)


def check_record(record: dict[str, Any]) -> list[str]:
    """What is inconsistent in a frontier record (empty: nothing): every SSTA row's random-q/k density recomputed
    with :func:`random_qk_density` on the record's grid, its measured video density between the window's share and
    that plus the top-k bound, a window-only row's equal to the window's share, the dense row's PSNR infinite."""
    problems = []
    if record.get("format") != FORMAT:
        return [f"format is {record.get('format')!r}, not {FORMAT!r}"]
    grid = tuple(record["grid"])
    for row in record["rows"]:
        name = row["name"]
        if row["ssta"] is None:
            if row["psnr_db"] != float("inf"):
                problems.append(f"{name}: the dense row's PSNR against itself is {row['psnr_db']}, not inf")
            continue
        config = SstaConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in row["ssta"].items()})
        again = random_qk_density(grid, config)
        if abs(again - row["density_random_qk"]) > 1e-9:
            problems.append(f"{name}: density on random q/k {row['density_random_qk']} but {again} recomputed")
        floor = window_density(grid, config)
        if abs(floor - row["window_density"]) > 1e-9:
            problems.append(f"{name}: window density {row['window_density']} but {floor} recomputed")
        top = floor + topk_bound(grid, config)
        for value in (row["video_density"], row["density_random_qk"], *row["video_density_per_video"]):
            if not floor - 1e-9 <= value <= min(1.0, top) + 1e-9:
                problems.append(f"{name}: video density {value} outside [{floor}, {min(1.0, top)}]")
        if config.sparse_type == "sta" and abs(row["video_density"] - floor) > 1e-9:
            problems.append(f"{name}: a window-only setting's density {row['video_density']} is not {floor}")
    return problems


def frontier_rows(record: dict[str, Any]) -> list[dict[str, str]]:
    """One printable row per setting: tiles, density, PSNR against dense, the three rates, seconds per video."""
    out = []
    for r in record["rows"]:
        s = r["ssta"]
        shape = "-" if s is None else (f"{s['sparse_type']} tile {'x'.join(map(str, s['tile']))}"
                                       + ("" if s["sparse_type"] == "block_attn" else
                                          f", window {'x'.join(map(str, s['window']))}")
                                       + ("" if r["topk_effective"] is None else f", top-{r['topk_effective']}"))
        out.append({"setting": r["name"], "SSTA": shape, "density (all tiles)": f"{r['density']:.3f}",
                    "density (video)": f"{r['video_density']:.3f}",
                    "PSNR vs dense dB": "inf (itself)" if r["psnr_db"] == float("inf") else f"{r['psnr_db']:.1f}",
                    "min PSNR dB": "-" if r["psnr_db_min"] == float("inf") else f"{r['psnr_db_min']:.1f}",
                    "colour": f"{r['color']:.2f}", "direction": f"{r['direction']:.2f}",
                    "background": f"{r['background']:.2f}",
                    "same reading as dense (c/d/b)": "/".join(f"{r['same_as_dense'][k]:.2f}"
                                                             for k in ("color", "direction", "background")),
                    "s/video": f"{r['seconds_per_video']:.1f}", "denoise s/video": f"{r['denoise_seconds_per_video']:.1f}"})
    return out


def markdown_table(rows: list[dict[str, str]]) -> str:
    """:func:`frontier_rows` as a Markdown table."""
    keys = list(rows[0])
    lines = ["| " + " | ".join(keys) + " |", "| " + " | ".join("---" for _ in keys) + " |"]
    return "\n".join(lines + ["| " + " | ".join(r[k] for k in keys) + " |" for r in rows])

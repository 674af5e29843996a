"""Speed-quality frontier of step caches: each setting timed and graded on the same prompts as the uncached run."""

from __future__ import annotations

import json
import os
import platform
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..base.errors import HyvInputError
from ..models.families import get_preset
from ..pipeline.calibration import magcache_schedule
from ..runtimes.deepcache import DeepCacheSchedule
from . import data
from .quality import attribute_rates, read_video

#: The file of ``benchmarks/cache_frontier.py``'s full run, next to hyv-tiny's weights (a record, like gates.json).
RESULTS_FILE = "cache_frontier.json"
_FORMAT = "hyv_lib.cache_frontier/1"


@dataclass(frozen=True)
class CacheSetting:
    """One point of the frontier: ``method`` uncached | deepcache | magcache, with ``options`` (DeepCache:
    start, end, interval; MagCache: threshold, max_skip, retention), ``no_cache_blocks`` recomputed on cached
    steps, and ``steps`` (None: the preset's). An uncached setting with fewer steps is the baseline any cache has
    to beat: it saves the same time by running fewer steps instead of cheaper ones."""

    name: str
    method: str = "uncached"
    options: dict[str, Any] = field(default_factory=dict)
    no_cache_blocks: int = 1
    steps: int | None = None

    def schedule(self, preset, num_steps: int):
        """The cache schedule of this setting for a ``num_steps`` loop (None: uncached)."""
        if self.method == "uncached":
            return None
        if self.method == "deepcache":
            return DeepCacheSchedule(num_steps, **self.options)
        if self.method == "magcache":
            return magcache_schedule(preset.name, num_inference_steps=num_steps,
                                     cache_threshold=self.options.get("threshold"),
                                     cache_max_skip=self.options.get("max_skip"),
                                     cache_retention=self.options.get("retention"),
                                     no_cache_blocks=self.no_cache_blocks)
        raise HyvInputError("method", f"must be uncached, deepcache or magcache, got {self.method!r}")


def default_settings(num_steps: int = 20) -> list[CacheSetting]:
    """The settings ``benchmarks/cache_frontier.py`` measures at hyv-tiny's 20 steps: the uncached run, two
    fewer-step runs, DeepCache at three intervals (1 block recomputed) and two with no block recomputed, and
    MagCache at two thresholds with 1 block and four with none (the thresholds bound different quantities for
    the two: :class:`hyv_lib.runtimes.magcache.MagCacheSchedule`)."""
    first = max(1, num_steps // 5)  # DeepCache's cached range starts after the first fifth (11 of 50 officially)
    deep = [CacheSetting(f"deepcache 1 block, interval {n}", "deepcache",
                         dict(start=first, end=num_steps - 2, interval=n)) for n in (2, 3, 4)]
    deep += [CacheSetting("deepcache 0 blocks, interval 4", "deepcache",
                          dict(start=first, end=num_steps - 2, interval=4), no_cache_blocks=0),
             CacheSetting("deepcache 0 blocks, interval 4 from step 2", "deepcache",
                          dict(start=2, end=num_steps, interval=4), no_cache_blocks=0)]
    mag = [CacheSetting(f"magcache 1 block, threshold {t}", "magcache", dict(threshold=t)) for t in (0.1, 0.3)]
    mag += [CacheSetting(f"magcache 0 blocks, threshold {t}, max skip {k}", "magcache",
                         dict(threshold=t, max_skip=k, retention=0.1), no_cache_blocks=0)
            for t, k in ((0.3, 3), (0.5, 3), (0.8, 4), (1.2, 5))]
    fewer = [CacheSetting(f"uncached, {n} steps", steps=n) for n in (num_steps // 2, round(num_steps * 0.35))]
    return [CacheSetting("uncached"), *fewer, *deep, *mag]


def measure_frontier(pipe, prompts: list[str], settings: list[CacheSetting], *, seed: int = 1234,
                     combos=None, progress: bool = True) -> dict[str, Any]:
    """Generate every prompt (seeds ``seed``, ``seed + 1``, ...) with every setting through ``pipe`` (a
    :class:`hyv_lib.pipeline.inference.VideoPipeline`) and grade each setting against ``settings[0]`` (the uncached
    reference): wall-time speed-up of the denoising loop and of the whole generation (sums over the prompts, one run:
    the settings take turns per prompt in a rotating order, so the machine's drift hits all of them alike, after one
    warm-up video each), colour / direction / background accuracy read from the frames
    (:func:`hyv_lib.tiny.quality.read_video`; ``combos``: the captions' attributes, default parsed from the prompts), and
    PSNR of the frames against the reference's (pooled over the prompts, peak 255)."""
    from tqdm.auto import tqdm

    if not settings or settings[0].method != "uncached" or settings[0].steps is not None:
        raise HyvInputError("settings", "the first setting must be the uncached run at the preset's steps "
                                        "(the reference of speed and PSNR)")
    if not prompts:
        raise HyvInputError("prompts", "give at least one prompt")
    if len({s.name for s in settings}) != len(settings):
        raise HyvInputError("settings", "each setting needs its own name")
    combos = [data.parse_caption(p) for p in prompts] if combos is None else combos
    steps = pipe.preset.default_steps
    schedules = [s.schedule(pipe.preset, s.steps or steps) for s in settings]

    def generate(i, prompt, k):
        s = settings[k]
        return pipe.generate(prompt, seed=seed + i, num_inference_steps=s.steps, cache=schedules[k],
                             no_cache_blocks=s.no_cache_blocks, progress=False)

    for k in range(len(settings)):  # warm-up: first-call costs (allocations, lazy imports) stay out of the times
        generate(0, prompts[0], k)
    times = {s.name: [0.0, 0.0] for s in settings}
    frames = {s.name: [] for s in settings}
    skipped = {}
    for i, prompt in enumerate(tqdm(prompts, desc="frontier", disable=not progress)):
        for k in [(i + j) % len(settings) for j in range(len(settings))]:
            s = settings[k]
            video = generate(i, prompt, k)
            times[s.name][0] += video.config["denoise_time_s"]
            times[s.name][1] += video.config["time_s"]
            frames[s.name].append(video.frames)
            skipped[s.name] = video.config.get("cache_skipped_steps", [])
    reference = settings[0].name
    rows = []
    for s in settings:
        rates = attribute_rates([read_video(v) for v in frames[s.name]], combos)
        mse = np.mean([np.mean((v.astype(np.float64) - r.astype(np.float64)) ** 2)
                       for v, r in zip(frames[s.name], frames[reference])])
        num_steps = s.steps or steps
        rows.append(dict(
            name=s.name, method=s.method, options=s.options, no_cache_blocks=s.no_cache_blocks, steps=num_steps,
            full_steps=num_steps - len(skipped[s.name]), skipped_steps=skipped[s.name],
            speedup_denoise=times[reference][0] / times[s.name][0],
            speedup_total=times[reference][1] / times[s.name][1],
            denoise_seconds=times[s.name][0], total_seconds=times[s.name][1],
            color=rates["color"], direction=rates["direction"], background=rates["background"],
            psnr_db=float("inf") if mse == 0 else float(10 * np.log10(255.0**2 / mse))))
    return dict(format=_FORMAT, preset=pipe.preset.name, prompts=len(prompts), seed=seed, num_inference_steps=steps,
                machine=f"{platform.machine()}, {os.cpu_count()} CPU cores, torch on CPU",
                date=time.strftime("%Y-%m-%d"),
                rows=rows)


def meets_goal(row: dict[str, Any], reference: dict[str, Any], speedup: float = 2.5, points: float = 5.0) -> bool:
    """The frontier's target: a denoising speed-up of at least ``speedup`` with colour and direction accuracy
    within ``points`` percentage points of the uncached run's."""
    return row["speedup_denoise"] >= speedup and all(
        100 * (reference[k] - row[k]) <= points + 1e-9 for k in ("color", "direction"))


def pareto_front(rows: list[dict[str, Any]], quality: str = "psnr_db") -> list[dict[str, Any]]:
    """The rows no other row beats in both denoising speed-up and ``quality`` (higher is better for both), by
    increasing speed-up."""
    front = [r for r in rows if not any(o["speedup_denoise"] >= r["speedup_denoise"] and o[quality] >= r[quality]
                                        and (o["speedup_denoise"], o[quality]) != (r["speedup_denoise"], r[quality])
                                        for o in rows)]
    return sorted(front, key=lambda r: r["speedup_denoise"])


def load_results(path: str | None = None) -> dict[str, Any]:
    """A frontier run written by ``benchmarks/cache_frontier.py`` (default: the one shipped with hyv-tiny)."""
    path = path or os.path.join(get_preset("tiny_trained").bundled_path, RESULTS_FILE)
    with open(path) as f:
        results = json.load(f)
    if results.get("format") != _FORMAT:
        raise HyvInputError("path", f"{path!r} is not a cache frontier file (format {_FORMAT!r})")
    return results


def frontier_table(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Rows for :func:`hyv_lib.notebook.display.html_table` (or printing): one per setting, percentages and dB rounded."""
    reference = results["rows"][0]
    return [{"setting": r["name"], "full steps": f"{r['full_steps']}/{r['steps']}",
             "speed-up (denoise)": f"{r['speedup_denoise']:.2f}x", "speed-up (total)": f"{r['speedup_total']:.2f}x",
             "colour %": f"{100 * r['color']:.1f}", "direction %": f"{100 * r['direction']:.1f}",
             "PSNR dB": "same" if r["psnr_db"] == float("inf") else f"{r['psnr_db']:.1f}",
             ">= 2.5x, -5 points": "yes" if meets_goal(r, reference) else ""} for r in results["rows"]]


def plot_frontier(results: dict[str, Any], title: str | None = None):
    """Two panels over the denoising speed-up: colour and direction accuracy (the band: within 5 points of
    uncached), and frame PSNR against the uncached video with its Pareto front. Returns the figure."""
    import matplotlib.pyplot as plt

    rows, reference = results["rows"], results["rows"][0]
    styles = {"uncached (reference)": ("k", "*"), "fewer steps": ("0.45", "D"), "deepcache": ("tab:blue", "s"),
              "magcache": ("tab:orange", "^")}

    def kind(r):
        return r["method"] if r["method"] != "uncached" else "fewer steps" if r is not reference else \
            "uncached (reference)"
    fig, (acc, quality) = plt.subplots(1, 2, figsize=(11, 4.2))
    for r in rows:
        color, marker = styles[kind(r)]
        hollow = dict(facecolors="none") if r["no_cache_blocks"] == 0 and r["method"] != "uncached" else {}
        acc.scatter(r["speedup_denoise"], 100 * r["color"], color=color, marker=marker, **hollow)
        acc.scatter(r["speedup_denoise"], 100 * r["direction"], color=color, marker=marker, alpha=0.4, **hollow)
        if r is not reference:  # the reference is the uncached video itself: infinite PSNR
            quality.scatter(r["speedup_denoise"], r["psnr_db"], color=color, marker=marker, **hollow)
    for key, style in (("color", "-"), ("direction", "--")):
        acc.axhspan(100 * reference[key] - 5, 100 * reference[key], color="0.85" if key == "color" else "0.93",
                    zorder=0)
        acc.axhline(100 * reference[key], color="0.5", ls=style, lw=0.8, label=f"uncached {key} (band: -5 points)")
    lowest = min(100 * min(r["color"], r["direction"]) for r in rows)
    acc.set_ylim(min(lowest, 100 * min(reference["color"], reference["direction"]) - 5) - 3, 101)
    for ax in (acc, quality):
        ax.axvline(2.5, color="tab:red", lw=0.8, ls=":")
        ax.set_xlabel("denoising speed-up over uncached (wall time, one run)")
    front = pareto_front([r for r in rows if r is not reference])
    quality.plot([r["speedup_denoise"] for r in front], [r["psnr_db"] for r in front], color="0.4", lw=0.8,
                 label="Pareto front")
    acc.set_ylabel("accuracy read from the frames (%)")
    acc.set_title("colour (solid) and direction (faded)")
    quality.set_ylabel("PSNR vs uncached frames (dB)")
    quality.set_title("distance from the uncached video")
    handles = [plt.Line2D([], [], color=c, marker=m, ls="", label=name) for name, (c, m) in styles.items()
               if name != "uncached (reference)"]
    handles.append(plt.Line2D([], [], color="0.5", marker="s", ls="", markerfacecolor="none",
                              label="hollow: no block recomputed"))
    quality.legend(handles=handles + [quality.get_lines()[-1]], fontsize=8, loc="lower left")
    acc.legend(fontsize=8, loc="lower left")
    fig.suptitle(title or f"{results['preset']}: {results['prompts']} held-out prompts, "
                          f"{results['num_inference_steps']} steps ({results['machine']})", fontsize=10)
    fig.tight_layout()
    return fig

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
from ..base.stats import rate_counts, wilson_interval
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


def accuracy_interval(results: dict[str, Any], row: dict[str, Any], attribute: str,
                      confidence: float = 0.95) -> tuple[float, float, float]:
    """A row's ``attribute`` accuracy (color or direction) and its Wilson interval over the run's prompts, in
    percent: (rate, low, high). At 45 prompts one prompt is 2.2 points and the 95% interval of a rate near 90% spans
    about 20 points, so settings a few points apart are not ranked by the run."""
    n = results["prompts"]
    low, high = wilson_interval(rate_counts(row[attribute], n), n, confidence)
    return 100 * row[attribute], 100 * low, 100 * high


def frontier_table(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Rows for :func:`hyv_lib.notebook.display.html_table` (or printing): one per setting, numbered as in
    :func:`plot_frontier`, accuracies with their Wilson 95% intervals over the prompts, percentages and dB
    rounded."""
    reference = results["rows"][0]

    def accuracy(r, key):
        rate, low, high = accuracy_interval(results, r, key)
        return f"{rate:.1f} [{low:.0f}, {high:.0f}]"

    return [{"#": i, "setting": r["name"], "full steps": f"{r['full_steps']}/{r['steps']}",
             "speed-up (denoise)": f"{r['speedup_denoise']:.2f}x", "speed-up (total)": f"{r['speedup_total']:.2f}x",
             "colour % [95% CI]": accuracy(r, "color"), "direction % [95% CI]": accuracy(r, "direction"),
             "PSNR dB": "same" if r["psnr_db"] == float("inf") else f"{r['psnr_db']:.1f}",
             ">= 2.5x, -5 points": "yes" if meets_goal(r, reference) else ""}
            for i, r in enumerate(results["rows"])]


def plot_frontier(results: dict[str, Any], title: str | None = None):
    """Three panels, one row per setting (numbered as in :func:`frontier_table`, its speed-up in its label): colour
    and direction accuracy with Wilson 95% intervals over the prompts (shaded: the uncached run's interval; dotted:
    5 points under uncached, the target), and frame PSNR against the uncached video over the denoising speed-up,
    each point numbered, with the Pareto front. Returns the figure."""
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    rows, reference = results["rows"], results["rows"][0]
    styles = {"uncached (reference)": ("k", "*"), "fewer steps": ("0.45", "D"), "deepcache": ("tab:blue", "s"),
              "magcache": ("tab:orange", "^")}

    def kind(r):
        return r["method"] if r["method"] != "uncached" else "fewer steps" if r is not reference else \
            "uncached (reference)"

    def hollow(r):
        return r["no_cache_blocks"] == 0 and r["method"] != "uncached"

    height = max(4.2, 0.3 * len(rows) + 1.8)
    fig = plt.figure(figsize=(13, height))
    grid = fig.add_gridspec(1, 4, width_ratios=[1, 1, 0.12, 1.45], wspace=0.06)
    colour = fig.add_subplot(grid[0])
    direction, quality = fig.add_subplot(grid[1], sharey=colour), fig.add_subplot(grid[3])
    y = np.arange(len(rows))
    for ax, key, name in ((colour, "color", "colour"), (direction, "direction", "direction")):
        rate0, low0, high0 = accuracy_interval(results, reference, key)
        ax.axvspan(low0, high0, color="0.9", zorder=0)
        ax.axvline(rate0, color="0.5", lw=0.8)
        ax.axvline(rate0 - 5, color="tab:red", lw=0.8, ls=":")
        for i, r in zip(y, rows):
            rate, low, high = accuracy_interval(results, r, key)
            c, m = styles[kind(r)]
            ax.errorbar(rate, i, xerr=[[rate - low], [high - rate]], color=c, marker=m, ms=6, capsize=2, lw=1,
                        mfc="white" if hollow(r) else c)
        ax.set(xlim=(52, 100), xticks=range(60, 101, 10), xlabel=f"% of the {results['prompts']} prompts",
               title=f"{name} read right")
        ax.grid(axis="x", color="0.93")
    colour.set_yticks(y, [f"{i}  {r['name']}  ({r['speedup_denoise']:.2f}x)" for i, r in zip(y, rows)], fontsize=8)
    colour.set_ylim(len(rows) - 0.5, -0.5)  # the table's order, top to bottom
    direction.tick_params(axis="y", labelleft=False)
    front = pareto_front([r for r in rows if r is not reference])
    quality.plot([r["speedup_denoise"] for r in front], [r["psnr_db"] for r in front], color="0.6", lw=0.8, zorder=0)
    points = [(i, r) for i, r in zip(y, rows) if r is not reference]  # the uncached video itself: infinite PSNR
    for i, r in points:
        c, m = styles[kind(r)]
        quality.scatter(r["speedup_denoise"], r["psnr_db"], color=c, marker=m, s=36,
                        facecolors="white" if hollow(r) else c)
        # the number on the left where a faster point sits just to the right of this one
        crowded = any(0 < o["speedup_denoise"] - r["speedup_denoise"] < 0.15 and abs(o["psnr_db"] - r["psnr_db"]) < 1.2
                      for _, o in points)
        quality.annotate(str(i), (r["speedup_denoise"], r["psnr_db"]), textcoords="offset points",
                         xytext=(-6, 3) if crowded else (5, 3), ha="right" if crowded else "left", fontsize=8)
    quality.axvline(2.5, color="tab:red", lw=0.8, ls=":")
    quality.margins(x=0.08)
    quality.yaxis.tick_right()
    quality.yaxis.set_label_position("right")
    quality.set(xlabel="denoising speed-up over uncached (wall time, one run)",
                ylabel="PSNR vs uncached frames (dB)", title="distance from the uncached video")
    handles = [Line2D([], [], color=c, marker=m, ls="", label=name) for name, (c, m) in styles.items()
               if name != "uncached (reference)"]
    handles += [Line2D([], [], color="0.3", marker="s", ls="", markerfacecolor="white",
                       label="hollow: no block recomputed"),
                Line2D([], [], color="0.6", lw=0.8, label="Pareto front (PSNR)"),
                Line2D([], [], color="tab:red", lw=0.8, ls=":", label="2.5x; left: uncached - 5 points"),
                plt.Rectangle((0, 0), 1, 1, color="0.9", label="left: uncached's 95% interval")]
    quality.legend(handles=handles, fontsize=7, loc="lower left")
    fig.suptitle(title or f"{results['preset']}: {results['prompts']} held-out prompts, "
                          f"{results['num_inference_steps']} steps ({results['machine']}); bars: Wilson 95% intervals",
                 fontsize=10)
    fig.subplots_adjust(left=0.27, right=0.95, top=1 - 0.72 / height, bottom=0.8 / height)
    return fig

"""MagCache-style adaptive step cache: the schedule (a calibrated per-step curve decides which steps reuse DeepCache's cache) and its calibration files."""

from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass, field
from typing import Any

from ..base.checks import as_number
from ..base.errors import HyvInputError
from ..base.files import atomic_path, ensure_output_dir
from .deepcache import block_speedup

#: The decision's defaults (``--cache_threshold``, ``--cache_max_skip``, ``--cache_retention``). MagCache's public
#: script for HunyuanVideo (the first version) uses a threshold of 0.24 (or 0.12) with K = 6 (or 4) and a retention of
#: 0.2, but its threshold bounds a different quantity (see :class:`MagCacheSchedule`); ours was set on hyv-tiny's
#: shipped curve, where 0.1 lets single steps in the middle of the 20 reuse the cache (6 of them), and K = 3.
DEFAULT_THRESHOLD = 0.1
DEFAULT_MAX_SKIP = 3
DEFAULT_RETENTION = 0.2
#: The calibrations shipped next to a preset's bundled weights (``hyv_lib/weights/hyv-tiny/``), one per
#: ``no_cache_blocks`` (this name for 1, ``magcache_calibration_no_cache_blocks_0.json`` for 0, ...).
CALIBRATION_FILE = "magcache_calibration.json"
#: The prompt and seed of a calibration run unless others are given: one sample, as MagCache calibrates.
CALIBRATION_PROMPT = "a red circle moving right on a gray background"
CALIBRATION_SEED = 0
_FORMAT = "hyv_lib.magcache_calibration/1"
QUANTITY = ("mean over the video tokens (both CFG branches) of ||c_t - c_(t-1)|| / ||c_(t-1)||, c_t = the tokens "
            "entering the last no_cache_blocks blocks at step t of an uncached run; step 0: 0")


def full_steps(curve: list[float] | tuple[float, ...], threshold: float, max_skip: int,
               retention: float) -> list[int]:
    """The steps that run every block, by MagCache's rule on ``curve`` (see :class:`MagCacheSchedule`)."""
    n = len(curve)
    keep = max(1, math.floor(retention * n + 1e-9))  # MagCache: int(retention_ratio * steps); step 0 has no cache
    full, drift, error, skipped = [], 0.0, 0.0, 0
    for step in range(n):
        if step < keep:
            full.append(step)
            continue
        drift += curve[step]  # how far the cached tokens are from this step's, at most (triangle inequality)
        error += drift  # each skipped step adds its own staleness to the latents
        skipped += 1
        if error < threshold and skipped <= max_skip:
            continue
        full.append(step)
        drift, error, skipped = 0.0, 0.0, 0
    return full


@dataclass(frozen=True)
class MagCacheSchedule:
    """Which steps run every block ("full") and which reuse DeepCache's cache, decided from a calibrated curve.

    Follows MagCache (Ma et al., 2025, "MagCache: Fast Video Generation with Magnitude-Aware Cache",
    arXiv:2506.09045; the rule as in its public HunyuanVideo code): an offline, prompt-independent per-step curve
    calibrated once from one uncached run; the first ``retention`` fraction of the steps always run full; after that
    each step adds its estimated skip error to an accumulator, and the step reuses the cache while the accumulated
    error stays under ``threshold`` and at most ``max_skip`` consecutive steps have been skipped; otherwise it runs
    full and the accumulators restart.

    What differs, and why: MagCache skips the whole block stack and reuses its *residual*, and it calibrates the
    magnitude ratio of successive residuals, gamma_t (a skip from step a to t is wrong by about 1 - prod gamma).
    Here the skip is DeepCache's cached step: it reuses the *tokens entering the last* ``no_cache_blocks`` *blocks*
    and recomputes those blocks and the output layer with the fresh timestep. What such a step gets wrong is how
    far those tokens moved since the last full step, so the curve is their relative change between consecutive
    steps, ``curve[t] = mean_tokens ||c_t - c_(t-1)|| / ||c_(t-1)||`` (:data:`QUANTITY`), measured on an all-full run
    (:func:`calibrate`). Tokens cached at step a and used at step t are off by about ``sum(curve[a+1..t])`` (the
    triangle inequality per token, up to the change of the norms), which replaces MagCache's ``|1 - prod gamma|``;
    as in MagCache, each skipped step adds that staleness to the accumulated error. A threshold therefore means
    something else than MagCache's, and the published values do not carry over. The comparison is strict
    (``error < threshold``; MagCache's code uses ``<=``), so ``threshold=0`` runs every step full: exactly the
    uncached result.

    The decision depends only on the step index and the curve, so it is made before the loop (``full_steps``) and
    :class:`hyv_lib.runtimes.deepcache.DeepCacheStep` runs it unchanged: on the TPU runtime a host-side branch between the two
    programs DeepCache already compiles (no third program, nothing recompiled per step), and torch, TPU and every
    Ulysses rank skip the same steps. ``calibration`` (not compared) is the metadata of the curve's calibration, for
    records.
    """

    curve: tuple[float, ...]
    threshold: float = DEFAULT_THRESHOLD
    max_skip: int = DEFAULT_MAX_SKIP
    retention: float = DEFAULT_RETENTION
    calibration: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)
    num_steps: int = field(init=False)
    full_steps: list[int] = field(init=False, repr=False)

    def __post_init__(self):
        curve = tuple(float(c) for c in self.curve)
        if not curve or any(not math.isfinite(c) or c < 0 for c in curve):
            raise ValueError(f"curve must be a non-empty list of finite numbers >= 0, got {list(self.curve)!r}")
        check_number("threshold", self.threshold, low=0.0)
        if not isinstance(self.max_skip, int) or isinstance(self.max_skip, bool) or self.max_skip < 1:
            raise ValueError(f"max_skip must be an integer >= 1, got {self.max_skip!r}")
        check_number("retention", self.retention, low=0.0, high=1.0)
        object.__setattr__(self, "curve", curve)
        object.__setattr__(self, "num_steps", len(curve))
        object.__setattr__(self, "full_steps", full_steps(curve, self.threshold, self.max_skip, self.retention))

    @classmethod
    def from_calibration(cls, calibration: "MagCacheCalibration", threshold: float = DEFAULT_THRESHOLD,
                         max_skip: int = DEFAULT_MAX_SKIP, retention: float = DEFAULT_RETENTION) -> "MagCacheSchedule":
        """The schedule of a calibration's curve."""
        meta = {k: v for k, v in calibration.to_json().items() if k != "curve"}
        return cls(calibration.curve, threshold, max_skip, retention, calibration=meta)

    @property
    def cached_steps(self) -> list[int]:
        """The steps that reuse the cache (0-based)."""
        full = set(self.full_steps)
        return [s for s in range(self.num_steps) if s not in full]

    def is_full(self, step: int) -> bool:
        """True if ``step`` (0-based) runs the whole network and refreshes the cache."""
        if not 0 <= step < self.num_steps:
            raise IndexError(f"step {step} outside 0..{self.num_steps - 1}")
        return step in self.full_steps

    def cached_in(self, steps: int) -> int:
        """How many of the first ``steps`` steps reuse the cache."""
        return sum(1 for s in self.cached_steps if s < steps)

    def block_speedup(self, num_blocks: int, no_cache_blocks: int = 1) -> float:
        """Upper bound on the speed-up from skipping blocks alone (as :meth:`DeepCacheSchedule.block_speedup`)."""
        return block_speedup(self.num_steps, len(self.full_steps), num_blocks, no_cache_blocks)

    def describe(self) -> str:
        """The schedule in a few words, for messages."""
        return f"magcache threshold {self.threshold}, max skip {self.max_skip}, retention {self.retention}"

    def settings(self) -> dict[str, Any]:
        """The generation_config.json fields of this schedule (the CLI flags' names)."""
        return dict(cache_method="magcache", cache_threshold=self.threshold, cache_max_skip=self.max_skip,
                    cache_retention=self.retention, cache_calibration=self.calibration.get("path"))


def check_number(name: str, value: Any, low: float, high: float | None = None) -> None:
    """A MagCache setting: a finite number in [low, high) (HyvInputError naming ``name`` otherwise)."""
    if value is None:
        raise HyvInputError(name, "must be a number, got None")
    as_number(name, value, low=low, high=high)


# ----------------------------------------------------------------------------------------------- calibration
@dataclass(frozen=True)
class MagCacheCalibration:
    """A calibrated curve (:data:`QUANTITY`, one value per step) and what it was measured on. Saved as a small
    JSON file (:meth:`save`, :func:`load_calibration`); a schedule (:meth:`MagCacheSchedule.from_calibration`) needs
    the preset, step count, flow shift and ``no_cache_blocks`` of the run to match (:meth:`check`)."""

    preset: str
    num_inference_steps: int
    flow_shift: float
    no_cache_blocks: int
    curve: tuple[float, ...]
    guidance_scale: float | None = None
    height: int | None = None
    width: int | None = None
    video_length: int | None = None
    prompt: str = CALIBRATION_PROMPT
    seed: int = CALIBRATION_SEED
    runtime: str = "torch"
    path: str | None = field(default=None, compare=False)  # the file it was read from, if any

    def to_json(self) -> dict[str, Any]:
        from .. import __version__

        data = {k: v for k, v in dataclasses.asdict(self).items() if k != "path"}
        data["curve"] = list(self.curve)
        return dict(format=_FORMAT, quantity=QUANTITY, **data, hyv_lib_version=__version__,
                    **({"path": self.path} if self.path else {}))

    def save(self, path: str) -> str:
        """Write the calibration as JSON, atomically; returns ``path``."""
        ensure_output_dir(os.path.dirname(os.path.abspath(path)), "output")
        data = {k: v for k, v in self.to_json().items() if k != "path"}
        with atomic_path(path) as tmp:
            with open(tmp, "w") as f:
                json.dump(data, f, indent=2)
                f.write("\n")
        return path

    def check(self, preset: str, num_inference_steps: int, flow_shift: float, no_cache_blocks: int,
              argument: str = "cache_calibration") -> None:
        """HyvInputError naming ``argument`` unless this calibration was measured for these settings."""
        where = self.path or "the calibration"
        for name, mine, theirs in (("preset", self.preset, preset),
                                   ("num_inference_steps", self.num_inference_steps, num_inference_steps),
                                   ("flow_shift", self.flow_shift, flow_shift),
                                   ("no_cache_blocks", self.no_cache_blocks, no_cache_blocks)):
            if mine != theirs:
                raise HyvInputError(argument, f"{where} was calibrated with {name} {mine!r} but this run has "
                                              f"{theirs!r}; calibrate for it: python -m hyv_lib calibrate_cache "
                                              f"--preset {preset} --num_inference_steps {num_inference_steps} "
                                              f"--flow_shift {flow_shift} --no_cache_blocks {no_cache_blocks} "
                                              "--output PATH.json")


def load_calibration(path: str, argument: str = "cache_calibration") -> MagCacheCalibration:
    """Read a calibration file written by :meth:`MagCacheCalibration.save` (HyvInputError naming ``argument`` if it
    is missing or malformed)."""
    if not isinstance(path, (str, os.PathLike)) or not os.path.isfile(path):
        raise HyvInputError(argument, f"no calibration file at {path!r} (write one with python -m hyv_lib "
                                      "calibrate_cache --output PATH.json)")
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as err:
        raise HyvInputError(argument, f"{path!r} is not valid JSON ({err})") from None
    if not isinstance(data, dict) or data.get("format") != _FORMAT:
        raise HyvInputError(argument, f"{path!r} is not a hyv_lib magcache calibration (format {_FORMAT!r})")
    names = [f.name for f in dataclasses.fields(MagCacheCalibration) if f.name != "path"]
    try:
        calibration = MagCacheCalibration(**{k: data[k] for k in names if k in data}, path=os.path.abspath(path))
        curve = tuple(float(c) for c in calibration.curve)
        steps = calibration.num_inference_steps
    except (TypeError, ValueError) as err:
        raise HyvInputError(argument, f"{path!r} lacks or mangles a field ({err})") from None
    if len(curve) != steps or any(not math.isfinite(c) or c < 0 for c in curve):
        raise HyvInputError(argument, f"{path!r}: its curve must hold {steps} numbers >= 0, one per step")
    return dataclasses.replace(calibration, curve=curve)


def calibration_file_name(no_cache_blocks: int = 1) -> str:
    """The file name of a shipped calibration for ``no_cache_blocks`` (:data:`CALIBRATION_FILE` for 1)."""
    stem, ext = os.path.splitext(CALIBRATION_FILE)
    return CALIBRATION_FILE if no_cache_blocks == 1 else f"{stem}_no_cache_blocks_{no_cache_blocks}{ext}"


def bundled_calibration(preset, no_cache_blocks: int = 1) -> str | None:
    """The calibration file shipped with a preset's bundled weights for ``no_cache_blocks``, or None."""
    folder = preset.bundled_path
    path = None if folder is None else os.path.join(folder, calibration_file_name(no_cache_blocks))
    return path if path is not None and os.path.isfile(path) else None


# ------------------------------------------------------------------------------------------- settings and flags
def calibration_path(preset, num_inference_steps: int, flow_shift: float, no_cache_blocks: int,
                     calibration: str | None) -> str | None:
    """The calibration file a MagCache run uses: ``calibration`` (checked against the run), else the one shipped with
    the preset's bundled weights when it fits the run, else None for a tiny preset (it is calibrated on the fly,
    :func:`hyv_lib.pipeline.calibration.schedule_for`); a real preset needs a file (HyvInputError naming
    ``--cache_calibration``)."""
    if calibration is not None:
        found = load_calibration(calibration)
        found.check(preset.name, num_inference_steps, flow_shift, no_cache_blocks)
        path = found.path
    else:
        path = bundled_calibration(preset, no_cache_blocks)
        if path is not None:
            shipped = load_calibration(path)
            if (shipped.num_inference_steps, shipped.flow_shift, shipped.no_cache_blocks) != \
                    (num_inference_steps, flow_shift, no_cache_blocks):
                path = None
        if path is None and not preset.is_tiny:
            raise HyvInputError("cache_calibration", f"`cache_method` magcache on {preset.name} needs a calibration "
                                                     "file: write one once with python -m hyv_lib calibrate_cache "
                                                     f"--preset {preset.name} --model_path ... --num_inference_steps "
                                                     f"{num_inference_steps} --output PATH.json, then pass "
                                                     "--cache_calibration PATH.json")
    return path

"""What one video costs on rented hardware: cited hourly list prices, a run's seconds by part, and the layout rule."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from ..base.errors import HyvInputError


@dataclass(frozen=True)
class Price:
    """One published hourly price: ``usd_per_hour`` for ``machine`` (what the hour buys) on ``system`` (a key of
    :data:`PRICES`' systems: ``v5e-8``, ``v5p-8``, ``v6e-8``, ``H100``, ``H200``), in ``region``, as read from
    ``source`` (a URL) on ``read`` (ISO date). ``note`` says who transcribed it and from where, when not the seller."""

    system: str
    usd_per_hour: float
    machine: str
    region: str
    source: str
    read: str
    note: str = ""


#: SkyPilot's catalog of Google Cloud prices (generated from Google's Cloud Billing Catalog), the revision read.
SKYPILOT_GCP = ("https://github.com/skypilot-org/skypilot-catalog/blob/006059e0f18acb1341e22a27751e9f80df6ba92f/"
                "catalogs/v8/gcp/vms.csv")
#: A dataset of GPU prices with each row's source and the date it was checked.
SILYBENCH = "https://github.com/tgarg01/silybench-data/blob/main/derived/csv/gpu_prices.csv"
#: A dataset of hyperscaler GPU prices read from the vendors' price APIs.
DATARECEIPTS = "https://github.com/datareceipts/data-receipts/blob/main/109-gpu-pricing/hyperscalers.json"
#: A daily screen of GPU rental prices per provider, with the time of each read.
COMPUTE_SCREENER = "https://github.com/renshuBTC/compute-screener/blob/main/data/gpu_providers_latest.csv"

#: On-demand list prices, no commitment, no discount; none is Google's, NVIDIA's or a cloud's own page as read here:
#: each is a public transcription of it, named in ``note``. Prices change; ``read`` is the date of the figure.
#:
#: :meta hide-value:
PRICES: tuple[Price, ...] = (
    Price("v5e-8", 9.60, "tpu-v5litepod-8: 8 TPU v5e chips, one host", "us-central1", SKYPILOT_GCP, "2026-11-28",
          "SkyPilot's catalog row (Google Cloud list price, 1.20 $ per chip-hour)"),
    Price("v5p-8", 16.80, "tpu-v5p-8: 4 TPU v5p chips (8 TensorCores), one host", "us-central1", SKYPILOT_GCP,
          "2026-11-28", "SkyPilot's catalog row (Google Cloud list price, 4.20 $ per chip-hour)"),
    Price("v6e-8", 21.60, "tpu-v6e-8: 8 TPU v6e chips, one host", "us-central1", SKYPILOT_GCP, "2026-11-28",
          "SkyPilot's catalog row (Google Cloud list price, 2.70 $ per chip-hour)"),
    Price("H100", 10.9791, "Google Cloud a3-highgpu-1g: 1 H100 80GB, 26 vCPU, 234 GiB", "us-central1", SILYBENCH,
          "2026-09-26", "silybench-data's row, summed from Google's Cloud Billing Catalog (GPU + vCPU + RAM); the "
          "1-GPU shape is sold as Spot or Flex-start only, this is its on-demand-equivalent list price"),
    Price("H100", 4.29, "Lambda 1x H100 SXM", "", SILYBENCH, "2026-09-25",
          "silybench-data's row, read from https://lambda.ai/pricing"),
    Price("H100", 6.88, "1/8 of AWS p5.48xlarge (8 H100 SXM, 55.04 $ per hour)", "us-east-1", DATARECEIPTS,
          "2026-11-09", "data-receipts' row from AWS's price list; AWS rents the 8 GPUs together"),
    Price("H200", 5.40, "Nebius H200, per GPU", "", COMPUTE_SCREENER, "2026-10-24",
          "compute-screener's read of Nebius's price (one price); Google Cloud rents H200s (a3-ultragpu-8g) only 8 at "
          "a time, and no citable one-GPU price of it was found"),
)


def prices(system: str) -> list[Price]:
    """The :data:`PRICES` of ``system`` (``v5e-8``, ``v5p-8``, ``v6e-8``, ``H100``, ``H200``), in table order."""
    found = [p for p in PRICES if p.system == system]
    if not found:
        known = ", ".join(dict.fromkeys(p.system for p in PRICES))
        raise HyvInputError("system", f"no price for {system!r}; priced: {known}")
    return found


# --------------------------------------------------------------------------------------------- one video
def run_seconds(parts: Mapping[str, float | None]) -> dict[str, Any]:
    """Add up a run's parts (name -> seconds; None where nothing measured or cited it). Returns ``known_s`` (the sum
    of the known parts), ``missing`` (the names of the unknown ones, in order) and ``parts``; a negative or non-finite
    number is refused, naming ``parts``."""
    known, missing = 0.0, []
    for name, seconds in parts.items():
        if seconds is None:
            missing.append(name)
            continue
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not math.isfinite(seconds) \
                or seconds < 0:
            raise HyvInputError("parts", f"{name!r} must be a number of seconds >= 0 or None, got {seconds!r}")
        known += seconds
    return dict(known_s=known, missing=missing, parts=dict(parts))


def run_dollars(seconds: float, usd_per_hour: float) -> float:
    """Dollars for ``seconds`` of a machine rented at ``usd_per_hour`` (billed by the second, as Google Cloud and the
    GPU clouds above bill; a minimum charge is not modelled)."""
    for name, value in (("seconds", seconds), ("usd_per_hour", usd_per_hour)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise HyvInputError(name, f"must be a number >= 0, got {value!r}")
    return seconds / 3600 * usd_per_hour


# ------------------------------------------------------------------------------------------- layout rule
#: Bytes a device sends per byte of an HLO collective's result: a ring all-reduce sends twice what an all-gather or
#: all-to-all of the same result sends (both (n - 1) / n of it, the all-reduce once to reduce and once to gather).
WIRE_FACTORS = {"all-reduce": 2.0, "all-gather": 1.0, "all-to-all": 1.0, "collective-permute": 1.0}


def wire_bytes(collectives: Sequence[Mapping[str, Any]]) -> float:
    """A compiled program's collectives (``[{"kind", "bytes", ...}]``, as ``python -m hyv_lib compile --json``
    reports them) as one number that orders layouts by traffic: result bytes, all-reduces counted twice
    (:data:`WIRE_FACTORS`)."""
    total = 0.0
    for c in collectives:
        if c.get("kind") not in WIRE_FACTORS:
            raise HyvInputError("collectives", f"unknown kind {c.get('kind')!r}; known: {', '.join(WIRE_FACTORS)}")
        total += WIRE_FACTORS[c["kind"]] * c["bytes"]
    return total


#: Compute bounds closer than this share of the smallest count as equal in :func:`choose_layout`: the planner's
#: compute model is a FLOP count at peak, not a timing, and no layout has been timed on a TPU.
COMPUTE_TOLERANCE = 0.05


def choose_layout(candidates: Sequence[Mapping[str, Any]],
                  compute_tolerance: float = COMPUTE_TOLERANCE) -> dict[str, Any]:
    """The layout rule: among ``candidates`` (one per layout, each with ``fits``: the compiler says every program of
    it fits, ``compute_s``: the planner's compute bound, ``wire_bytes``: :func:`wire_bytes` of its compiled program,
    ``memory_bytes``: its compiled per-device total), keep those that fit, keep those whose compute bound is within
    ``compute_tolerance`` of the smallest kept one, and take the one with the fewest wire bytes (then the least
    memory). Returns that candidate (a copy) with ``reason``; HyvInputError naming ``candidates`` when none fits."""
    if not 0 <= compute_tolerance < 1:
        raise HyvInputError("compute_tolerance", f"must be a fraction in [0, 1), got {compute_tolerance!r}")
    fitting = [c for c in candidates if c["fits"]]
    if not fitting:
        raise HyvInputError("candidates", "no layout fits: compile a larger slice or a smaller size")
    fastest = min(c["compute_s"] for c in fitting)
    close = [c for c in fitting if c["compute_s"] <= fastest * (1 + compute_tolerance)]
    best = min(close, key=lambda c: (c["wire_bytes"], c["memory_bytes"]))
    reason = (f"{len(fitting)} of {len(candidates)} fit; {len(close)} within {compute_tolerance:.0%} of the smallest "
              f"compute bound; fewest collective bytes")
    return dict(best, reason=reason)

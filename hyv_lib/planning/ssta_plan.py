"""The planner's denoising step with dense attention and with SSTA, one row each, for the book's tables."""

from __future__ import annotations

from typing import Any, Mapping

from ..base.presets import Preset, video_size
from ..kernels.ssta import SstaConfig
from ..parallel.sharding import DEFAULT_STRATEGY
from .costs import as_preset
from .hardware import get_chip, layout_label
from .planner import bounds


def attention_rows(preset: Preset | str = "720p_t2v", chip: str = "v6e", n_chips: int = 8, height: int | None = None,
                   width: int | None = None, video_length: int | None = None,
                   mesh_shape: str | Mapping[str, int] | None = None, rules: str = DEFAULT_STRATEGY,
                   ssta: SstaConfig = SstaConfig()) -> list[dict[str, Any]]:
    """One step of ``preset`` (default size: its 16:9 bucket, e.g. 720x1280x121) on ``n_chips`` x ``chip`` planned
    twice by :func:`hyv_lib.planning.planner.bounds`: with dense attention, then with SSTA (``ssta``'s options; the
    official ones by default). A TPU runs ``rules`` on ``mesh_shape`` (default: the planner's layout); a GPU the
    Ulysses layout with whole weights. Both rows use the preset's own batch (the CFG pair for ``720p_t2v``).

    Each row: ``attention``, the tile ``density`` the FLOPs use (1.0 for dense: every pair of the S tokens; for SSTA
    the upper bound over the tiled sequence, top-k tiles counted outside the window,
    :func:`hyv_lib.planning.sparse.tile_density`, with ``window_density``, exact, and ``uniform_density``, the
    expectation for uniformly random top-k tiles, which the random-input H200 measurement matched), PFLOP per step
    and of its attention, TFLOP per device, the lower bounds (``compute_s``, ``hbm_s``, ``interconnect_s``, ``step_s``
    and ``limit``: SSTA's kernel reads each attended K/V tile once per 384-token query tile, about 384 FLOP per byte
    at bf16, under v6e's ridge, so its bound can turn HBM-bound) and ``vs_dense``, the dense row's ``step_s`` over
    this one's.

    These are model numbers, not measurements, and the compiler cannot check their attention part: XLA's cost
    analysis prices a Pallas call (Splash, or a block-sparse SSTA kernel) only by its operands' bytes, not its FLOPs,
    so a compiled step's FLOP count leaves the attention out, dense or sparse.
    """
    preset = as_preset(preset)
    height, width, video_length = video_size(preset, height, width, video_length)
    if get_chip(chip).device_kind is None:  # a GPU: the Ulysses layout, as plan_step plans it
        rules, mesh_shape = "replicated", None
    rows = []
    for attention in ("flash", ssta):
        b = bounds(preset, height, width, video_length, chip, n_chips, rules, mesh_shape=mesh_shape,
                   attention=attention)
        density = b["ssta"]
        rows.append(dict(
            preset=preset.name, height=height, width=width, frames=video_length, chip=chip, n_chips=n_chips,
            layout=layout_label(b["mesh"], b["rules"]), attention="ssta" if density else "dense",
            density=density["density"] if density else 1.0,
            window_density=density["window"] if density else None,
            uniform_density=density["uniform"] if density else None,
            pflop_per_step=b["flops"] / 1e15, attention_pflop=b["attention_flops"] / 1e15,
            tflop_per_device=b["flops_per_device"] / 1e12, fits=b["fits"],
            compute_s=b["compute_s"], hbm_s=b["hbm_s"], interconnect_s=b["interconnect_s"], step_s=b["step_s"],
            limit=b["limit"]))
    for row in rows:
        row["vs_dense"] = rows[0]["step_s"] / row["step_s"]
    return rows

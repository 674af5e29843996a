"""Accelerators the planner knows (peak FLOP/s, HBM, interconnect) and the published step times it cites."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..base.errors import HyvInputError

# ------------------------------------------------------------------------------------------------ hardware
NO_INTERCONNECT_SOURCE = (
    "interconnect bandwidth: no sourced per-chip ICI/NVLink figure in the project's reference notes "
    "(/work/shared/reference), so it is None and the interconnect bound is not computed"
)


@dataclass(frozen=True)
class Chip:
    """Peak numbers of one accelerator chip, as published (see ``source``). Units: FLOP/s, bytes, bytes/s.

    ``interconnect_bandwidth`` is the published *bidirectional* ICI (TPU) or NVLink (GPU) bytes/s per
    chip, None where no sourced figure was available; a chip can send at most half of it, which is what
    :func:`bounds` divides the bytes sent by. ``devices_per_chip`` is how many JAX devices the chip shows (2 on TPU7x).
    """

    name: str
    peak_bf16_flops: float
    hbm_bytes: float
    hbm_bandwidth: float
    interconnect_bandwidth: float | None
    devices_per_chip: int
    source: str
    #: JAX's ``device.device_kind`` for a TPU (picks its Splash tiles, :data:`hyv_lib.kernels.splash.CHIP_BLOCK_SIZES`);
    #: None for a GPU (flash-attention tiles, :data:`hyv_lib.planning.costs.FLASH_BLOCK_Q`).
    device_kind: str | None = None


GIB = 2**30

#: The accelerators the planner knows (TPU v4/v5e/v5p/v6e/v7x, GPUs), each with its peak bf16 FLOP/s, HBM and
#: bandwidth and the source of those numbers.
CHIPS: dict[str, Chip] = {
    "v4": Chip("TPU v4", 275e12, 32 * GIB, 1200e9, None, 1,
               "Google Cloud TPU docs, docs.cloud.google.com/tpu/docs/v4: 275 TFLOP/s bf16, 32 GiB HBM2, 1,200 GB/s "
               "per chip (no per-chip ICI figure there).", "TPU v4"),
    "v5e": Chip("TPU v5e", 197e12, 16 * GIB, 819e9, 400e9, 1,
                "Google Cloud TPU docs, docs.cloud.google.com/tpu/docs/v5e: 197 TFLOP/s bf16, 16 GB HBM (16 GiB: "
                "17.2e9 bytes in JAX's pallas tpu_info), 819 GB/s, 400 GB/s bidirectional ICI per chip.", "TPU v5 lite"),
    "v5p": Chip("TPU v5p", 459e12, 95 * GIB, 2765e9, 1200e9, 1,
                "Google Cloud TPU docs, docs.cloud.google.com/tpu/docs/v5p: 459 TFLOP/s bf16, 95 GiB usable HBM "
                "(96 physical), 2,765 GB/s, 1,200 GB/s bidirectional ICI per chip.", "TPU v5"),
    "v6e": Chip("TPU v6e (Trillium)", 918e12, 32 * GIB, 1638e9, 800e9, 1,
                "Google Cloud TPU docs, docs.cloud.google.com/tpu/docs/v6e: 918 TFLOP/s bf16, 32 GB HBM (32 GiB: "
                "34.4e9 bytes in JAX's pallas tpu_info), 1,638 GB/s, 800 GB/s bidirectional ICI per chip.", "TPU v6 lite"),
    "v7x": Chip("TPU7x (Ironwood)", 2307e12, 192 * GIB, 7.37e12, None, 2,
                "Google Cloud TPU docs, docs.cloud.google.com/tpu/docs/tpu7x: 2,307 TFLOP/s bf16, 192 GiB HBM; "
                "bandwidth ~7.37 TB/s from Hot Chips reporting (7.3 TB/s) and gpu-tpu-pedia (7,380 GB/s) "
                "[secondary]. Caveat: JAX shows each of the 2 chiplets as its own device, so a 'v7x-8' slice in "
                "maxdiffusion/gpu-tpu-pedia is 4 chips = 8 devices; this planner counts physical chips.", "TPU7x"),
    "H100": Chip("NVIDIA H100 SXM", 989.4e12, 81559 * 2**20, 3.35e12, 900e9, 1,
                 "NVIDIA H100 datasheet figures as quoted by glennklockwood.com/garden/processors/h100 "
                 "[secondary]: 989.4 TFLOP/s dense bf16 (1,978.9 with 2:4 sparsity), 80 GB HBM3 (the card reports "
                 "81,559 MiB = 79.6 GiB to nvidia-smi), 3.35 TB/s; "
                 "NVLink 4: 900 GB/s bidirectional per GPU (18 links x 50 GB/s, NVIDIA)."),
    "H200": Chip("NVIDIA H200 SXM", 989e12, 143771 * 2**20, 4.8e12, 900e9, 1,
                 "third-party spec pages (itkb.uw.cz, saulelectric) [secondary]: ~989 TFLOP/s dense bf16 (same "
                 "GH100 die as H100), 141 GB HBM3e (the card reports 143,771 MiB = 140.4 GiB to nvidia-smi), "
                 "4.8 TB/s; NVLink 4 900 GB/s (MLCommons inference v4.1 "
                 "H200-SXM-141GBx8 system description)."),
}

#: Published HunyuanVideo-1.5 step times (720p, 121 frames, 50 steps, CFG 6, one CFG step = batch 2), each with the
#: layout it was measured on: ``mesh`` (data/tensor/sequence sizes) and ``rules`` (the weight placement, named as
#: hyv_lib's rule sets). All from the gpu-tpu-pedia project (single author, unverified; its hardware labels are partly
#: inconsistent). Its TPU script builds one mesh for every run, (tp, dp, sp) = (jax.device_count(), 1, 1), so every v6e
#: time is tensor=8 (``tpu/HunyuanVideo-1.5/generate_hunyuan_torchax_staged/stage2_transformer.py``); its default weight
#: rules replicate the row-parallel fc2/proj weights, what hyv_lib calls ``tp_replicated_out``. Its GPU runs launch
#: ``torchrun --nproc_per_node=8`` with ``initialize_parallel_state(sp=WORLD_SIZE)``: Ulysses over sequence=8, whole
#: weights on every GPU. :func:`hyv_lib.planning.planner.plan_table` puts a time only on the row of its own layout.
CITED_STEP_TIMES: list[dict[str, Any]] = [
    dict(preset="720p_t2v", chip="v6e", n_chips=8, seconds=8.12, label="plain Megatron TP, stock Splash",
         mesh=dict(data=1, tensor=8, sequence=1), rules="tp",
         source="gpu-tpu-pedia tpu/HunyuanVideo-1.5/README.md (v6e-8) [U]"),
    dict(preset="720p_t2v", chip="v6e", n_chips=8, seconds=7.29, label="TP with fc2/proj replicated, stock Splash",
         mesh=dict(data=1, tensor=8, sequence=1), rules="tp_replicated_out",
         source="gpu-tpu-pedia tpu/HunyuanVideo-1.5/README.md (v6e-8) [U]"),
    dict(preset="720p_t2v", chip="v6e", n_chips=8, seconds=5.81, label="custom exp2 Splash kernel",
         mesh=dict(data=1, tensor=8, sequence=1), rules="tp_replicated_out",
         source="gpu-tpu-pedia tpu/HunyuanVideo-1.5/README.md (v6e-8; the script's default fc2/proj-replicated "
                "rules) [U]"),
    dict(preset="720p_t2v", chip="H100", n_chips=8, seconds=5.2, label="FlashAttention-2 + Ulysses",
         mesh=dict(data=1, tensor=1, sequence=8), rules="replicated",
         source="gpu-tpu-pedia tpu/HunyuanVideo-1.5/README.md and generate_hunyuan_gpu_staged/README.md (8xH100, "
                "Ulysses sequence=8; that README's run log also lists 5.10-5.11 s for 2025-12-03) [U]"),
]

#: Published pairs of whole 50-step runs (seconds per video), each pair from one document, so that its ratio compares
#: like with like (same code, date and settings apart from the change). A pair's ``before`` run is that document's own
#: baseline and need not equal the :data:`CITED_STEP_TIMES` row of the same configuration: the migration guide's
#: uncached TPU run is about 350 s (7.0 s/step) where the README's stock-Splash step is 7.29 s (365 s). MFU of a
#: configuration is computed against :data:`CITED_STEP_TIMES`; these pairs serve only their own ratios. Same project
#: and caveats as above.
CITED_RUN_PAIRS: list[dict[str, Any]] = [
    dict(name="deepcache", preset="720p_t2v", chip="v6e", n_chips=8, steps=50, before_s=350.0, after_s=203.0,
         before="uncached, K/V zeroing", after="DeepCache 11/45/4", mesh=dict(data=1, tensor=8, sequence=1),
         source="gpu-tpu-pedia tpu/HunyuanVideo-1.5/generate_hunyuan_torchax_staged/TORCHAX_MIGRATION_GUIDE.md "
                "(v6e-8, about 350 s -> about 203 s) [U]"),
    dict(name="segment_ids", preset="720p_t2v", chip="v6e", n_chips=8, steps=50, before_s=350.0, after_s=435.0,
         before="K/V zeroing", after="Splash segment ids", mesh=dict(data=1, tensor=8, sequence=1),
         source="gpu-tpu-pedia tpu/HunyuanVideo-1.5/generate_hunyuan_torchax_staged/TORCHAX_MIGRATION_GUIDE.md "
                "(v6e-8, about 350 s vs about 435 s) [U]"),
    dict(name="deepcache", preset="720p_t2v", chip="H100", n_chips=8, steps=50, before_s=260.0, after_s=142.0,
         before="FlashAttention-2 + Ulysses", after="DeepCache 11/45/4", mesh=dict(data=1, tensor=1, sequence=8),
         source="gpu-tpu-pedia tpu/HunyuanVideo-1.5/generate_hunyuan_gpu_staged/README.md and "
                "docs/deepcache_explained.md (8xH100, about 260 s -> about 142 s) [U]"),
]


def cited_pair(name: str, chip: str) -> dict[str, Any]:
    """The :data:`CITED_RUN_PAIRS` entry ``name`` ('deepcache', 'segment_ids') measured on ``chip``."""
    for pair in CITED_RUN_PAIRS:
        if pair["name"] == name and pair["chip"] == chip:
            return pair
    known = ", ".join(sorted({f"{p['name']} on {p['chip']}" for p in CITED_RUN_PAIRS}))
    raise HyvInputError("name", f"no cited pair {name!r} on {chip!r}; cited: {known}")


def layout_label(mesh: dict[str, int], rules: str | None = None) -> str:
    """A layout as the book's tables print it: the mesh axes above 1 ('data=2,tensor=4'; 'one device'), with the
    rule set after a space when given ('tp_replicated_out tensor=8')."""
    axes = ",".join(f"{a}={n}" for a, n in mesh.items() if n > 1) or "one device"
    return f"{rules} {axes}" if rules else axes


def get_chip(chip: str | Chip) -> Chip:
    """A chip by key (``v5e``, ``v5p``, ``v6e``, ``v7x``, ``H100``, ``H200``) or a Chip passed through."""
    if isinstance(chip, Chip):
        return chip
    try:
        return CHIPS[chip]
    except KeyError:
        raise HyvInputError("chip", f"unknown chip {chip!r}; valid: {', '.join(CHIPS)}") from None


def mfu(flops: float, seconds: float, chip: str | Chip, n_chips: int) -> float:
    """Model FLOP utilisation: ``flops / (seconds x n_chips x peak bf16 FLOP/s)``."""
    check_count("n_chips", n_chips)
    if not isinstance(seconds, (int, float)) or isinstance(seconds, bool) or not seconds > 0:
        raise HyvInputError("seconds", f"must be a positive number, got {seconds!r}")
    return flops / (seconds * n_chips * get_chip(chip).peak_bf16_flops)


#: The TPU slice (libtpu topology) of n chips that the saved results use, per chip.
SLICES = {("v5e", 8): "v5e:2x4", ("v5p", 4): "v5p:2x2x1", ("v6e", 8): "v6e:2x4", ("v7x", 4): "tpu7x:2x2x1"}


def check_count(name: str, value: Any) -> None:
    """HyvInputError naming ``name`` unless ``value`` is a positive int (a string "8" or 8.0 is not)."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise HyvInputError(name, f"must be a positive integer, got {value!r}")

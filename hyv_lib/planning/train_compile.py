"""Compile the DiT's train step for a TPU slice on any machine (no TPU needed): per-device memory, fits, FLOPs.

The training twin of :mod:`hyv_lib.planning.tpu_compile`: the preset's DiT on the meta device (a LoRA attached with
:func:`hyv_lib.models.lora.add_lora` for ``train="lora"``), a compile-only
:class:`hyv_lib.runtimes.jax_train.JaxTrainStep` on a mesh of the slice's devices (FSDP, bf16 weights, fp32
optimizer state and master weights for the trainable parameters, each block recomputed in the backward pass, Splash
attention with its own backward kernels), and the very jitted update (forward + backward + AdamW) lowered and
compiled by libtpu. What it reports is the compiler's: a memory and collective check, not a timing.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import torch

from ..base.errors import HyvInputError
from ..base.presets import Preset, video_size
from ..kernels.splash import default_block_sizes, resolve_block_sizes
from ..models.families import get_preset
from ..models.lora import add_lora, parse_lora_targets
from ..models.registry import get_adapter
from ..parallel.jax_env import quiet_libtpu
from ..parallel.mesh import parse_mesh
from ..runtimes.jax_train import TRAINABLE, JaxTrainStep
from .costs import token_counts
from .hardware import CHIPS
from .hlo import xla_flops
from .tpu_compile import (
    TOPOLOGY_CHIPS,
    abstract_transformer,
    available_hbm,
    example_inputs,
    memory_lines,
    parse_hbm_oom,
    program_report,
    topology_devices,
    topology_mesh,
)

#: The LoRA of the official HunyuanVideo-1.5 trainer (``train.py``: r=8, alpha=16), on hyv_lib's default targets
#: (the attention projections of both streams in every block, :data:`hyv_lib.models.lora.DEFAULT_TARGETS`).
RECIPE_LORA_RANK = 8
RECIPE_LORA_ALPHA = 16.0


def train_layout(devices: int, heads: int, batch: int) -> dict[str, int]:
    """The mesh a train step gets by default: ``data`` = the largest count that divides both the devices and the
    batch (whole samples per data shard) and leaves a ``sequence`` axis (the rest of the devices) that divides the
    heads; sequence parallelism inside each data shard, FSDP over all of them."""
    fitting = [d for d in range(1, devices + 1) if devices % d == 0 and batch % d == 0 and heads % (devices // d) == 0]
    data = max(fitting, default=1)
    return {"data": data, "tensor": 1, "sequence": devices // data}


def train_batch(preset: Preset, height: int, width: int, video_length: int, batch_size: int,
                dtype: torch.dtype = torch.bfloat16) -> dict[str, torch.Tensor]:
    """A train step's batch of the real shapes (zeros: only shapes and dtypes reach the compiler): the forward's
    keywords for ``batch_size`` samples (t2v, 120 valid text tokens) and the velocity target."""
    batch = example_inputs(preset, height, width, video_length, batch=batch_size, dtype=dtype)
    batch.pop("timestep_r", None)
    target = torch.zeros(preset.latent_shape(height, width, video_length), dtype=torch.float32)
    return dict(batch, target=target.expand(batch_size, *target.shape[1:]))


def compile_train_step(preset: str | Preset = "720p_t2v", topology: str = "v5p:2x2x1", *, train: str = "lora",
                       lora_rank: int = RECIPE_LORA_RANK, lora_alpha: float | None = RECIPE_LORA_ALPHA,
                       height: int | None = None, width: int | None = None, video_length: int | None = None,
                       batch_size: int = 1, mesh: str | dict | None = None, remat: bool = True,
                       master_weights: bool = True, attention_options: dict | None = None,
                       num_layers: int | None = None, scan_blocks: bool = True,
                       lora_targets: str | None = None) -> dict[str, Any]:
    """Compile one train step (forward, backward and the AdamW update) of ``preset`` for the TPU slice ``topology``.

    ``train``: ``lora`` (rank ``lora_rank``, ``lora_alpha``; default the official recipe's r=8, alpha=16; on the target
    groups ``lora_targets`` of the model adapter's :attr:`~hyv_lib.models.adapter.ModelAdapter.lora_targets`, e.g.
    ``attn,mlp``; default None: :func:`hyv_lib.models.lora.target_names`' attention projections) or ``full``.
    ``batch_size`` samples per step; ``mesh`` (default :func:`train_layout`: samples over ``data``, tokens over
    ``sequence``) must use every device. Weights
    bf16; trainable parameters with fp32 master weights (``master_weights``) and fp32 AdamW moments; ``remat``
    recomputes each block in the backward pass; ``scan_blocks`` runs the blocks as one loop (one block to compile;
    off: unrolled). ``num_layers`` overrides the block count (tests). Bad input raises
    :class:`HyvInputError` naming the parameter.

    Returns what ``python -m hyv_lib compile --train ... --json`` prints: per-device bytes from the compiler's memory
    analysis (arguments = weights + optimizer state + batch; outputs = what is not donated back), the chip's HBM,
    ``fits``, the collectives in the optimised HLO (instructions: the scan's body once), FLOPs per device (Splash
    excluded: a Pallas call counts only its bytes): ``flops_per_device`` from XLA's cost analysis, which counts the
    scan over the blocks' body once, and ``matmul_flops_per_device``, the dots re-counted from the HLO with each
    loop body times its trip count (:func:`hyv_lib.planning.hlo.xla_flops`), the parameter counts and the compile
    time.
    """
    preset = get_preset(preset) if isinstance(preset, str) else preset
    if train not in TRAINABLE:
        raise HyvInputError("train", f"must be one of {', '.join(TRAINABLE)}, got {train!r}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise HyvInputError("batch_size", f"must be an integer >= 1, got {batch_size!r}")
    height, width, video_length = video_size(preset, height, width, video_length)
    devices = topology_devices(topology)
    heads = preset.transformer["num_attention_heads"]
    axes = (parse_mesh(mesh) if isinstance(mesh, str) or mesh is None else dict(mesh)) or train_layout(
        len(devices), heads, batch_size)
    jax_mesh = topology_mesh(axes, devices, topology, heads)
    if batch_size % jax_mesh.shape["data"]:
        raise HyvInputError("mesh", f"data={jax_mesh.shape['data']} does not divide `batch_size` {batch_size}")
    config = dict(preset.transformer, **({} if num_layers is None else {"num_layers": num_layers}))
    preset = preset if config == preset.transformer else dataclasses.replace(preset, transformer=config)
    model = abstract_transformer(preset)
    if lora_targets is not None and train != "lora":
        raise HyvInputError("lora_targets", f"chooses a LoRA's layers: it needs `train` lora, not {train!r}")
    if train == "lora":
        with torch.device("meta"):
            add_lora(model, lora_rank, lora_alpha, targets=lora_targets)
        torch.nn.Module.to(model, torch.bfloat16)  # not diffusers' override, which warns (see abstract_transformer)
    counts = dict(total=sum(p.numel() for p in model.parameters()),
                  trainable=sum(p.numel() for n, p in model.named_parameters() if train == "full" or "lora_" in n))
    tokens = token_counts(preset, height, width, video_length)
    with quiet_libtpu():
        try:
            step = JaxTrainStep(model, mesh=jax_mesh, trainable=train, remat=remat, master_weights=master_weights,
                                attention="splash", attention_options=attention_options,
                                adapter=get_adapter(preset.model), scan_blocks=scan_blocks)
        except ValueError as err:
            raise HyvInputError("mesh", str(err)) from None
        program = _compile(step, train_batch(preset, height, width, video_length, batch_size))
    chip = CHIPS[TOPOLOGY_CHIPS[topology.split(":")[0]]]
    chips = len({(d.process_index, tuple(d.coords)) for d in devices})
    report = dict(
        topology=topology, device_kind=devices[0].device_kind, devices=len(devices),
        processes=len({d.process_index for d in devices}), chips=chips,
        mesh={a: int(n) for a, n in jax_mesh.shape.items()}, preset=preset.name, train=train,
        lora=dict(rank=lora_rank, alpha=float(lora_rank if lora_alpha is None else lora_alpha),
                  **({} if lora_targets is None else {"targets": parse_lora_targets(
                      lora_targets, get_adapter(preset.model).lora_targets)})) if train == "lora" else None,
        batch=batch_size, size=dict(height=height, width=width, video_length=video_length), tokens=tokens,
        parameters=counts, scan_blocks=step.scan, param_dtype="bfloat16", optimizer_state="float32 (AdamW moments)"
        + (" + float32 master weights" if master_weights else ""), remat=remat,
        **{k: v for k, v in program.items() if k != "compile_error"},
        hbm_bytes_per_device=chip.hbm_bytes * chips / len(devices),
        hbm_source=f"{chip.name}, {chip.hbm_bytes / 2**30:.0f} GiB per chip, {len(devices) // chips} device(s) per "
                   f"chip: {chip.source.split(':')[0]}",
        hbm_available_per_device=available_hbm(devices[0]),
        attention=dict(backend="splash", native=program["splash_kernels"] > 0,
                       **_splash_settings(devices[0].device_kind, attention_options, tokens["joint"])),
    )
    report["fits"] = not program.get("compile_error") and (
        report["per_device_bytes"]["total"] <= report["hbm_available_per_device"])
    if program.get("compile_error"):
        report["compile_error"] = program["compile_error"]
    return report


def _compile(step: JaxTrainStep, batch: dict[str, torch.Tensor]) -> dict[str, Any]:
    """Lower and compile the update; a program too large for HBM gives a report (total = the compiler's figure, fits
    false) instead of an error."""
    import jax

    start = time.perf_counter()
    try:
        compiled = step.lower(batch).compile()
        report = program_report(compiled, time.perf_counter() - start)
        # XLA's cost analysis counts a loop's body once: the scan over the blocks would count one block. The HLO
        # re-count multiplies each loop body's dots by its trip count.
        counts = xla_flops(compiled)
        return dict(report, matmul_flops_per_device=counts["matmul"], unknown_trip_counts=counts["unknown_trip_counts"])
    except jax.errors.JaxRuntimeError as err:
        parsed = parse_hbm_oom(str(err))
        if parsed is None:
            raise
        return dict(per_device_bytes=dict(arguments=None, temporaries=None, outputs=None, code=None, total=parsed[0]),
                    collectives=[], flops_per_device=None, matmul_flops_per_device=None, unknown_trip_counts=None,
                    compiler_estimate_seconds=None, splash_kernels=0,
                    compile_seconds=round(time.perf_counter() - start, 1),
                    compile_error=str(err).splitlines()[0][:300])


def _splash_settings(device_kind: str, options: dict | None, seq_len: int) -> dict[str, Any]:
    """The kernel's compute dtype and the tiles it runs with at this sequence length (the backward kernels tile like
    the forward)."""
    import jax.numpy as jnp

    options = options or {}
    dtype = options.get("compute_dtype") or "bfloat16"
    defaults = default_block_sizes(jnp.dtype(dtype), device_kind)
    blocks = resolve_block_sizes(seq_len, *(options.get(k) or defaults[k]
                                            for k in ("block_q", "block_kv", "block_kv_compute")), jnp.dtype(dtype))
    return dict(compute_dtype=dtype, **dict(zip(("block_q", "block_kv", "block_kv_compute"), blocks)))


def format_train_report(report: dict[str, Any]) -> str:
    """The report of :func:`compile_train_step` as the CLI's table."""
    s, tok = report["size"], report["tokens"]
    mesh = " x ".join(f"{a}={n}" for a, n in report["mesh"].items())
    what = (f"LoRA r={report['lora']['rank']} alpha={report['lora']['alpha']:g}" if report["train"] == "lora"
            else "full fine-tuning")
    params = report["parameters"]
    lines = [
        f"train step of {report['preset']} at {s['height']}x{s['width']}, {s['video_length']} frames "
        f"({tok['video']:,} video + {tok['context']:,} context tokens), batch {report['batch']}: {what} "
        f"({params['trainable']:,} of {params['total']:,} parameters trained)",
        f"compiled for {report['topology']}: {report['devices']} x {report['device_kind']} on {report['chips']} chips",
        f"mesh {mesh}, FSDP; {report['param_dtype']} weights, optimizer state {report['optimizer_state']}, "
        f"remat {'per block' if report['remat'] else 'off'}; Splash "
        f"{'native (Mosaic)' if report['attention']['native'] else 'NOT native'}",
        *memory_lines(report),
    ]
    flops = report["matmul_flops_per_device"]
    lines += [f"matmul FLOPs per device and step: {'n/a' if flops is None else f'{flops:.3g}'} (XLA's dots, each "
              "loop body times its trip count; the Splash kernels are not counted)",
              f"compiled in {report['compile_seconds']:.0f} s on this machine: a memory and collective check, "
              "not a timing"]
    return "\n".join(lines)

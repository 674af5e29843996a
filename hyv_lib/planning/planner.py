"""Analytic performance and memory planner: per-device memory, roofline bounds and MFU for a preset, size, chip and mesh."""

from __future__ import annotations

import functools
import json
import math
import os
from typing import Any, Mapping, Sequence

from ..base.errors import HyvInputError
from ..base.presets import Preset, check_data_axis, video_size
from ..kernels.splash import CHIP_BLOCK_SIZES, DEFAULT_BLOCK_SIZES, PAD_HEAD_DIM
from ..kernels.ssta import SstaConfig
from ..models.families import get_preset
from ..models.registry import get_adapter
from ..parallel.mesh import default_layout, mesh_text  # the runtime's, compile's and the planner's default
from ..parallel.sharding import DEFAULT_STRATEGY
from .costs import (
    FLASH_BLOCK_Q,
    GPU_RESIDENT_TILES,
    STRATEGIES,
    activation_bytes,
    as_mesh,
    as_preset,
    attention_hbm_bytes,
    collective_bytes,
    dtype_bytes,
    model_dims,
    param_bytes,
    parameter_shapes,
    rule_set_names,
    step_batch,
    step_flops,
    token_counts,
)
from .layout import layout_costs
from .hardware import CHIPS, CITED_STEP_TIMES, NO_INTERCONNECT_SOURCE, SLICES, Chip, check_count, get_chip, mfu
from .sparse import density_summary, ssta_config

# ------------------------------------------------------------------------------ per-device plan of a layout
#: Temporaries of the compiled step (the peak of XLA's buffer assignment, read from the TPU compiler's memory report
#: at 720p): the patch embedding's output twice over, b x N_v x h, which the sequence axis does not split (the conv
#: runs before the tokens are split); the attention kernel's padded q, k, v and output for the local heads; and a
#: few copies of the local residual stream (b x N_v/sequence x h): this count is fitted, not derived.
TEMPORARY_STREAM_COPIES = 3
#: FSDP's gathered weights alive at once, in blocks: the compiler gathers a block's matrices in groups and frees each
#: after use; at both 720p and a 2-block real-width model the temporaries hold about half a block.
FSDP_GATHERED_BLOCKS = 0.5


#: Where benchmarks/tpu_compile.py saves what the TPU compiler reported (shipped with the package):
#: ``hyv_lib/compiled/tpu_compile.json`` in the installed package, as an absolute path.
#:
#: :meta hide-value:
COMPILED_RESULTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "compiled", "tpu_compile.json")


@functools.lru_cache(maxsize=1)
def _compiled_results(path: str) -> tuple[dict, ...]:
    if not os.path.exists(path):
        return ()
    with open(path) as f:
        return tuple(r for r in json.load(f).values() if "per_device_bytes" in r)


def compiled_report(preset: Preset | str, height: int, width: int, video_length: int, topology: str,
                    mesh_shape: Mapping[str, int], rules: str, enable_cache: bool = False) -> dict[str, Any] | None:
    """The TPU compiler's report (``python -m hyv_lib compile --json``) saved for exactly this configuration in
    :data:`COMPILED_RESULTS`, or None."""
    name = as_preset(preset).name
    mesh = as_mesh(mesh_shape)
    for r in _compiled_results(COMPILED_RESULTS):
        if (r["preset"] == name and r["topology"] == topology and r["sharding"] == rules and r["mesh"] == mesh
                and r["size"] == dict(height=height, width=width, video_length=video_length)
                and ("programs" in r) == enable_cache):
            return r
    return None


def device_plan(preset: Preset | str, height: int, width: int, video_length: int,
                mesh_shape: int | str | Mapping[str, int] | None = None, rules: str = DEFAULT_STRATEGY, *,
                batch: int | None = None, dtype: str = "bf16", enable_cache: bool = False,
                topology: str | None = None, attention: str | SstaConfig | None = None) -> dict[str, Any]:
    """What one device holds, computes and exchanges in one CFG step of :class:`hyv_lib.runtimes.jax_step.JaxTransformer` on a
    mesh: the planner's side of ``python -m hyv_lib compile`` (which asks the TPU compiler instead).

    ``mesh_shape``: data/tensor/sequence sizes (an int n = ``tensor=n``; or 'data=2,tensor=4'), data dividing
    ``batch`` (default the preset's: the CFG pair, or one sample for a preset with guidance 1, where any data axis is
    refused as of no use, :func:`hyv_lib.base.presets.check_data_axis`); ``rules``: ``tp``, ``tp_replicated_out``, ``fsdp`` or ``replicated``. With b = B / data samples, N_v
    video and N_c context tokens, L blocks, hidden h, MLP width f, t = tensor, s = sequence, x = dtype bytes, it
    models what the compiled HLO does (checked against the TPU compiler in tests/test_perf.py and chapter 3):

    - ``collectives`` (bytes of the collectives' results per device, as :func:`hlo_collectives` counts them):
      ``tp`` all-reduces each row-parallel output, 2 per block and stream, [b, N_v/s, h] and [b, N_c, h] (the last
      block's context stream is dead code); ``tp_replicated_out`` all-gathers the attention output instead (the
      replicated to_out then runs whole on every device) and still all-reduces the MLP output (XLA slices the
      replicated fc2 to the local columns); a sequence axis adds 4 all-to-alls per block, [b, N_v/s, h/t] each
      (q, k, v to head shards and the output back: Ulysses inside the mesh) and gathers the context stream's
      attention output over it; ``fsdp`` all-gathers every block matrix whole. Token-refiner attention outputs are
      gathered too. Single-stream blocks (HunyuanVideo's) all-reduce their one row-parallel output (proj_out,
      [b, N_v + N_c, h]) under both TP rule sets, and on any tensor axis XLA re-shards their [attention ; MLP]
      concatenation with all-to-alls (2 x [b, N_v + N_c, (h + f_s) / t] per block); nothing of the last dual block
      is dead then. ``sent_bytes`` converts them to bytes on the wire (a ring all-reduce of m bytes over n devices
      sends 2 (n-1)/n m, an all-gather or all-to-all (n-1)/n m).
    - ``flops``: attention over data x tensor x sequence (heads over tensor x sequence); block matmuls over data,
      the sequence for video tokens, and tensor only for the weights the rules split (``tp_replicated_out``'s
      to_out runs whole; ``replicated`` and ``fsdp`` without a tensor axis run every matmul whole, so their compute
      splits only over data and sequence; ``fsdp`` with one runs Q/K/V sliced to the local heads, the dual blocks'
      to_out and MLP whole, the single blocks as ``tp``). The collectives and FLOPs are
      :func:`hyv_lib.planning.layout.layout_costs`', where the single-stream blocks' sequence-axis re-layouts are.
      ``attention`` as for :func:`step_flops` (None: the preset's own; SSTA for the ``*_sparse`` presets): SSTA's attention FLOPs are the dense ones over the tiled sequence times the tile density's upper
      bound, split the same way: what a block-sparse kernel visiting only the attended tiles costs (no TPU
      measurement checks it).
    - ``per_device_bytes``: weights under the rules (exact, :func:`param_bytes`), the step's inputs (latents,
      text, masks, RoPE tables), outputs (the noise prediction; with ``enable_cache`` the cached tokens too) and
      temporaries (see :data:`TEMPORARY_STREAM_COPIES`, :data:`FSDP_GATHERED_BLOCKS`; partly fitted). Weights the
      step never reads (the last block's context stream after attention) are left out, as ``jax.jit`` drops them.
      The compiler's generated code is not
      modelled: 0.04 GiB for ``tp_replicated_out`` at 720p on v6e-8, but about 0.8 GiB for ``tp`` and ``fsdp``.

    ``topology`` (e.g. ``v6e:2x4``): when :data:`COMPILED_RESULTS` holds the compiler's report for this exact
    configuration, ``compiled`` is that report and ``memory_total`` its per-device total (the compiler's word beats
    the model: the planner misses FSDP's generated code, for one); otherwise ``memory_total`` is the planner's. Only
    memory and collectives are compared with the compiler: XLA's cost analysis prices a Pallas call (Splash, or a
    block-sparse SSTA kernel) by its operands' bytes alone, not its FLOPs, so the compiled step's FLOP count leaves
    out the attention, dense or sparse, and cannot check these attention FLOPs (only the matmuls around it).
    """
    preset = as_preset(preset)
    mesh = as_mesh(mesh_shape)
    d_, t, sq = mesh["data"], mesh["tensor"], mesh["sequence"]
    x = dtype_bytes(dtype)
    dims = model_dims(preset)
    h, f, layers, heads, hd = dims["hidden"], dims["mlp"], dims["layers"], dims["heads"], dims["head_dim"]
    if heads % (t * sq):
        raise HyvInputError("mesh_shape", f"{heads} heads cannot be split over tensor x sequence = {t} x {sq}")
    if rules not in rule_set_names():
        raise HyvInputError("rules", f"unknown rule set {rules!r}; valid: {', '.join(rule_set_names())}")
    batch = step_batch(preset, batch)
    check_data_axis(mesh, batch, "mesh_shape")  # the jax runtime and the compiler refuse it too
    tok = token_counts(preset, height, width, video_length)
    b = batch // d_
    nv, nc, lt = -(-tok["video"] // sq), tok["context"], preset.text_len
    traffic = layout_costs(preset, height, width, video_length, mesh, rules, dims, batch, x, attention)
    coll, sent, flops, total = traffic["collectives"], traffic["sent_bytes"], traffic["flops"], traffic["step"]
    weights = param_bytes(preset, dtype, rules, mesh)
    prefix = get_adapter(preset.model).block_prefix  # "transformer_blocks."

    # ---- memory per device
    _, c, frames, lh, lw = preset.latent_shape(height, width, video_length)
    if dims["streams"] == 1:  # CogVideoX: latents [F', C, h, w] (F' padded), T5 states, integer timesteps; RoPE cos/sin f32
        latents = math.prod(preset.denoising_shape(height, width, video_length)[1:])
        inputs = b * (latents * x + lt * dims["text_dim"] * x + 8) + 2 * tok["video"] * hd * 4
    else:
        inputs = (b * (dims["in_channels"] * frames * lh * lw * x + lt * dims["text_dim"] * x + lt * 8
                       + preset.byt5_len * (dims["byt5_dim"] * x + 8) + preset.image_tokens * dims["image_dim"] * x
                       + dims.get("pooled_dim", 0) * x + dims.get("guidance_embed", 0) * x
                       + nc * 9 + x) + 2 * tok["video"] * hd * 4)  # masks and gather order int64, RoPE cos/sin f32
    per_token_out = dims["out_channels"] * dims["patch_t"] * dims["patch"] ** 2  # the noise prediction
    outputs = b * per_token_out * tok["video"] * x + (b * (nv + nc) * h * x if enable_cache else 0)
    padded = -(-tok["joint"] // 2048) * 2048  # Splash pads the joint sequence to its key block
    if total["ssta"]:  # SSTA's kernel takes q, k, v in the tile layout: every tile whole
        padded = total["ssta"]["padded_length"]
    kernel_hd = -(-hd // 128) * 128 if PAD_HEAD_DIM else hd  # and the head dim to the lanes (CogVideoX: 64 -> 128)
    temporaries = (2 * b * tok["video"] * h * x + 4 * b * (heads // (t * sq)) * padded * kernel_hd * x
                   + TEMPORARY_STREAM_COPIES * b * nv * h * x)
    if rules == "fsdp":
        block = sum(math.prod(shape) for name, shape in parameter_shapes(preset)
                    if name.startswith(f"{prefix}0."))
        temporaries += FSDP_GATHERED_BLOCKS * block * x
    if traffic["mlp_whole"] and t > 1:  # fsdp on a tensor axis: the dual blocks' MLP hidden [b, N_v, f] whole
        temporaries += b * nv * f * x * (t - 1) / t
    memory = dict(weights=weights["bytes_per_device"] - traffic["dead_bytes"], inputs=inputs, temporaries=temporaries,
                  outputs=outputs)
    memory["total"] = sum(memory.values())
    compiled = (compiled_report(preset, height, width, video_length, topology, mesh, rules, enable_cache)
                if topology and not total["ssta"] else None)  # the saved reports are of dense steps
    return dict(mesh=mesh, rules=rules, per_device_bytes=memory, collectives=coll, collective_total=sum(coll.values()),
                sent_bytes=sent, flops=flops, tokens=tok, samples_per_device=b, compiled=compiled, ssta=total["ssta"],
                memory_total=compiled["per_device_bytes"]["total"] if compiled else memory["total"],
                memory_source="TPU compiler" if compiled else "planner")


# ---------------------------------------------------------------------------------------------- bounds
#: Rule sets that :func:`bounds` plans as TPU runtime layouts (:func:`device_plan`).
RULE_SET_LAYOUTS = ("tp", "tp_replicated_out", "fsdp")


def bounds(preset: Preset | str, height: int, width: int, video_length: int, chip: str | Chip, n_chips: int,
           rules: str = DEFAULT_STRATEGY, *, mesh_shape: str | Mapping[str, int] | None = None,
           batch: int | None = None,
           dtype: str = "bf16", strategy: str | None = None, attention: str | SstaConfig | None = None,
           block_q: int | None = None) -> dict[str, Any]:
    """Lower bounds on the time of one denoising step on ``n_chips`` chips, and whether it fits in HBM. The step's
    batch is the preset's (:func:`step_batch`: a CFG pair, or one sample for a distilled preset with guidance 1).

    TPU layouts (``rules`` a rule set of :mod:`hyv_lib.parallel.sharding`) come from :func:`device_plan` on ``mesh_shape``
    (default :func:`default_layout` over the chips' devices): per-device FLOPs, memory and collectives as the
    compiled step has them. ``rules="replicated"`` is the GPU layout (whole weights per device, ``strategy``
    ``ulysses`` by default: :func:`collective_bytes`, :func:`activation_bytes`).

    - compute: FLOPs per device / the device's peak bf16 FLOP/s
    - hbm: per-device bytes that must cross HBM / bandwidth = its weights + what the attention kernel moves
      (:func:`attention_hbm_bytes`: q read and output written once, k and v re-read once per query tile). The tiles
      are the kernel's on that chip: Splash's for a TPU (:func:`attention_blocks`), flash-attn's 128 query rows on a
      GPU; ``block_q`` overrides the query tile (the lever behind a larger-block speed-up).
    - interconnect: bytes each device sends / its share of half the chip's published bidirectional ICI or NVLink
      bandwidth; None when the chip has no sourced figure.

    ``attention``: ``flash`` (the exact kernels' O(S D) working set), ``dense`` (diffusers' S x S one; the same
    FLOPs), ``ssta`` or a :class:`hyv_lib.SstaConfig` (SSTA: FLOPs and kernel bytes at the tile density's upper
    bound, :mod:`hyv_lib.planning.sparse`; the flash working set), or None: the preset's own (``ssta`` for the
    ``*_sparse`` presets, else ``flash``). ``ssta`` in the result is the density (None when dense).

    ``step_s`` is the largest known bound, ``limit`` which one it is.
    """
    preset = as_preset(preset)
    batch = step_batch(preset, batch)
    spec = get_chip(chip)
    check_count("n_chips", n_chips)
    dtype_bytes(dtype)  # checks the name
    devices = n_chips * spec.devices_per_chip
    sparse = ssta_config(preset, attention)
    working_set = "dense" if attention == "dense" else "flash"
    flops = step_flops(preset, height, width, video_length, batch, attention=sparse or "dense")
    d = model_dims(preset)
    blocks = attention_blocks(spec)
    if block_q is not None:
        blocks["block_q"] = block_q
    kernel = attention_hbm_bytes(preset, height, width, video_length, batch, dtype=dtype, attention=sparse or "dense",
                                 **blocks)
    attention_io = kernel["total"] / devices  # every layout splits attention evenly: samples x heads
    rule_name = rules if isinstance(rules, str) else "custom"
    if rule_name in RULE_SET_LAYOUTS:
        mesh = as_mesh(mesh_shape) if mesh_shape else default_layout(devices, d["heads"], rule_name, batch)
        if not mesh_shape and math.prod(mesh.values()) != devices:  # the heads do not split over every device
            raise HyvInputError("n_chips", f"{n_chips} x {spec.name} = {devices} devices has no default layout: the "
                                           f"largest with data dividing the {batch} sample(s) of a step and tensor x "
                                           f"sequence the model's {d['heads']} attention heads, {mesh_text(mesh)} "
                                           f"(what `runtime` jax runs without `mesh`), uses "
                                           f"{math.prod(mesh.values())}; pass mesh_shape")
        if math.prod(mesh.values()) != devices:
            raise HyvInputError("mesh_shape", f"{mesh} is not {devices} devices ({n_chips} x {spec.name})")
        try:
            plan = device_plan(preset, height, width, video_length, mesh, rule_name, batch=batch, dtype=dtype,
                               topology=SLICES.get((chip, n_chips)) if isinstance(chip, str) else None,
                               attention=sparse or "dense")
        except HyvInputError as err:
            if mesh_shape or err.argument != "mesh_shape":
                raise
            raise HyvInputError("n_chips", f"{n_chips} x {spec.name} = {devices} devices has no default layout "
                                           f"({err.message}); pass mesh_shape") from None
        device_flops, weights = plan["flops"]["total"], plan["per_device_bytes"]["weights"]
        activations = plan["memory_total"] - weights  # the compiler's total when it was compiled (see device_plan)
        sent, strategy, memory_source = plan["sent_bytes"], "compiled layout", plan["memory_source"]
    else:
        strategy = strategy or "ulysses"
        if strategy not in STRATEGIES:
            raise HyvInputError("strategy", f"must be one of {', '.join(STRATEGIES)}, got {strategy!r}")
        mesh = {STRATEGIES[strategy]: devices}
        device_flops = flops["total"] / devices
        weights = param_bytes(preset, dtype, rules, devices)["bytes_per_device"]
        activations = activation_bytes(preset, height, width, video_length, batch, dtype=dtype,
                                       attention=working_set, mesh_shape=mesh)["bytes_per_device"]
        sent = collective_bytes(preset, height, width, video_length, batch, dtype=dtype, strategy=strategy,
                                mesh_shape=devices)["bytes_per_device"]
        memory_source = "planner"
    peak = spec.peak_bf16_flops / spec.devices_per_chip
    times = {
        "compute_s": device_flops / peak,
        "hbm_s": (weights + attention_io) / (spec.hbm_bandwidth / spec.devices_per_chip),
        # bytes each device sends / its egress bandwidth (half the published bidirectional figure per chip)
        "interconnect_s": (sent / (spec.interconnect_bandwidth / 2 / spec.devices_per_chip)
                           if spec.interconnect_bandwidth else None),
    }
    known = {k: v for k, v in times.items() if v is not None}
    limit = max(known, key=known.get)
    hbm = spec.hbm_bytes / spec.devices_per_chip
    return dict(times, step_s=known[limit], limit=limit, flops=flops["total"], flops_per_device=device_flops,
                weights_bytes=weights, activation_bytes=activations, hbm_traffic_bytes=weights + attention_io,
                attention_hbm_bytes=attention_io, attention_intensity=kernel["intensity"],
                attention_block_q=kernel["block_q"], attention_passes=kernel["passes"],
                collective_bytes=sent, strategy=strategy, rules=rule_name, mesh=mesh, memory_source=memory_source,
                attention_flops=flops["attention"], ssta=flops["ssta"],
                fits=weights + activations <= hbm, hbm_bytes=hbm, chip=spec.name, n_chips=n_chips,
                notes=None if spec.interconnect_bandwidth else NO_INTERCONNECT_SOURCE)


def attention_blocks(chip: str | Chip) -> dict[str, Any]:
    """The attention kernel's tiles on ``chip``, as :func:`attention_hbm_bytes` takes them: Splash's default bf16
    block_q / block_kv for a TPU (:data:`hyv_lib.kernels.splash.CHIP_BLOCK_SIZES`, padded sequence); for a GPU
    flash-attn's :data:`FLASH_BLOCK_Q` query rows times the :data:`GPU_RESIDENT_TILES` that share each K/V read
    through L2 (varlen: no padding; an estimate)."""
    spec = get_chip(chip)
    if spec.device_kind is None:
        return dict(block_q=FLASH_BLOCK_Q * GPU_RESIDENT_TILES, block_kv=None, pad=False)
    tiles = CHIP_BLOCK_SIZES.get((spec.device_kind, "bfloat16"), DEFAULT_BLOCK_SIZES)
    return dict(block_q=tiles["block_q"], block_kv=tiles["block_kv"], pad=True)


def cited_times(preset: str, chip: str, n_chips: int, mesh: Mapping[str, int] | None = None,
                rules: str | None = None) -> list[dict[str, Any]]:
    """The :data:`CITED_STEP_TIMES` measured for ``preset`` on ``n_chips`` x ``chip``; with ``mesh`` and ``rules``
    only those measured on that very layout (a time belongs to the mesh and weight placement it ran on)."""
    return [c for c in CITED_STEP_TIMES
            if c["preset"] == preset and c["chip"] == chip and c["n_chips"] == n_chips
            and (mesh is None or as_mesh(c["mesh"]) == as_mesh(dict(mesh)))
            and (rules is None or c["rules"] == rules)]


def plan_table(presets: Sequence[str] = ("480p_t2v", "720p_t2v"), chips: Sequence[str] = tuple(CHIPS),
               n_chips: int = 8, video_length: int = 121, rules: str = DEFAULT_STRATEGY, batch: int | None = None,
               dtype: str = "bf16", cited_layouts: bool = True) -> list[dict[str, Any]]:
    """Rows for the book: per preset (16:9 default size), chip and layout, FLOPs, memory per device, bounds and the
    cited step time with its implied MFU where one was measured on *that* layout (:data:`CITED_STEP_TIMES`; other
    rows get None). TPUs use ``rules`` on :func:`default_layout` (``layout`` "default"), and with ``cited_layouts``
    also on each other mesh a time was cited for with the same rules (``layout`` "cited": gpu-tpu-pedia's tensor=8);
    GPUs (H100, H200) the Ulysses layout (whole weights on every GPU). ``batch``: default the preset's
    (:func:`step_batch`)."""
    rows = []
    for name in presets:
        preset = get_preset(name)
        height, width = preset.default_height, preset.default_width
        step = step_batch(preset, batch)
        flops = step_flops(preset, height, width, video_length, step)
        for chip in chips:
            layout = "replicated" if get_chip(chip).name.startswith("NVIDIA") else rules
            meshes: list[tuple[str, Mapping[str, int] | None]] = [("default", None)]  # None: default_layout
            if cited_layouts and layout in RULE_SET_LAYOUTS:
                devices = n_chips * get_chip(chip).devices_per_chip
                seen = [default_layout(devices, model_dims(preset)["heads"], layout, step)]
                for c in cited_times(name, chip, n_chips, rules=layout):
                    if as_mesh(c["mesh"]) not in [as_mesh(m) for m in seen]:
                        seen.append(c["mesh"])
                        meshes.append(("cited", c["mesh"]))
            for kind, mesh_shape in meshes:
                b = bounds(preset, height, width, video_length, chip, n_chips, layout, mesh_shape=mesh_shape,
                           batch=step, dtype=dtype)
                cited = cited_times(name, chip, n_chips, b["mesh"], layout)
                best = min(cited, key=lambda c: c["seconds"]) if cited else None
                rows.append(dict(
                    preset=name, height=height, width=width, frames=video_length, chip=chip, n_chips=n_chips,
                    rules=layout, mesh=as_mesh(b["mesh"]), layout=kind, batch=step,
                    pflop_per_step=flops["total"] / 1e15,
                    attention_share=flops["attention_share"], weights_gb_per_device=b["weights_bytes"] / 1e9,
                    activations_gb_per_device=b["activation_bytes"] / 1e9, hbm_gb_per_device=b["hbm_bytes"] / 1e9,
                    memory_source=b["memory_source"], fits=b["fits"], compute_s=b["compute_s"], hbm_s=b["hbm_s"],
                    interconnect_s=b["interconnect_s"],
                    bound_s=b["step_s"], limit=b["limit"], cited_s=best["seconds"] if best else None,
                    cited_mfu=mfu(flops["total"], best["seconds"], chip, n_chips) if best else None,
                    cited_source=f"{best['label']}; {best['source']}" if best else None,
                ))
    return rows


#: The names :func:`bounds` raises with -> :func:`plan_step`'s parameters (errors name what its caller gave).
_PLAN_PARAMETERS = {"mesh_shape": "mesh", "rules": "sharding"}


#: The ``plan`` command's ``--attention`` values: the preset's own, dense or SSTA (:func:`plan_step`).
PLAN_ATTENTIONS = ("auto", "dense", "ssta")


def plan_step(preset: Preset | str, height: int | None = None, width: int | None = None,
              video_length: int | None = None, chip: str = "v6e", n_chips: int = 8,
              mesh: str | Mapping[str, int] | None = None, sharding: str = DEFAULT_STRATEGY,
              attention: str | SstaConfig | None = "auto") -> dict[str, Any]:
    """What ``python -m hyv_lib plan`` prints: one denoising step of ``preset`` (default size: its 16:9 bucket) on
    ``n_chips`` x ``chip``, per device. A TPU gets :func:`device_plan` on ``mesh`` (default :func:`default_layout`)
    with the rule set ``sharding``; a GPU the Ulysses layout with whole weights (then ``replicated``).
    ``attention``: ``auto`` (the preset's own: SSTA for the ``*_sparse`` presets), ``dense`` or ``ssta`` (or a
    :class:`hyv_lib.SstaConfig`). Returns the FLOPs (total and per device), per-device memory and whether it fits,
    collective bytes, the :func:`bounds` lower bounds and ``attention``: its kind and FLOPs beside the dense ones,
    with SSTA its tile density (the upper bound, :func:`hyv_lib.planning.sparse.tile_density`, with the exact window
    + text part and the uniform-top-k expectation). Errors name its parameters."""
    try:
        preset = as_preset(preset)
        height, width, video_length = video_size(preset, height, width, video_length)
        spec = get_chip(chip)
        gpu = spec.device_kind is None
        rules = "replicated" if gpu else sharding
        if not isinstance(attention, SstaConfig) and attention not in PLAN_ATTENTIONS:
            raise HyvInputError("attention", f"must be one of {', '.join(PLAN_ATTENTIONS)}, got {attention!r}")
        sparse = ssta_config(preset, attention)
        b = bounds(preset, height, width, video_length, chip, n_chips, rules, mesh_shape=None if gpu else mesh,
                   attention=sparse or "flash")
        plan = None if gpu else device_plan(preset, height, width, video_length, b["mesh"], rules,
                                            attention=sparse or "dense")
    except HyvInputError as err:
        raise HyvInputError(_PLAN_PARAMETERS.get(err.argument, err.argument), err.message) from None
    flops = step_flops(preset, height, width, video_length, attention=sparse or "dense")
    dense = step_flops(preset, height, width, video_length, attention="dense")
    density = flops["ssta"]
    return dict(
        preset=preset.name, model=preset.model, size=dict(height=height, width=width, video_length=video_length),
        chip=spec.name, n_chips=n_chips, rules=rules, mesh=as_mesh(b["mesh"]), tokens=token_counts(
            preset, height, width, video_length), flops=flops["total"], attention_share=flops["attention_share"],
        flops_per_device=b["flops_per_device"],
        per_device_bytes=plan["per_device_bytes"] if plan else dict(weights=b["weights_bytes"],
                                                                    activations=b["activation_bytes"],
                                                                    total=b["weights_bytes"] + b["activation_bytes"]),
        memory_source=b["memory_source"], hbm_bytes_per_device=b["hbm_bytes"], fits=b["fits"],
        collectives=plan["collectives"] if plan else None, sent_bytes=b["collective_bytes"],
        bounds={k: b[k] for k in ("compute_s", "hbm_s", "interconnect_s", "step_s", "limit")},
        attention=dict(kind="ssta" if density else "dense", flops=flops["attention"], dense_flops=dense["attention"],
                       dense_total=dense["total"], **density_summary(density)),
        notes=" ".join(n for n in (b["notes"], get_adapter(preset.model).gpu_plan_note if gpu else None) if n)
        or None)


def format_plan(report: dict[str, Any]) -> str:
    """The report of :func:`plan_step` as the CLI's lines."""
    gib = 2**30
    size, tok, m, att = report["size"], report["tokens"], report["per_device_bytes"], report["attention"]
    mesh = " x ".join(f"{a}={n}" for a, n in report["mesh"].items() if n > 1) or "one device"
    b = report["bounds"]
    lines = [
        f"{report['preset']} at {size['height']}x{size['width']}, {size['video_length']} frames ({tok['video']:,} "
        f"video + {tok['context']:,} context tokens): {report['flops'] / 1e15:.2f} PFLOP per step, "
        f"{report['attention_share']:.0%} attention",
        f"{report['n_chips']} x {report['chip']}, mesh {mesh}, rules {report['rules']}",
        f"per device: {report['flops_per_device'] / 1e12:.1f} TFLOP | " + " | ".join(
            f"{k} {v / gib:.2f} GiB" for k, v in m.items()) + f" of {report['hbm_bytes_per_device'] / gib:.0f} GiB ("
        f"{report['memory_source']}) -> {'fits' if report['fits'] else 'DOES NOT FIT'}",
        f"collectives: {report['sent_bytes'] / 1e9:.1f} GB sent per device"
        + ("" if not report["collectives"] else " (" + ", ".join(
            f"{k} {v / gib:.2f} GiB" for k, v in report["collectives"].items() if v) + ")"),
        *([] if att["kind"] == "dense" else [
            f"attention SSTA: tile density <= {att['density']:.1%} of {att['tiles']} x {att['tiles']} tiles "
            f"({att['topk']} top-k tiles counted outside the window: the upper bound; window + text alone "
            f"{att['window_density']:.1%}, uniform top-k {att['uniform_density']:.1%}), {att['padded_length']:,} "
            f"tiled tokens: attention {att['flops'] / 1e15:.2f} PFLOP vs {att['dense_flops'] / 1e15:.2f} dense; "
            f"step {report['flops'] / 1e15:.2f} PFLOP vs {att['dense_total'] / 1e15:.2f} dense"]),
        "lower bounds per step: " + ", ".join(f"{k[:-2]} {v:.3f} s" for k, v in b.items()
                                              if k.endswith("_s") and k != "step_s" and v is not None)
        + f" -> {b['step_s']:.3f} s ({b['limit'][:-2]}-bound)",
    ]
    if report["notes"]:
        lines.append(report["notes"])
    return "\n".join(lines)

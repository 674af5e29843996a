"""Compile the DiT step for a TPU slice on any machine (no TPU needed): per-device memory, collectives, FLOPs.

libtpu (``pip install libtpu``, which ``jax[tpu]`` also brings) describes a named TPU slice without the hardware
(``jax.experimental.topologies``), and ``jax.jit(...).lower(...).compile()`` on a mesh of those devices runs the
real TPU compiler, Mosaic (the Pallas Splash kernel) included. :func:`compile_step` builds the DiT on the meta device
(no weights), makes a compile-only :class:`hyv_lib.runtimes.jax_step.JaxTransformer` with bf16 parameters placed by a rule set,
and lowers the very jitted functions that a TPU VM runs. What it reports is the compiler's: a memory and collective
check, not a timing.
"""

from __future__ import annotations

import dataclasses

import re
import time
from typing import Any

import torch

from ..base.errors import HyvInputError
from ..base.presets import Preset, check_data_axis, video_size
from ..kernels.splash import default_block_sizes, resolve_block_sizes
from ..kernels.ssta import SstaConfig
from ..models.families import get_preset
from ..models.registry import get_adapter
from ..parallel.jax_env import quiet_libtpu
from ..parallel.mesh import default_layout, head_split, make_mesh, mesh_text, parse_mesh
from ..parallel.sharding import DEFAULT_STRATEGY, STRATEGIES
from ..runtimes.jax_step import JaxTransformer
from .costs import token_counts
from .hardware import CHIPS
from .hlo import hlo_collective_ops, hlo_collectives, xla_flops

#: Topology name prefixes that libtpu 0.0.42.1 knows, and the key of each chip in :data:`hyv_lib.planning.hardware.CHIPS`.
#: A name is ``PREFIX:AxB`` or ``PREFIX:AxBxC`` in chips (e.g. ``v6e:2x4`` = a v6e-8, ``tpu7x:2x2x1`` = 4 Ironwood
#: chips shown as 8 devices, ``v5p:2x2x1`` = a v5p-8: 4 chips).
TOPOLOGY_CHIPS = {"v4": "v4", "v5e": "v5e", "v5p": "v5p", "v6e": "v6e", "tpu7x": "v7x"}
_TOPOLOGY = re.compile(r"^(%s):\d+x\d+(x\d+)?$" % "|".join(TOPOLOGY_CHIPS))


def topology_devices(topology: str) -> list:
    """The JAX devices of a named TPU slice (e.g. ``v6e:2x4``), described by libtpu; no TPU needed."""
    if not isinstance(topology, str) or not _TOPOLOGY.match(topology):
        raise HyvInputError("topology", f"unknown topology {topology!r}; valid: " + ", ".join(
            f"{p}:AxB[xC]" for p in TOPOLOGY_CHIPS) + " in chips (e.g. v6e:2x4, v5p:2x2x1, tpu7x:2x2x1, v6e:4x4)")
    import importlib.util

    if importlib.util.find_spec("libtpu") is None:
        raise HyvInputError("topology", "compiling for a TPU needs libtpu: pip install libtpu==0.0.42.1 "
                                        "(it comes with requirements.txt)")
    import jax
    from jax.experimental import topologies

    # Google's v5litepod-8 and v6e-8 VMs are one host with 8 chips (and the -1 VMs one chip); libtpu's default host
    # is 2x2 chips, which would make a 2x4 slice two processes and reject 1x1. Larger slices keep libtpu's default
    # (4-chip hosts, as those VMs have).
    prefix, shape = topology.split(":")
    hosts = ({"chips_per_host_bounds": [2, 4, 1]} if shape == "2x4" else {"chips_per_host_bounds": [1, 1, 1]}
             if shape == "1x1" else {}) if prefix in ("v5e", "v6e") else {}
    with quiet_libtpu():
        try:
            return list(topologies.get_topology_desc(topology_name=topology, platform="tpu", **hosts).devices)
        except jax.errors.JaxRuntimeError as err:
            raise HyvInputError("topology", f"libtpu cannot build {topology!r}: {str(err).splitlines()[0]}") from None


_UNITS = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
_OOM = (re.compile(r"required for HLO temporaries \(([\d.]+)([KMGT])\) exceeds available HBM \(([\d.]+)([KMGT])\)"),
        re.compile(r"Used ([\d.]+)([KMGT]) of ([\d.]+)([KMGT]) hbm"))


def topology_mesh(axes: dict[str, int], devices: list, topology: str, heads: int):
    """The mesh of ``axes`` (data/tensor/sequence sizes) over a topology's ``devices``; HyvInputError naming ``mesh``
    when the axes do not fit the devices or the ``heads`` cannot be split over tensor x sequence."""
    try:
        jax_mesh = make_mesh(**axes, devices=devices)
    except (ValueError, TypeError) as err:
        raise HyvInputError("mesh", f"{err} (topology {topology})") from None
    if heads % head_split(jax_mesh):
        raise HyvInputError("mesh", f"the {heads} attention heads cannot be split over tensor x sequence = "
                                    f"{jax_mesh.shape['tensor']} x {jax_mesh.shape['sequence']}")
    return jax_mesh


def parse_hbm_oom(message: str) -> tuple[int, int] | None:
    """(bytes needed, bytes available) per device from the TPU compiler's out-of-HBM error, or None."""
    for pattern in _OOM:
        match = pattern.search(message)
        if match:
            need, need_unit, have, have_unit = match.groups()
            return round(float(need) * _UNITS[need_unit]), round(float(have) * _UNITS[have_unit])
    return None


_AVAILABLE: dict[str, int] = {}


def available_hbm(device) -> int:
    """Bytes of HBM the TPU compiler lets one program use on ``device`` (what decides whether a program fits):
    read from the compiler's own error for a program far too large (a 1 TiB buffer), once per device kind."""
    kind = device.device_kind
    if kind not in _AVAILABLE:
        import jax
        import jax.numpy as jnp
        from jax.sharding import Mesh, NamedSharding
        from jax.sharding import PartitionSpec as P

        mesh = Mesh([device], ("x",))
        huge = jax.ShapeDtypeStruct((2**38,), jnp.float32, sharding=NamedSharding(mesh, P()))
        with quiet_libtpu():
            try:
                jax.jit(lambda a: a + 1).lower(huge).compile()
            except jax.errors.JaxRuntimeError as err:
                parsed = parse_hbm_oom(str(err))
                if parsed is None:
                    raise
                _AVAILABLE[kind] = parsed[1]
            else:
                raise RuntimeError(f"a 1 TiB program compiled for {kind}: cannot read its HBM limit")
    return _AVAILABLE[kind]


def abstract_transformer(preset: Preset, dtype: torch.dtype = torch.bfloat16):
    """The preset's DiT on the meta device (built by its model adapter): the real diffusers class and parameter names,
    no memory."""
    with torch.device("meta"):
        model = get_adapter(preset.model).build(preset.transformer)
    # nn.Module.to, not diffusers' override, which warns about fp32-pinned modules (this model has none)
    return torch.nn.Module.to(model, dtype).eval().requires_grad_(False)


def example_inputs(preset: Preset, height: int, width: int, video_length: int, batch: int = 2,
                   dtype: torch.dtype = torch.bfloat16) -> dict[str, torch.Tensor]:
    """Forward keyword arguments of the real shapes for the preset's model, from its adapter
    (:meth:`hyv_lib.models.adapter.ModelAdapter.example_inputs`): only shapes and dtypes reach the compiler."""
    return get_adapter(preset.model).example_inputs(preset, height, width, video_length, batch, dtype)


def program_report(compiled, compile_seconds: float) -> dict[str, Any]:
    """Per-device numbers of one compiled program: memory_analysis, collectives in the HLO, cost_analysis."""
    mem = compiled.memory_analysis()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    text = compiled.as_text()
    parts = {"arguments": mem.argument_size_in_bytes, "temporaries": mem.temp_size_in_bytes,
             "outputs": mem.output_size_in_bytes - mem.alias_size_in_bytes,
             "code": mem.generated_code_size_in_bytes}
    estimate = cost.get("optimal_seconds")
    return dict(
        per_device_bytes=dict(parts, total=sum(parts.values())),
        collectives=[dict(kind=kind, count=c["count"], bytes=c["bytes"])
                     for kind, c in hlo_collectives(text).items() if c["count"]],
        # by kind, devices per group and shapes, with the bytes each device sends (planning.hlo)
        collective_ops=hlo_collective_ops(text),
        flops_per_device=float(cost["flops"]),
        # the dots and convolutions alone, re-counted from the HLO (Splash excluded here too)
        matmul_flops_per_device=float(xla_flops(compiled)["matmul"]),
        # XLA's cost model prices a Pallas kernel by its bytes only, and sums -1 for ops it cannot price (seen at
        # the real size): a negative total is no estimate at all.
        compiler_estimate_seconds=float(estimate) if estimate is not None and estimate >= 0 else None,
        splash_kernels=text.count('custom_call_target="tpu_custom_call"'),
        compile_seconds=round(compile_seconds, 1),
    )


#: The attention kernels the TPU step compiles with: Splash (dense, exact) and SSTA's block-sparse Pallas kernel.
COMPILED_ATTENTION = ("splash", "ssta")


def compile_step(preset: str | Preset = "720p_t2v", topology: str = "v6e:2x4", *, mesh: str | dict | None = None,
                 sharding: str = DEFAULT_STRATEGY, height: int | None = None, width: int | None = None,
                 video_length: int | None = None, enable_cache: bool = False, no_cache_blocks: int = 1,
                 attention_options: dict | None = None, num_layers: int | None = None,
                 attention: str | None = None) -> dict[str, Any]:
    """Compile one denoising step of ``preset`` for the TPU slice ``topology``, here: a CFG batch of 2, or one sample
    for a preset that runs CFG off (``guidance_scale`` 1: the CFG-distilled and step-distilled ones), which the
    default mesh then puts wholly on ``tensor`` and a ``data`` axis is refused for (it has nothing to split).

    ``mesh`` ('data=2,tensor=4' or a dict; default :func:`hyv_lib.parallel.mesh.default_layout`, what the jax runtime
    runs without ``--mesh``) must use all the slice's devices;
    ``sharding`` is a strategy of :data:`hyv_lib.parallel.sharding.STRATEGIES`. ``enable_cache`` compiles DeepCache's pair
    instead: the full step that also returns the cache, and the cached step (``no_cache_blocks`` trailing blocks).
    ``num_layers`` overrides the block count (tests). ``attention``: ``splash`` (dense, exact) or ``ssta`` (the
    block-sparse Pallas kernel of :mod:`hyv_lib.kernels.ssta_jax`, ``attention_options={"ssta": SstaConfig(...)}``,
    the official options by default); None: the preset's (``ssta`` for the sparse 720p checkpoints, else ``splash``).
    Bad input raises :class:`HyvInputError` naming the parameter.

    Returns the report that ``python -m hyv_lib compile --json`` prints: per-device bytes from the compiler's memory
    analysis (arguments = weights + inputs, temporaries, outputs, code), the chip's HBM per device and ``fits``,
    the collectives in the optimised HLO, XLA's FLOP count (the attention kernels excluded: a Pallas call counts only
    its bytes),
    its cost-model estimate when it gives one, and the compile time. With the cache, ``programs`` holds both programs
    and the top-level figures are the larger program's memory (plus both programs' code) and the sum of the rest.
    """
    preset = get_preset(preset) if isinstance(preset, str) else preset
    if sharding not in STRATEGIES:
        raise HyvInputError("sharding", f"must be one of {', '.join(STRATEGIES)}, got {sharding!r}")
    height, width, video_length = video_size(preset, height, width, video_length)
    if not isinstance(no_cache_blocks, int) or not 0 <= no_cache_blocks <= preset.transformer["num_layers"]:
        raise HyvInputError("no_cache_blocks", f"must be an integer in 0..{preset.transformer['num_layers']}, "
                                               f"got {no_cache_blocks!r}")
    attention = attention or ("ssta" if preset.attention == "ssta" else "splash")
    if attention not in COMPILED_ATTENTION:
        raise HyvInputError("attention", f"the TPU step compiles {' or '.join(COMPILED_ATTENTION)}, got {attention!r}")
    if attention == "ssta":
        attention_options = {"ssta": SstaConfig(), **(attention_options or {})}
    devices = topology_devices(topology)
    heads = preset.transformer["num_attention_heads"]
    batch = preset.samples_per_step  # what pipeline.denoise runs per step: 1 with CFG off (the distilled presets)
    axes = parse_mesh(mesh) if isinstance(mesh, str) or mesh is None else dict(mesh)
    if not axes:  # the jax runtime's default (which may leave devices out: compile refuses that, as for --mesh)
        axes = default_layout(len(devices), heads, sharding, batch=batch)
        used = axes["data"] * axes["tensor"] * axes["sequence"]
        if used != len(devices):
            raise HyvInputError("mesh", f"the {len(devices)} devices of {topology} have no default layout: the "
                                        f"largest with data dividing the {batch} sample(s) of a step and tensor x "
                                        f"sequence the model's {heads} attention heads, {mesh_text(axes)} (what "
                                        f"`runtime` jax runs without `mesh`), uses {used}; give a `mesh` of them all")
    jax_mesh = topology_mesh(axes, devices, topology, heads)
    check_data_axis(jax_mesh.shape, batch, "mesh")
    config = dict(preset.transformer, **({} if num_layers is None else {"num_layers": num_layers}))
    model = abstract_transformer(_with_transformer(preset, config))
    with quiet_libtpu():
        try:
            step = JaxTransformer(model, mesh=jax_mesh, sharding=sharding, attention=attention,
                                  attention_options=attention_options, adapter=get_adapter(preset.model))
        except ValueError as err:
            raise HyvInputError("sharding", str(err)) from None
        inputs = example_inputs(preset, height, width, video_length, batch=batch)
        programs = {}
        if not enable_cache:
            programs["step"] = _compile(step.lower, inputs)
        else:
            full, programs["full"] = _compile(step.lower, inputs, method="forward_and_cache",
                                              no_cache_blocks=no_cache_blocks, keep=True)
            if full is not None:  # a full step that does not fit leaves nothing to compile the cached one for
                programs["cached"] = _compile(step.lower, inputs, method="forward_from_cache",
                                              no_cache_blocks=no_cache_blocks, cache=step.cache_spec(full))
    chip = CHIPS[TOPOLOGY_CHIPS[topology.split(":")[0]]]
    chips = len({(d.process_index, tuple(d.coords)) for d in devices})
    report = dict(
        topology=topology, device_kind=devices[0].device_kind, devices=len(devices),
        processes=len({d.process_index for d in devices}), chips=chips,
        mesh={a: int(n) for a, n in jax_mesh.shape.items()}, sharding=sharding, preset=preset.name, batch=batch,
        size=dict(height=height, width=width, video_length=video_length),
        tokens=token_counts(_with_transformer(preset, config), height, width, video_length),
        **_combine(programs),
        hbm_bytes_per_device=chip.hbm_bytes * chips / len(devices),
        hbm_source=f"{chip.name}, {chip.hbm_bytes / 2**30:.0f} GiB per chip, {len(devices) // chips} device(s) per "
                   f"chip: {chip.source.split(':')[0]}",
        hbm_available_per_device=available_hbm(devices[0]),
        attention=dict(backend=attention, native=all(p["splash_kernels"] for p in programs.values()),
                       **(_splash_settings(devices[0].device_kind, attention_options,
                                           token_counts(_with_transformer(preset, config), height, width,
                                                        video_length)["joint"]) if attention == "splash"
                          else {k: list(v) if isinstance(v, tuple) else v
                                for k, v in dataclasses.asdict(attention_options["ssta"]).items()})),
    )
    errors = [p["compile_error"] for p in programs.values() if p.get("compile_error")]
    # Fits = the compiler accepted every program and its bytes are within what the compiler makes available.
    report["fits"] = not errors and report["per_device_bytes"]["total"] <= report["hbm_available_per_device"]
    if errors:
        report["compile_error"] = errors[0]
    if enable_cache:
        report["programs"] = programs
        report["no_cache_blocks"] = no_cache_blocks
    return report


def _compile(lower, inputs, keep: bool = False, **kwargs):
    """Lower and compile one program; a program too large for HBM gives a report (fits false) instead of an error."""
    import jax

    start = time.perf_counter()
    compiled = None
    try:
        compiled = lower(**inputs, **kwargs).compile()
        report = program_report(compiled, time.perf_counter() - start)
    except jax.errors.JaxRuntimeError as err:
        parsed = parse_hbm_oom(str(err))
        if parsed is None:
            raise
        report = dict(per_device_bytes=dict(arguments=None, temporaries=None, outputs=None, code=None,
                                            total=parsed[0]),
                      collectives=[], collective_ops=[], flops_per_device=None, matmul_flops_per_device=None,
                      compiler_estimate_seconds=None, splash_kernels=0,
                      compile_seconds=round(time.perf_counter() - start, 1),
                      compile_error=str(err).splitlines()[0][:300])
    return (compiled, report) if keep else report


def _combine(programs: dict[str, dict]) -> dict[str, Any]:
    """One program as is; DeepCache's pair as the larger one's memory (both programs' code stays loaded), and the
    two programs' collectives, FLOPs, estimates and compile times summed (one full + one cached step)."""
    if len(programs) == 1:
        return {k: v for k, v in next(iter(programs.values())).items() if k != "compile_error"}
    biggest = max(programs.values(), key=lambda p: p["per_device_bytes"]["total"])
    memory = dict(biggest["per_device_bytes"])
    codes = [p["per_device_bytes"]["code"] for p in programs.values()]
    if None not in codes:
        memory["code"] = sum(codes)
        memory["total"] = sum(v for k, v in memory.items() if k != "total")
    kinds: dict[str, dict] = {}
    for p in programs.values():
        for c in p["collectives"]:
            row = kinds.setdefault(c["kind"], dict(kind=c["kind"], count=0, bytes=0))
            row["count"] += c["count"]
            row["bytes"] += c["bytes"]

    def total(key):
        values = [p[key] for p in programs.values()]
        return None if None in values else sum(values)

    return dict(per_device_bytes=memory, collectives=list(kinds.values()),
                collective_ops=[op for p in programs.values() for op in p["collective_ops"]],
                flops_per_device=total("flops_per_device"), matmul_flops_per_device=total("matmul_flops_per_device"),
                splash_kernels=total("splash_kernels"),
                compiler_estimate_seconds=total("compiler_estimate_seconds"),
                compile_seconds=round(sum(p["compile_seconds"] for p in programs.values()), 1))


def _splash_settings(device_kind: str, options: dict | None, seq_len: int) -> dict[str, Any]:
    """The kernel's compute dtype and the block sizes it runs with at this sequence length."""
    import jax.numpy as jnp

    options = options or {}
    dtype = options.get("compute_dtype") or "bfloat16"  # bf16 inputs on a TPU: the kernel's default

    defaults = default_block_sizes(jnp.dtype(dtype), device_kind)
    blocks = resolve_block_sizes(seq_len, options.get("block_q") or defaults["block_q"],
                                  options.get("block_kv") or defaults["block_kv"],
                                  options.get("block_kv_compute") or defaults["block_kv_compute"], jnp.dtype(dtype))
    return dict(compute_dtype=dtype, **dict(zip(("block_q", "block_kv", "block_kv_compute"), blocks)))


def _with_transformer(preset: Preset, config: dict) -> Preset:
    return preset if config == preset.transformer else dataclasses.replace(preset, transformer=config)


def gib_text(n: int | None) -> str:
    """Bytes as the reports print them: ``"12.34 GiB"``, or ``"n/a"``."""
    return "n/a" if n is None else f"{n / 2**30:.2f} GiB"


def memory_lines(report: dict[str, Any]) -> list[str]:
    """The lines every compile report prints the same way: per-device bytes, HBM and whether the program fits, the
    compiler's error if any, and the collectives (an inference step's or a train step's report)."""
    b, size = report["per_device_bytes"], gib_text
    source = f" ({report['hbm_source']})" if report.get("hbm_source") else ""
    lines = [
        "per device:   " + " | ".join(f"{k} {size(b[k])}" for k in ("arguments", "temporaries", "outputs", "code"))
        + f" | total {size(b['total'])}",
        f"HBM:          {size(report['hbm_bytes_per_device'])} per device{source}; the compiler lets a program use "
        f"{size(report['hbm_available_per_device'])} -> {'fits' if report['fits'] else 'DOES NOT FIT'}",
    ]
    if report.get("compile_error"):
        lines.append(f"compiler:     {report['compile_error']}")
    lines.append("collectives:  " + (", ".join(f"{c['kind']} x{c['count']} {size(c['bytes'])}"
                                               for c in report["collectives"]) or "none"))
    return lines


def format_report(report: dict[str, Any]) -> str:
    """The report of :func:`compile_step` as the CLI's table."""

    size_ = report["size"]
    tok = report["tokens"]
    mesh = " x ".join(f"{a}={n}" for a, n in report["mesh"].items())
    att = report["attention"]
    lines = [
        f"{report['preset']} at {size_['height']}x{size_['width']}, {size_['video_length']} frames "
        f"({tok['video']:,} video + {tok['context']:,} context tokens), "
        f"{'a CFG batch of 2' if report.get('batch', 2) == 2 else 'one sample (CFG off)'}",
        f"compiled for {report['topology']}: {report['devices']} x {report['device_kind']} on {report['chips']} chips, "
        f"{report['processes']} host process(es)",
        f"mesh {mesh}, sharding {report['sharding']}, " + (
            f"Splash {'native (Mosaic)' if att['native'] else 'NOT native'} in {att['compute_dtype']}, blocks "
            f"{att['block_q']}/{att['block_kv']}/{att['block_kv_compute']}" if att.get("backend", "splash") == "splash"
            else f"SSTA ({'native (Mosaic)' if att['native'] else 'NOT native'} block-sparse Pallas kernel), tiles "
                 f"{'x'.join(map(str, att['tile']))}, window {'x'.join(map(str, att['window']))}, top-{att['topk']}"),
    ]
    if "programs" in report:
        lines.append(f"DeepCache: full + cached programs ({report['no_cache_blocks']} uncached block(s)); memory is the "
                     "larger program's, the rest is one full + one cached step")
    lines += memory_lines(report)
    flops = report["flops_per_device"]
    estimate = report["compiler_estimate_seconds"]
    lines += [
        f"XLA FLOPs per device: {'n/a' if flops is None else f'{flops:.3g}'} (attention kernels not counted: XLA sees a "
        "Pallas call as bytes only)",
        "compiler cost-model estimate: " + ("n/a (XLA's cost model returned no valid total)" if estimate is None
                                            else f"{estimate:.3g} s (excludes the attention kernels)"),
        f"compiled in {report['compile_seconds']:.0f} s on this machine: a memory and collective check, not a timing",
    ]
    return "\n".join(lines)

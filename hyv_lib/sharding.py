"""Device meshes and rule sets that map diffusers parameter names to JAX PartitionSpecs."""

from __future__ import annotations

import contextlib
import contextvars
import re
from dataclasses import dataclass
from typing import Any, Iterable

AXES = ("data", "tensor", "sequence")

# Megatron-style tensor parallelism on torch Linear weights ([out, in]): column-parallel layers split
# their output features (and bias), row-parallel layers split their input features; XLA adds the
# all-reduce after a row-parallel matmul.
_BLOCK = r"transformer_blocks\.\d+\."
_COLUMN = {"attn_qkv": _BLOCK + r"attn\.(to_q|to_k|to_v|add_q_proj|add_k_proj|add_v_proj)\.(weight|bias)",
           "mlp_in": _BLOCK + r"(ff|ff_context)\.net\.0\.proj\.(weight|bias)"}
_ROW = {"attn_out": _BLOCK + r"attn\.(to_out\.0|to_add_out)\.weight",
        "mlp_out": _BLOCK + r"(ff|ff_context)\.net\.2\.weight"}


@dataclass(frozen=True)
class Rule:
    """Parameters whose name fully matches ``pattern`` get ``spec`` (one entry per dim, cut to the ndim)."""

    name: str
    pattern: str
    spec: tuple

    def matches(self, param_name: str) -> bool:
        return re.fullmatch(self.pattern, param_name) is not None


def _column(name: str) -> list[Rule]:
    return [Rule(f"{name}/{part} column", p, ("tensor", None)) for part, p in _COLUMN.items()]


RULE_SETS: dict[str, list[Rule]] = {
    "tp": _column("tp") + [Rule(f"tp/{part} row", p, (None, "tensor")) for part, p in _ROW.items()],
    # gpu-tpu-pedia measured 8.12 -> 7.29 s/step on v6e-8 by keeping the row-parallel weights whole
    # (no split of the contraction dimension, so no partial sums to all-reduce for those matmuls).
    "tp_replicated_out": _column("tp_replicated_out")
    + [Rule(f"tp_replicated_out/{part} replicated", p, ()) for part, p in _ROW.items()],
    # Every block matrix split along its first dimension over all devices; XLA all-gathers it per use.
    "fsdp": [Rule("fsdp/matrix", _BLOCK + r".*\.weight", (AXES, None))],
}


def make_mesh(data: int = 1, tensor: int | None = None, sequence: int = 1, devices: Iterable | None = None):
    """A jax Mesh with axes (data, tensor, sequence); ``tensor`` defaults to what the devices leave.

    Works with ``XLA_FLAGS=--xla_force_host_platform_device_count=8`` (8 CPU devices) as on a v6e-8.
    """
    import jax
    import numpy as np
    from jax.sharding import Mesh

    devices = list(jax.devices() if devices is None else devices)
    if tensor is None:
        if len(devices) % (data * sequence):
            raise ValueError(f"data={data} x sequence={sequence} does not divide {len(devices)} devices")
        tensor = len(devices) // (data * sequence)
    if data * tensor * sequence != len(devices):
        raise ValueError(f"mesh data={data} x tensor={tensor} x sequence={sequence} = {data * tensor * sequence} "
                         f"devices, but {len(devices)} are present")
    return Mesh(np.array(devices).reshape(data, tensor, sequence), AXES)


def _fits(shape: tuple[int, ...], spec: tuple, mesh) -> bool:
    for dim, axes in zip(shape, spec):
        if axes is None:
            continue
        size = 1
        for axis in (axes if isinstance(axes, tuple) else (axes,)):
            size *= mesh.shape[axis]
        if dim % size:
            return False
    return len(spec) <= len(shape)


def plan(named_shapes: dict[str, tuple[int, ...]], rules: str | list[Rule], mesh) -> tuple[dict[str, tuple], list[dict]]:
    """Assign a spec to every parameter: the first matching rule, else replicated.

    Returns (name -> spec, report rows). Each row gives a rule's tensor count, parameters, and bytes per
    device per element byte (multiply by the dtype size). A rule that matches nothing, or a spec that
    does not divide its dimension, raises ValueError.
    """
    if isinstance(rules, str):
        if rules not in RULE_SETS:
            raise ValueError(f"sharding must be one of {', '.join(RULE_SETS)}, got {rules!r}")
        rules = RULE_SETS[rules]
    specs: dict[str, tuple] = {}
    stats: dict[str, dict[str, Any]] = {r.name: {"rule": r.name, "tensors": 0, "params": 0, "per_device": 0}
                                        for r in rules}
    stats["replicated (no rule)"] = {"rule": "replicated (no rule)", "tensors": 0, "params": 0, "per_device": 0}
    for name, shape in named_shapes.items():
        rule = next((r for r in rules if r.matches(name)), None)
        spec = rule.spec[: len(shape)] if rule else ()  # a bias takes the spec of its weight's first dim
        if rule and not _fits(shape, spec, mesh):
            raise ValueError(f"{rule.name}: {name} {list(shape)} cannot be split as {spec} on mesh {dict(mesh.shape)}")
        specs[name] = spec
        numel = 1
        for d in shape:
            numel *= d
        split = 1
        for axes in spec:
            for axis in (axes if isinstance(axes, tuple) else (axes,) if axes else ()):
                split *= mesh.shape[axis]
        row = stats[rule.name if rule else "replicated (no rule)"]
        row["tensors"] += 1
        row["params"] += numel
        row["per_device"] += numel // split
    unused = [r.name for r in rules if stats[r.name]["tensors"] == 0]
    if unused:
        raise ValueError(f"sharding rule(s) {', '.join(sorted(set(unused)))} matched no parameter")
    return specs, list(stats.values())


_ACTIVE_MESH: contextvars.ContextVar = contextvars.ContextVar("hyv_lib_active_mesh", default=None)


@contextlib.contextmanager
def active_mesh(mesh):
    """While tracing a sharded step: attention kernels read the mesh to run per shard (heads on
    "tensor", batch on "data") inside ``jax.shard_map``."""
    token = _ACTIVE_MESH.set(mesh)
    try:
        yield mesh
    finally:
        _ACTIVE_MESH.reset(token)


def per_shard(kernel):
    """Wrap a [B,H,S,D] attention kernel ``(q, k, v, kv_mask)`` in shard_map over the active mesh, if any.

    Splash is a Pallas kernel that GSPMD cannot partition, so each device runs it on its own heads and
    batch rows; XLA reshards q/k/v (e.g. sequence-sharded -> head-sharded) around the call.
    """
    mesh = _ACTIVE_MESH.get()
    if mesh is None:
        return kernel
    import jax
    from jax.sharding import PartitionSpec as P

    heads = P("data", "tensor", None, None)
    return jax.shard_map(kernel, mesh=mesh, in_specs=(heads, heads, heads, P("data", None)), out_specs=heads,
                         check_vma=False)

"""Mesh strings and device meshes: 'data=2,tensor=4' -> axes -> a JAX Mesh, the active mesh and the chip a program targets."""

from __future__ import annotations

import contextlib
import contextvars
from typing import Iterable

from ..base.checks import as_number
from ..base.errors import HyvInputError
from .jax_env import default_backend, jax_devices


def parse_mesh(text: str | None) -> dict[str, int] | None:
    """'data=2,tensor=4' -> {'data': 2, 'tensor': 4}; None or '' -> None (one device)."""
    if text is None or text == "":
        return None
    if not isinstance(text, str):
        raise HyvInputError("mesh", f"must be a string such as 'tensor=8' or 'data=2,tensor=4', got "
                                    f"{type(text).__name__} {text!r}")
    axes = {}
    for part in text.split(","):
        name, _, value = part.partition("=")
        if name.strip() not in AXES or not value.strip().isdigit() or int(value) < 1:
            raise HyvInputError("mesh", f"must be comma-separated AXIS=SIZE with AXIS in {', '.join(AXES)} "
                                        f"(e.g. tensor=8 or data=2,tensor=4), got {text!r}")
        axes[name.strip()] = int(value)
    return axes


AXES = ("data", "tensor", "sequence")
#: ``--mesh 1``: the jax runtime on one device, no mesh (without ``--mesh`` it lays every device out: :func:`default_mesh`).
ONE_DEVICE = "1"


def mesh_text(axes: dict[str, int] | None) -> str:
    """Axes -> the mesh string ``--mesh`` takes, axes of size 1 left out: {'data': 2, 'tensor': 4, 'sequence': 1} ->
    'data=2,tensor=4'; one device (or None) -> '1'."""
    return ",".join(f"{a}={int(n)}" for a, n in (axes or {}).items() if a in AXES and int(n) > 1) or "1"


def default_layout(devices: int, heads: int, rules: str | None = None, batch: int = 2) -> dict[str, int]:
    """The mesh hyv_lib lays ``devices`` out as when none is given: the one rule of the jax runtime
    (:func:`default_mesh`), ``python -m hyv_lib compile`` and the planner. The samples of one step (``batch``: the CFG
    pair, 2, or 1 with CFG off; :func:`hyv_lib.base.presets.samples_per_step`) go on ``data``, the rest on ``tensor``
    (on ``sequence`` for the ``fsdp`` rules, whose gathered weights leave a tensor axis nothing to split but the heads;
    ``rules`` None is the default strategy, :data:`hyv_lib.parallel.sharding.DEFAULT_STRATEGY`),
    as many ways as divide the model's ``heads`` (tensor x sequence splits them). The largest such layout, which may
    leave devices out: 2 heads on 8 devices are data=2,tensor=2 (4 devices) with CFG, tensor=2 without; 16 heads are
    data=2,tensor=4 and tensor=8. Of two layouts as large, the one with the data axis. One device: every axis 1."""
    for name, value in (("devices", devices), ("heads", heads), ("batch", batch)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    best = (0, 0, 0)  # (devices used, data, rest)
    for data in (d for d in range(1, min(batch, devices) + 1) if batch % d == 0):
        rest = max(r for r in range(1, devices // data + 1) if heads % r == 0)
        best = max(best, (data * rest, data, rest))
    _, data, rest = best
    return {"data": data, "tensor": 1, "sequence": 1, "sequence" if rules == "fsdp" else "tensor": rest}


def default_mesh(heads: int, batch: int = 2, rules: str | None = None,
                 devices: int | None = None) -> tuple[dict[str, int], str]:
    """The jax runtime's layout when no mesh is given: :func:`default_layout` of every JAX device (``devices``: their
    count, default ``len(jax.devices())``), and why, as the parenthesis of the line it logs
    (``mesh: data=2,tensor=4 (all 8 devices; --mesh 1 for one)``). A layout of fewer devices than there are says how
    many and what stops it (the heads; with ``batch`` 1, CFG off, the data axis has nothing to split)."""
    present = len(jax_devices()) if devices is None else devices
    axes = default_layout(present, heads, rules, batch)
    used = axes["data"] * axes["tensor"] * axes["sequence"]
    if present == 1:
        return axes, "the one device present"
    one = "" if used == 1 else "; --mesh 1 for one"
    if used == present:
        return axes, f"all {present} devices{one}"
    axis = "sequence" if rules == "fsdp" else "tensor"
    why = f"{axis} must divide the model's {heads} attention head{'s' * (heads != 1)}"
    if batch == 1:
        why += " and with CFG off (one sample per step) a data axis has nothing to split"
    return axes, f"{used} of {present} devices: {why}{one}"


def make_mesh(data: int | str = 1, tensor: int | None = None, sequence: int = 1, devices: Iterable | None = None):
    """A jax Mesh with axes (data, tensor, sequence), each a size >= 1 (a HyvInputError naming the axis otherwise);
    ``tensor`` defaults to what the devices leave. ``data`` may also be a mesh string, as everywhere else:
    ``make_mesh("data=2,tensor=4")`` (see :func:`parse_mesh`).

    Works with ``XLA_FLAGS=--xla_force_host_platform_device_count=8`` (8 CPU devices) as on a v6e-8.
    """
    import numpy as np
    from jax.sharding import Mesh

    if isinstance(data, str):
        if tensor is not None or sequence != 1:
            raise HyvInputError("mesh", "give a mesh string or axis sizes, not both")
        axes = parse_mesh(data) or {}
        data, tensor, sequence = axes.get("data", 1), axes.get("tensor"), axes.get("sequence", 1)
    data, tensor, sequence = (as_number(name, value, int, low=1) for name, value in (
        ("data", data), ("tensor", tensor), ("sequence", sequence)))  # make_mesh(data=0) divided by zero
    if data is None or sequence is None:
        raise HyvInputError("data" if data is None else "sequence", "must be an integer >= 1, got None")
    devices = list(jax_devices() if devices is None else devices)
    if tensor is None:
        if len(devices) % (data * sequence):
            raise ValueError(f"data={data} x sequence={sequence} does not divide {len(devices)} devices")
        tensor = len(devices) // (data * sequence)
    if data * tensor * sequence != len(devices):
        raise ValueError(f"mesh data={data} x tensor={tensor} x sequence={sequence} = {data * tensor * sequence} "
                         f"devices, but {len(devices)} {'is' if len(devices) == 1 else 'are'} present")
    return Mesh(np.array(devices).reshape(data, tensor, sequence), AXES)


_ACTIVE_MESH: contextvars.ContextVar = contextvars.ContextVar("hyv_lib_active_mesh", default=None)


def current_mesh():
    """The mesh of the innermost :func:`active_mesh` block, or None outside one."""
    return _ACTIVE_MESH.get()


@contextlib.contextmanager
def active_mesh(mesh):
    """While tracing a sharded step: attention kernels read the mesh to run per shard (heads on
    "tensor" x "sequence", batch on "data") inside ``jax.shard_map``."""
    token = _ACTIVE_MESH.set(mesh)
    try:
        yield mesh
    finally:
        _ACTIVE_MESH.reset(token)


def target_platform() -> str:
    """The platform the program being traced will run on: the active mesh's devices' (``tpu`` for a mesh of a
    deviceless TPU topology, compiled on a CPU host), else JAX's default backend."""
    mesh = _ACTIVE_MESH.get()
    if mesh is not None:
        return mesh.devices.flat[0].platform

    return default_backend()


def target_device_kind() -> str:
    """The ``device_kind`` of the devices the traced program targets (e.g. ``TPU v6 lite``): the active mesh's,
    else JAX's first default device's."""
    mesh = _ACTIVE_MESH.get()
    if mesh is not None:
        return mesh.devices.flat[0].device_kind

    return jax_devices()[0].device_kind


def head_axes(mesh) -> tuple[str, ...]:
    """Mesh axes the attention heads are split over: ``tensor`` and, when present, ``sequence``.

    Splitting heads over ``sequence`` too is what makes a sequence axis divide the attention: XLA turns the
    sequence-sharded q, k, v into head shards with an all-to-all (Ulysses inside the mesh); with heads on
    ``tensor`` alone, every sequence shard would compute the same heads over the whole sequence.
    """
    return tuple(a for a in ("tensor", "sequence") if mesh.shape[a] > 1) or ("tensor",)


def head_split(mesh) -> int:
    """How many ways the heads are split on ``mesh`` (tensor x sequence)."""
    return mesh.shape["tensor"] * mesh.shape["sequence"]

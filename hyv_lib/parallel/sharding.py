"""Weight-placement rules (parameter-name regex -> PartitionSpec), their planner, and activation layout pins."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from .mesh import AXES, current_mesh, head_axes

#: The weight-placement strategies (the ``--sharding`` values). Each model's glue
#: (:class:`hyv_lib.models.adapter.ModelAdapter`) turns them into rule sets over its own parameter names, usually
#: with :func:`tensor_parallel_rule_sets`.
STRATEGIES = ("tp", "tp_replicated_out", "fsdp")
#: The strategy every runtime, the compile path and the planner use unless told: ``tp`` with the row-parallel weights
#: kept whole on every device (the book's notation page says what the compiled program does with it).
DEFAULT_STRATEGY = "tp_replicated_out"

#: Strategies whose block weights are all-gathered whole right before each block (FSDP). Without the explicit
#: gather, XLA's partitioner keeps the split weight and splits each matmul's output features over every device
#: instead, resharding activations back and forth (collective-permutes on the modulation chunks, all-gathers of the
#: MLP activations; seen in the TPU compiler's HLO).
GATHERED_RULE_SETS = ("fsdp",)


@dataclass(frozen=True)
class Rule:
    """Parameters whose name fully matches ``pattern`` get ``spec`` (one entry per dim, cut to the ndim)."""

    name: str
    pattern: str
    spec: tuple

    def matches(self, param_name: str) -> bool:
        return re.fullmatch(self.pattern, param_name) is not None


def tensor_parallel_rule_sets(block: str, column: dict[str, str], row: dict[str, str]) -> dict[str, list[Rule]]:
    """The rule set of each of :data:`STRATEGIES` for a transformer whose block parameters are named ``block`` +
    ``...`` (a regex such as ``r"transformer_blocks\\.\\d+\\."``).

    Megatron-style tensor parallelism on torch Linear weights ([out, in]): ``column`` patterns (each a regex after
    ``block``; Q/K/V, the MLP's first layer) split their output features (and bias), ``row`` patterns (the attention
    output, the MLP's second layer) their input features; XLA adds the all-reduce after a row-parallel matmul.

    - ``tp``: column and row split.
    - ``tp_replicated_out``: column split, row-parallel weights kept whole. gpu-tpu-pedia measured 8.12 -> 7.29
      s/step for HunyuanVideo-1.5 on v6e-8 this way. The collectives are swapped, not avoided: the compiled program
      all-gathers the head-split activations before those matmuls instead of all-reducing their partial sums, and
      every device holds those weights whole (chapter 3 prints both from the TPU compiler).
    - ``fsdp``: every block matrix stored split along its first dimension over all devices and gathered whole just
      before its block runs (:data:`GATHERED_RULE_SETS`); compute then splits over the axes that split the
      activations: data (samples) and sequence (tokens), so pair it with a mesh like data=2,sequence=4.
    """
    def rules(parts: dict[str, str], name: str, kind: str, spec: tuple) -> list[Rule]:
        return [Rule(f"{name}/{part} {kind}", block + pattern, spec) for part, pattern in parts.items()]

    return {
        "tp": rules(column, "tp", "column", ("tensor", None)) + rules(row, "tp", "row", (None, "tensor")),
        "tp_replicated_out": (rules(column, "tp_replicated_out", "column", ("tensor", None))
                              + rules(row, "tp_replicated_out", "replicated", ())),
        "fsdp": [Rule("fsdp/matrix", block + r".*\.weight", (AXES, None))],
    }


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


def plan(named_shapes: dict[str, tuple[int, ...]], rules: list[Rule], mesh) -> tuple[dict[str, tuple], list[dict]]:
    """Assign a spec to every parameter: the first matching rule of ``rules`` (e.g. one rule set of a model's
    :attr:`hyv_lib.models.adapter.ModelAdapter.rule_sets`), else replicated.

    Returns (name -> spec, report rows). Each row gives a rule's tensor count, parameters, and bytes per
    device per element byte (multiply by the dtype size). A rule that matches nothing, or a spec that
    does not divide its dimension, raises ValueError.
    """
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


def keep_heads_split(hidden):
    """Pin a [B, S, H*D] attention output (a torchax tensor) to the kernel's layout, features split like the heads.

    On a mesh with a ``sequence`` axis the caller next cuts the joint sequence into video and context tokens; left
    unpinned, XLA's partitioner propagates the video tokens' sequence split back into that slice, finds no cheap
    way from heads-split to tokens-split there, and replicates the whole output on every device ("involuntary
    full rematerialization"). Pinned, the slice stays local and the reshard becomes an all-to-all afterwards.
    """
    mesh = current_mesh()
    if mesh is None or mesh.shape["sequence"] == 1:
        return hidden
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P
    from torchax.interop import call_jax

    return call_jax(jax.lax.with_sharding_constraint, hidden, NamedSharding(mesh, P("data", None, head_axes(mesh))))


def gather_whole(tensor):
    """A weight all-gathered to every device of the active mesh (FSDP's per-block gather); a no-op without one."""
    mesh = current_mesh()
    if mesh is None:
        return tensor
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P
    from torchax.interop import call_jax

    return call_jax(jax.lax.with_sharding_constraint, tensor, NamedSharding(mesh, P()))


def stream_layout(hidden, video: bool = False):
    """Pin a stream's [B, N, H*D] attention output to the layout its output projection wants on a mesh with a
    ``sequence`` axis: features split over ``tensor``, and video tokens split over ``sequence`` (context tokens
    whole). From the kernel's layout (features over tensor x sequence) this is one all-to-all over ``sequence``:
    the second all-to-all of Ulysses."""
    mesh = current_mesh()
    if mesh is None or mesh.shape["sequence"] == 1:
        return hidden
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P
    from torchax.interop import call_jax

    spec = P("data", "sequence" if video else None, "tensor")
    return call_jax(jax.lax.with_sharding_constraint, hidden, NamedSharding(mesh, spec))


def per_shard(kernel):
    """Wrap a [B,H,S,D] attention kernel ``(q, k, v, kv_mask)`` in shard_map over the active mesh, if any.

    Splash is a Pallas kernel that GSPMD cannot partition, so each device runs it on its own heads and
    batch rows (heads over tensor x sequence, see :func:`head_axes`); XLA reshards q/k/v
    (e.g. sequence-sharded -> head-sharded) around the call.
    """
    mesh = current_mesh()
    if mesh is None:
        return kernel
    import jax
    from jax.sharding import PartitionSpec as P

    heads = P("data", head_axes(mesh), None, None)
    return jax.shard_map(kernel, mesh=mesh, in_specs=(heads, heads, heads, P("data", None)), out_specs=heads,
                         check_vma=False)


def plan_fsdp(named_shapes: dict[str, tuple[int, ...]], rules: list[Rule],
              mesh) -> tuple[dict[str, tuple], list[dict]]:
    """:func:`plan` for a train step, where every parameter with optimizer state should be split: a parameter that a
    rule of ``rules`` (e.g. a model's ``fsdp`` rule set) places, and whose split divides it, takes that rule's spec;
    every other one (embedders, the head, a LoRA factor whose rank the mesh does not divide) is split along its first
    dimension that all the mesh's devices divide, and only one that has none stays replicated.

    Returns (name -> spec, report rows) in :func:`plan`'s format; a rule that matches nothing is no error here (a LoRA
    model renames the weights it wraps).
    """
    devices = 1
    for axis in AXES:
        devices *= mesh.shape[axis]
    specs: dict[str, tuple] = {}
    stats: dict[str, dict[str, Any]] = {}
    for name, shape in named_shapes.items():
        rule = next((r for r in rules if r.matches(name)), None)
        spec = rule.spec[: len(shape)] if rule else None
        label = rule.name if rule else ""
        if spec is None or not _fits(shape, spec, mesh):
            dim = next((i for i, d in enumerate(shape) if d % devices == 0), None)
            spec = () if dim is None or devices == 1 else (None,) * dim + (AXES,)
            label = "fsdp/first divisible dim" if spec else "replicated (no divisible dim)"
        specs[name] = spec
        numel = 1
        for d in shape:
            numel *= d
        row = stats.setdefault(label, {"rule": label, "tensors": 0, "params": 0, "per_device": 0})
        row["tensors"] += 1
        row["params"] += numel
        split = 1
        for axes in spec:
            for axis in (axes if isinstance(axes, tuple) else (axes,) if axes else ()):
                split *= mesh.shape[axis]
        row["per_device"] += numel // split
    return specs, list(stats.values())


def shard_tokens(tokens):
    """Pin [B, N, C] tokens (a torchax tensor) to samples over ``data`` and tokens over ``sequence`` on the active
    mesh (the video tokens between blocks); a no-op without a mesh or a sequence axis."""
    mesh = current_mesh()
    if mesh is None or mesh.shape["sequence"] == 1:
        return tokens
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P
    from torchax.interop import call_jax

    return call_jax(jax.lax.with_sharding_constraint, tokens, NamedSharding(mesh, P("data", "sequence", None)))

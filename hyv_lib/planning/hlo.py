"""Reading compiled programs: XLA's FLOP counts and the collectives (with their bytes) in HLO text."""

from __future__ import annotations

import functools
import math
import re
from typing import Any


def xla_flops(compiled) -> dict[str, Any]:
    """XLA's own counts for a compiled JAX program (``jax.jit(f).lower(...).compile()``).

    ``cost_analysis`` is XLA's HloCostAnalysis: dots as 2 MNK, every elementwise op and reduction as
    1 FLOP per element, exp/tanh/rsqrt under ``transcendentals``; it counts a while loop's body ONCE,
    whatever its trip count (jax 0.10.2), so a ``lax.scan`` over key blocks is undercounted.
    ``matmul`` re-counts only dots and convolutions from the optimised HLO text (2 x output elements x
    contracted size) with while bodies multiplied by their trip count (XLA's ``known_trip_count``, or the constant N
    of a scan's ``i < N`` condition): the number to compare with :func:`step_flops`. ``unknown_trip_counts`` counts
    loops whose body was counted once.
    """
    text = compiled.as_text()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    computations: dict[str, list[str]] = {}
    entry, current = None, None
    for line in text.splitlines():
        head = re.match(r"^(ENTRY )?%([\w.\-]+) .*\{$", line)
        if head:
            current = head.group(2)
            computations[current] = []
            entry = current if head.group(1) else entry
        elif line.rstrip() == "}":  # not "}}, metadata=...": a custom call's multi-line config (Splash) ends so
            current = None
        elif current is not None:
            computations[current].append(line)
    operand = r"(?:\w+\[[\d,]*\]\S* )?%([\w.\-]+)"
    unknown = 0

    def counted_loop(name: str) -> int:
        """N for a loop condition ``i < N`` on a constant N (a scan's, whose counter starts at 0; the TPU compiler's
        loops carry no known_trip_count), else 0."""
        constants = {}
        for line in computations.get(name, ()):
            found = re.match(r"\s*%([\w.\-]+) = s32\[\]\S* constant\((\d+)\)", line)
            if found:
                constants[found.group(1)] = int(found.group(2))
            compare = re.match(rf"\s*ROOT %[\w.\-]+ = pred\[\]\S* compare\({operand}, {operand}\), direction=LT", line)
            if compare and compare.group(2) in constants:
                return constants[compare.group(2)]
        return 0

    @functools.lru_cache(maxsize=None)
    def count(name: str) -> int:
        nonlocal unknown
        shapes, own, calls = {}, 0, []
        for line in computations.get(name, ()):
            m = re.match(r"\s*(?:ROOT )?%([\w.\-]+) = \w+\[([\d,]*)\]", line)
            if m:
                shapes[m.group(1)] = [int(v) for v in m.group(2).split(",") if v]
            out = [int(v) for v in m.group(2).split(",") if v] if m else None
            dot = re.search(rf" dot\({operand}, {operand}\).*lhs_contracting_dims=\{{([\d,]*)\}}", line)
            if dot and out is not None:
                lhs = shapes[dot.group(1)]
                own += 2 * math.prod(out) * math.prod(lhs[int(i)] for i in dot.group(3).split(",") if i)
            conv = re.search(rf" convolution\({operand}, {operand}\).*dim_labels=(\w+)_(\w+)->", line)
            if conv and out is not None:
                # per output element: the kernel's input features (already per feature group) times the kernel
                # taps that can land on the input: min(kernel, input) along each spatial dim. The TPU compiler
                # writes some dots as a convolution of a size-1 input under a padded window (one tap, not the
                # window's size).
                lhs, rhs = shapes[conv.group(1)], shapes[conv.group(2)]
                lhs_labels, rhs_labels = conv.group(3), conv.group(4)
                taps = math.prod(min(rhs[rhs_labels.index(d)], lhs[lhs_labels.index(d)])
                                 for d in rhs_labels if d.isdigit())
                own += 2 * math.prod(out) * rhs[rhs_labels.index("i")] * taps
            trips = 1
            if re.search(r" while\(", line):
                known = re.search(r'"known_trip_count":\{"n":"(\d+)"\}', line)
                condition = re.search(r"condition=%([\w.\-]+)", line)
                trips = int(known.group(1)) if known else counted_loop(condition.group(1) if condition else "")
                unknown += 0 if trips else 1
                trips = trips or 1
            for kind, callee in re.findall(r"(calls|to_apply|body|condition)=%([\w.\-]+)", line):
                calls.append((callee, trips if kind == "body" else 1))
            for group in re.findall(r"branch_computations=\{([^}]*)\}", line):
                calls.extend((c.strip().lstrip("%"), 1) for c in group.split(","))
        return own + sum(t * count(c) for c, t in calls)

    if entry is None:
        raise ValueError("no ENTRY computation in the compiled HLO text")
    matmul = count(entry)
    return dict(cost_analysis=float(cost["flops"]), transcendentals=float(cost.get("transcendentals", 0.0)),
                bytes_accessed=float(cost.get("bytes accessed", 0.0)), matmul=matmul, unknown_trip_counts=unknown)


# ----------------------------------------------------------------------------------- collectives in HLO
HLO_COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
_HLO_BYTES = {"f64": 8, "f32": 4, "bf16": 2, "f16": 2, "s64": 8, "s32": 4, "u32": 4, "s8": 1, "u8": 1, "pred": 1}


def hlo_collectives(hlo_text: str) -> dict[str, dict[str, int]]:
    """Count the collectives of a compiled program (``compiled.as_text()``) and the bytes of their results.

    What XLA actually inserted, to hold against :func:`collective_bytes`' prediction. ``count`` is HLO
    instructions (async ``-start``/``-done`` pairs once), ``buffers`` the arrays they carry (XLA's
    combiners merge several all-reduces into one instruction), ``bytes`` those arrays' total size.
    """
    found = {op: {"count": 0, "buffers": 0, "bytes": 0} for op in HLO_COLLECTIVES}
    for line in hlo_text.splitlines():
        for op in HLO_COLLECTIVES:
            match = re.search(rf"= (.*?) {op}(?:-start)?\(", line)
            if match:
                found[op]["count"] += 1
                for dtype, dims in re.findall(r"(\w+)\[([\d,]*)\]", match.group(1)):
                    found[op]["buffers"] += 1
                    found[op]["bytes"] += math.prod(int(d) for d in dims.split(",") if d) * _HLO_BYTES.get(dtype, 4)
    return found


def _group_size(line: str) -> int | None:
    """Devices per replica group of one collective instruction: ``replica_groups=[G,N]<=[...]`` (iota form),
    ``{{0,1,2,3},{4,5,6,7}}``, or the mesh form ``mesh['axis_0'=2,'axis_1'=4] {'axis_1'}`` (the named axes' sizes
    multiplied); None when the line has none (a collective-permute)."""
    named = re.search(r"replica_groups=mesh\[([^\]]*)\][^{]*\{([^}]*)\}", line)
    if named:
        sizes = {k: int(v) for k, v in re.findall(r"'(\w+)'=(\d+)", named.group(1))}
        return math.prod(sizes[axis] for axis in re.findall(r"'(\w+)'", named.group(2)))
    iota = re.search(r"replica_groups=\[(\d+),(\d+)\]<=", line)
    if iota:
        return int(iota.group(2))
    listed = re.search(r"replica_groups=\{\{([\d,]*)\}", line)
    return len(listed.group(1).split(",")) if listed else None


def hlo_collective_ops(hlo_text: str) -> list[dict[str, Any]]:
    """The collectives of a compiled program grouped by (kind, devices per group, result shapes): ``count``, result
    ``bytes`` per instruction, and ``sent_bytes``: what each device puts on the wire for all of them, by the ring
    algorithm's count (an all-reduce of m bytes over n devices sends 2 (n-1)/n m, an all-gather or all-to-all
    (n-1)/n m of its result, a reduce-scatter (n-1) m of its result, a collective-permute m). Sorted by sent
    bytes, largest first."""
    rows: dict[tuple, dict[str, Any]] = {}
    for line in hlo_text.splitlines():
        for op in HLO_COLLECTIVES:
            match = re.search(rf"= (.*?) {op}(?:-start)?\(", line)
            if not match:
                continue
            # an async start's tuple holds the operand before the result, and scalar u32 contexts
            shapes = [(t, d) for t, d in re.findall(r"(\w+)\[([\d,]*)\]", match.group(1)) if d]
            if f"{op}-start(" in line and op in ("all-gather", "collective-permute"):
                shapes = shapes[len(shapes) // 2:]
            nbytes = sum(math.prod(int(d) for d in dims.split(",") if d) * _HLO_BYTES.get(dtype, 4)
                         for dtype, dims in shapes)
            n = _group_size(line)
            key = (op, n, ",".join(f"{t}[{d}]" for t, d in shapes))
            row = rows.setdefault(key, dict(kind=op, group=n, shapes=key[2], count=0, bytes=nbytes, sent_bytes=0.0))
            row["count"] += 1
            share = 1.0 if n is None else (n - 1) / n
            row["sent_bytes"] += nbytes * {"all-reduce": 2 * share, "reduce-scatter": (n or 1) - 1,
                                           "collective-permute": 1.0}.get(op, share)
    return sorted(rows.values(), key=lambda r: -r["sent_bytes"])

"""Where one jitted step's time goes: a ``jax.profiler`` trace of the step, per HLO op, grouped by kind."""

from __future__ import annotations

import dataclasses
import glob
import gzip
import json
import os
import re
import tempfile
import time
from collections import defaultdict
from typing import Any, Callable

#: The kinds an op of the step is grouped into (:func:`classify_hlo`), in the order tables show them.
OP_KINDS = ("linear matmuls", "attention matmuls", "attention softmax and mask", "other")
#: Ops that only run other ops (a ``lax.scan`` becomes a ``while``): their time is their body's, so they are not
#: counted again.
CONTAINER_OPCODES = ("while", "conditional", "call")


@dataclasses.dataclass(frozen=True)
class HloOp:
    """One instruction of a compiled program, as the profiler names it."""

    name: str
    opcode: str
    shape: str  # the result's shape, e.g. ``f32[2,4,2096,528]``
    kind: str  # one of OP_KINDS, or "container"
    source: str  # the JAX op path XLA kept in the metadata (``op_name``), without the jit prefix
    weight: str  # the parameter a matmul reads, when it reads one (``transformer_blocks_1_ff_net_2``)


@dataclasses.dataclass
class StepProfile:
    """One traced step, op by op. Times are seconds per step (the mean over the traced repeats)."""

    ops: list[dict[str, Any]]  # name, kind, seconds, share, calls, shape, source, weight; longest first
    by_kind: dict[str, float]  # seconds per kind of OP_KINDS
    op_seconds: float  # the ops' times summed (containers left out)
    busy_seconds: float  # the time at least one op ran: the union of the ops' intervals
    wall_seconds: float  # the traced call, host work and the copy of the result included
    repeats: int
    trace_dir: str | None  # where jax.profiler wrote the trace (XProf or Perfetto open it); None: not kept

    @property
    def shares(self) -> dict[str, float]:
        """Each kind's fraction of the ops' time; they sum to 1."""
        return {kind: seconds / self.op_seconds for kind, seconds in self.by_kind.items()}

    def top(self, n: int = 10, kind: str | None = None) -> list[dict[str, Any]]:
        """The ``n`` longest ops (of one kind of :data:`OP_KINDS`, if given), as table rows."""
        if kind is not None and kind not in OP_KINDS:
            raise ValueError(f"kind must be one of {', '.join(OP_KINDS)}, got {kind!r}")
        ops = [o for o in self.ops if kind is None or o["kind"] == kind][:n]
        return [{"op": o["name"], "kind": o["kind"], "ms/step": round(1e3 * o["seconds"], 2),
                 "share": f"{o['share']:.1%}", "runs/step": o["calls"], "result": o["shape"],
                 "reads weight": o["weight"] or "", "JAX op (metadata)": o["source"]} for o in ops]


# ------------------------------------------------------------------------------------------- the program
_COMPUTATION = re.compile(r"^(ENTRY )?%([\w.\-]+) .*\{$")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%([\w.\-]+) = (.*)$")


def _split_shape(rest: str) -> tuple[str, str]:
    """``'f32[2,3]{1,0} dot(%a, %b), ...'`` -> (``'f32[2,3]{1,0}'``, ``'dot(%a, %b), ...'``); tuple shapes too."""
    if rest.startswith("("):
        depth = 0
        for i, ch in enumerate(rest):
            depth += {"(": 1, ")": -1}.get(ch, 0)
            if depth == 0:
                return rest[:i + 1], rest[i + 2:]
    shape, _, tail = rest.partition(" ")
    return shape, tail


def _dims(shape: str) -> str:
    """The dtype and dimensions of an array shape, without the layout: ``f32[2,3]{1,0}`` -> ``f32[2,3]``."""
    match = re.match(r"\w+\[[\d,]*\]", shape)
    return match.group(0) if match else shape


def parse_hlo(hlo_text: str) -> dict[str, list[dict[str, Any]]]:
    """The instructions of an HLO module's text (``compiled.as_text()``) by computation: name, opcode, result
    shape, operands, called computations and metadata op_name. ``"__entry__"`` names the entry computation."""
    computations: dict[str, list[dict[str, Any]]] = {}
    current = None
    for line in hlo_text.splitlines():
        head = _COMPUTATION.match(line)
        if head:
            current = head.group(2)
            computations[current] = []
            if head.group(1):
                computations["__entry__"] = [{"name": current}]
            continue
        if line.startswith("}"):
            current = None
            continue
        match = _INSTRUCTION.match(line)
        if current is None or not match:
            continue
        shape, tail = _split_shape(match.group(2))
        opcode = re.match(r"([\w\-]+)\(", tail)
        args = tail[tail.find("(") + 1:] if opcode else ""
        operands = re.findall(r"%([\w.\-]+)", args.split("),")[0]) if opcode else []
        called = re.findall(r"(?:calls|body|condition|to_apply|branch_computations)=\{?%([\w.\-]+)", tail)
        called += [c for group in re.findall(r"branch_computations=\{([^}]*)\}", tail)
                   for c in re.findall(r"%([\w.\-]+)", group)]
        op_name = re.search(r'op_name="([^"]*)"', tail)
        computations[current].append({
            "name": match.group(1), "opcode": opcode.group(1) if opcode else "", "shape": _dims(shape),
            "operands": operands, "called": called, "line": line, "op_name": op_name.group(1) if op_name else ""})
    return computations


def classify_hlo(hlo_text: str) -> dict[str, HloOp]:
    """Every instruction a profiler can name, with its kind (:data:`OP_KINDS`).

    - **matmuls** are the ops that are, or fuse, a ``dot`` or ``convolution``. A dot with batch dimensions
      (``lhs_batch_dims``) is attention's :math:`QK^\\top` or :math:`PV`, batched over samples and heads; one
      without is a linear layer, activations times a weight matrix.
    - **attention softmax and mask** are the other ops that produce or read a *score* tensor: a result of a batched
      dot that another batched dot reads (the scores of :math:`QK^\\top`, which the softmax turns into the
      weights of :math:`PV`).
    - **other**: everything else (norms, RoPE, activations, residual adds, copies and transposes).

    Ops that run other computations (``while``, ``conditional``, ``call``) are ``"container"``.
    """
    computations = parse_hlo(hlo_text)
    computations.pop("__entry__", None)
    shapes = {c: {i["name"]: i["shape"] for i in instrs} for c, instrs in computations.items()}
    dots: dict[str, list[dict]] = defaultdict(list)  # computation -> its dot / convolution instructions
    for c, instrs in computations.items():
        dots[c] = [i for i in instrs if i["opcode"] in ("dot", "convolution")]

    def batched(dot: dict) -> bool:
        return dot["opcode"] == "dot" and re.search(r"lhs_batch_dims=\{\d", dot["line"]) is not None

    batched_out, batched_in = set(), set()
    for c, found in dots.items():
        for d in found:
            if batched(d):
                batched_out.add(d["shape"])
                batched_in.update(shapes[c].get(o, "") for o in d["operands"])
    scores = batched_out & batched_in

    def matmuls(instr: dict, seen: frozenset = frozenset()) -> list[dict]:
        """The dots an instruction is or fuses (through its called computations)."""
        found = [instr] if instr["opcode"] in ("dot", "convolution") else []
        if instr["opcode"] in CONTAINER_OPCODES:
            return found
        for c in instr["called"]:
            if c in computations and c not in seen:
                found += dots[c]
                for inner in computations[c]:
                    found += [m for m in matmuls(inner, seen | {c}) if m not in found]
        return found

    ops = {}
    for c, instrs in computations.items():
        for instr in instrs:
            found = matmuls(instr)
            if instr["opcode"] in CONTAINER_OPCODES:
                kind = "container"
            elif found:
                kind = "attention matmuls" if any(batched(d) for d in found) else "linear matmuls"
            else:
                touched = {instr["shape"], *(shapes[c].get(o, "") for o in instr["operands"])}
                for inner in instr["called"]:
                    touched.update(shapes.get(inner, {}).values())
                kind = "attention softmax and mask" if touched & scores else "other"
            weight = re.search(r"%args_\d+___model_([\w]+?)_(?:weight|bias)_", instr["line"])
            ops[instr["name"]] = HloOp(instr["name"], instr["opcode"], instr["shape"], kind,
                                       re.sub(r"^jit\([^)]*\)/", "", instr["op_name"]),
                                       weight.group(1) if weight else "")
    return ops


def module_name(hlo_text: str) -> str:
    """The name the profiler gives the program's events (``hlo_module``): the text's ``HloModule`` line."""
    match = re.search(r"^HloModule ([\w.\-]+)", hlo_text, re.M)
    if not match:
        raise ValueError("no HloModule line in the HLO text")
    return match.group(1)


# --------------------------------------------------------------------------------------------- the trace
def trace_events(trace_dir: str) -> list[dict[str, Any]]:
    """The complete events (``"ph": "X"``) of the newest Perfetto trace under ``trace_dir``
    (``jax.profiler.trace(trace_dir, create_perfetto_trace=True)``), times in microseconds."""
    found = sorted(glob.glob(os.path.join(trace_dir, "**", "perfetto_trace.json.gz"), recursive=True),
                   key=os.path.getmtime)
    if not found:
        raise FileNotFoundError(f"no perfetto_trace.json.gz under {trace_dir}: trace with create_perfetto_trace=True")
    with gzip.open(found[-1]) as f:
        data = json.load(f)
    events = data["traceEvents"] if isinstance(data, dict) else data
    return [e for e in events if e.get("ph") == "X"]


def _union(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for start, stop in sorted(intervals):
        if stop > end:
            total += stop - max(start, end)
            end = stop
    return total


def profile_step(call: Callable[[], Any], hlo_text: str, *, repeats: int = 1,
                 trace_dir: str | None = None) -> StepProfile:
    """Run ``call`` (one whole step, returning when its result is on the host) ``repeats`` times under
    ``jax.profiler.trace`` and attribute the trace's device events to the ops of ``hlo_text``
    (``jax.jit(f).lower(...).compile().as_text()`` of the program ``call`` runs).

    Warm ``call`` up first: a call that compiles would put the compiler in the profile. Each op's time is the sum
    of its events (a ``while`` body's ops run once per iteration), divided by ``repeats``; containers are left out,
    their time being their body's. ``busy_seconds`` is the union of the ops' intervals: the device's busy time,
    which ``wall_seconds`` exceeds by the host's work (Python, dispatch, input and output copies). The trace is kept
    in ``trace_dir`` when one is given, else written to a temporary folder and removed.
    """
    import jax

    if repeats < 1:
        raise ValueError(f"repeats must be a positive integer, got {repeats}")
    ops = classify_hlo(hlo_text)
    module = module_name(hlo_text)
    with tempfile.TemporaryDirectory(prefix="hyv_profile_") as scratch:
        folder = trace_dir or scratch
        with jax.profiler.trace(folder, create_perfetto_trace=True):
            start = time.perf_counter()
            for _ in range(repeats):
                call()
            wall = (time.perf_counter() - start) / repeats
        events = trace_events(folder)
    seconds: dict[str, float] = defaultdict(float)
    calls: dict[str, int] = defaultdict(int)
    intervals = []
    for event in events:
        args = event.get("args") or {}
        name = args.get("hlo_op")
        if not name or args.get("hlo_module") != module or name not in ops or ops[name].kind == "container":
            continue
        seconds[name] += event["dur"] * 1e-6
        calls[name] += 1
        intervals.append((event["ts"] * 1e-6, (event["ts"] + event["dur"]) * 1e-6))
    if not seconds:
        raise RuntimeError(f"the trace holds no op of {module}: was the step traced after it compiled?")
    total = sum(seconds.values())
    rows = [{"name": name, "kind": ops[name].kind, "seconds": s / repeats, "share": s / total,
             "calls": round(calls[name] / repeats, 2), "shape": ops[name].shape, "source": ops[name].source,
             "weight": ops[name].weight} for name, s in sorted(seconds.items(), key=lambda kv: -kv[1])]
    by_kind = {kind: sum(r["seconds"] for r in rows if r["kind"] == kind) for kind in OP_KINDS}
    return StepProfile(rows, by_kind, total / repeats, _union(intervals) / repeats, wall, repeats, trace_dir)


def profile_transformer(transformer, kwargs: dict[str, Any], *, repeats: int = 1,
                        trace_dir: str | None = None) -> StepProfile:
    """:func:`profile_step` for a :class:`hyv_lib.runtimes.jax_step.JaxTransformer` on the forward's keyword
    arguments: one warm-up call (it compiles), then ``repeats`` traced steps."""
    transformer(**kwargs)
    hlo_text = transformer.lower(**kwargs).compile().as_text()  # the program just compiled (jax's cache)
    return profile_step(lambda: transformer(**kwargs), hlo_text, repeats=repeats, trace_dir=trace_dir)

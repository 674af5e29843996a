"""Per-device collectives and block-matmul FLOPs of one denoising step under a rule set on a mesh, as XLA compiles it."""

from __future__ import annotations

import math
import re
from typing import Any, Mapping

from ..base.presets import Preset
from ..models.registry import get_adapter
from .costs import parameter_shapes, plan_specs, split_factor, step_flops, token_counts


def fsdp_splits_heads(rules: str, mesh: Mapping[str, int]) -> bool:
    """Whether XLA runs ``fsdp`` as a mixed layout: with a tensor axis the matmuls feeding the head-split attention
    (Q/K/V) run column-parallel, sliced to the local heads, not whole (read from the TPU compiler's HLO:
    benchmarks/results/hunyuanvideo_compile_2026-11-28_cpu_libtpu.json; tests/test_hunyuan_video_plan.py)."""
    return rules == "fsdp" and mesh["tensor"] > 1


def fsdp_qkv_on_shards(rules: str, mesh: Mapping[str, int]) -> bool:
    """Whether ``fsdp``'s Q/K/V shards are used as they lie, never gathered: on a mesh of tensor devices alone
    (data = sequence = 1) a matrix's fsdp shards (split by output features over every device) are exactly the tensor
    axis' column shards; with a data or sequence axis they are not, and XLA gathers them (then slices)."""
    return fsdp_splits_heads(rules, mesh) and mesh["data"] == mesh["sequence"] == 1


def layout_costs(preset: Preset, height: int, width: int, video_length: int, mesh: Mapping[str, int], rules: str,
                 dims: Mapping[str, int], batch: int, x: int, attention: Any = None) -> dict[str, Any]:
    """Collectives (result bytes per kind, as :func:`hyv_lib.planning.hlo.hlo_collectives` counts them), bytes sent
    per device, FLOPs per device and the bytes of weights ``jax.jit`` drops, for
    :func:`hyv_lib.planning.planner.device_plan` (whose docstring states the model). With b = ``batch`` / data
    samples, N_v = video tokens / sequence, N_c context tokens, N_j = (video + context) / sequence (a single-stream
    block splits its joint sequence over the sequence axis), t = tensor, s = sequence, x = ``x`` bytes:

    - a sequence axis adds, per single-stream block, 6 all-to-alls of [b, N_j, h / t] (q, k, v to head shards, the
      output back, and q and k again around RoPE, which rotates the video rows only), 4 of the whole hidden [b, N_j
      or N_v, h] (the [video ; text] concatenation and its split re-laid out between token and feature shards), an
      all-gather of the text rows [b, N_c, h] and collective-permutes of [b, N_c / s, h] (4 per block, one less in
      all), all read from the compiled HLO (tensor=4,sequence=2: the real 720p step and the tiny model).
    - ``fsdp`` on a tensor axis alone (:func:`fsdp_splits_heads`): the dual-stream blocks' Q/K/V run column-parallel
      on their shards, the attention output is all-gathered (as ``tp_replicated_out``) and the attention outputs and
      MLPs run whole on gathered weights; the single-stream blocks run as under ``tp`` (Q/K/V and proj_mlp on their
      shards, proj_out sliced to the local features and all-reduced); every other block matrix is gathered.
    """
    d_, t, sq = mesh["data"], mesh["tensor"], mesh["sequence"]
    h, f, layers = dims["hidden"], dims["mlp"], dims["layers"]
    tok = token_counts(preset, height, width, video_length)
    b = batch // d_
    nv, nc, lt = -(-tok["video"] // sq), tok["context"], preset.text_len
    refiner = dims["refiner_layers"]
    single, f_single = dims.get("single_layers", 0), dims.get("single_mlp", 0)  # single-stream blocks (HunyuanVideo)
    nj = -(-tok["joint"] // sq)  # a single-stream block's local rows of [video ; text]
    mixed = fsdp_splits_heads(rules, mesh)

    # ---- collectives (HLO result bytes per device) and their group sizes
    coll = {"all-reduce": 0.0, "all-gather": 0.0, "all-to-all": 0.0}
    sent = 0.0

    def add(kind, nbytes, group):
        nonlocal sent
        coll[kind] = coll.get(kind, 0.0) + nbytes
        if kind == "collective-permute":  # each sends its whole buffer to one peer
            sent += nbytes / 2
        elif group > 1:
            sent += nbytes * (2 if kind == "all-reduce" else 1) * (group - 1) / group

    # jax.jit drops arguments the program never reads: the last block's context-stream weights after attention (none
    # when single-stream blocks follow: they read that stream)
    prefix = get_adapter(preset.model).block_prefix  # "transformer_blocks."
    last = f"{prefix}{layers - 1}."
    shapes = parameter_shapes(preset)
    dead_names = {name for name, _ in shapes
                  if not single and name.startswith(last) and re.search(r"to_add_out|ff_context", name)}
    specs, _ = plan_specs(preset, rules, dict(mesh))
    dead_bytes = sum(math.prod(shape) // split_factor(specs[name], mesh) for name, shape in shapes
                     if name in dead_names) * x
    if t * sq > 1:
        add("all-gather", refiner * b * lt * h * x, t * sq)
    # context rows through the row-parallel outputs: HunyuanVideo-1.5 drops the last block's context stream after
    # attention (to_add_out, ff_context); nothing is dead where the MLP runs on [text ; video] (CogVideoX's last
    # block keeps the text rows) or single-stream blocks read the last dual block's context stream (HunyuanVideo's)
    joint = dims["streams"] == 1
    context_blocks = layers if joint or single else layers - 1
    if sq > 1:
        add("all-to-all", 4 * layers * b * nv * (h // t) * x + 6 * single * b * nj * (h // t) * x, sq)
        add("all-gather", (layers if single else layers - 1) * b * nc * (h // t) * x, sq)
        if single:  # the [video ; text] concatenation and split on a token-split sequence (see the docstring)
            add("all-to-all", 2 * single * b * (nj + nv) * h * x, sq)
            add("all-gather", single * b * nc * h * x, sq)
            # a permute-start's result holds its operand and its result (hlo_collectives counts both); sent: one
            add("collective-permute", 2 * (4 * single - 1) * b * -(-nc // sq) * h * x, sq)
    # the dual blocks' context rows: split over the sequence axis too where single-stream blocks follow (compiled
    # HLO: [b, N_c / s, h] all-reduces and all-gathers on the tensor axis), whole otherwise
    nc_rows = -(-nc // sq) if single else nc
    ctx_attn = ctx_mlp = context_blocks * nc_rows
    # a single-stream block's one row-parallel matmul (proj_out over [attention ; MLP]): one all-reduce of [b, N_j, h];
    # tp_replicated_out's whole proj_out (and fsdp's gathered one) is sliced by XLA to the local columns as fc2 is
    single_rows = single * nj * b * h * x
    if t > 1 and single:  # every rule set: XLA re-shards a single block's [attention ; MLP] concatenation (its tensor
        # shards are not the feature chunks proj_out splits): all-to-alls of [b, N_j, (h + f_s) / t], twice in all
        add("all-to-all", single * 2 * b * nj * -(-(h + f_single) // t) * x, t)
    if t > 1 and rules == "tp":
        add("all-reduce", 2 * layers * b * nv * h * x + (ctx_attn + ctx_mlp) * b * h * x + single_rows, t)
    elif t > 1 and rules == "tp_replicated_out":
        add("all-gather", layers * b * nv * h * x + ctx_attn * b * h * x, t)
        add("all-reduce", layers * b * nv * h * x + ctx_mlp * b * h * x + single_rows, t)
    elif mixed:
        add("all-gather", layers * b * nv * h * x + ctx_attn * b * h * x, t)
        if single_rows:
            add("all-reduce", single_rows, t)
    if rules == "fsdp":  # every block matrix the rule set splits (both kinds of blocks), gathered whole; on a tensor
        # axis alone not those run on their shards: the dual blocks' Q/K/V (both streams), the single blocks' Q/K/V and
        # proj_mlp
        matrices = sum(math.prod(shape) for name, shape in shapes
                       if len(shape) == 2 and split_factor(specs[name], mesh) > 1 and name not in dead_names)
        if fsdp_qkv_on_shards(rules, mesh):
            matrices -= layers * dims["streams"] * 3 * h * h + single * (3 * h * h + h * f_single)
        add("all-gather", matrices * x, d_ * t * sq)

    # ---- FLOPs per device
    total = step_flops(preset, height, width, video_length, batch, attention=attention)
    parts = total["parts"]
    whole = rules in ("fsdp", "replicated") and not mixed
    split_all = 1 if whole else t  # the tensor split of the column/row matmuls the rules split
    split_out = 1 if whole or rules in ("tp_replicated_out", "fsdp") else t  # to_out's
    split_mlp = 1 if whole or mixed else t  # the dual blocks' MLP (fsdp on a tensor axis: whole)
    per_token = 2 * (3 * h * h / split_all + h * h / split_out + 2 * h * f / split_mlp)
    dead_tokens = 0 if joint or single else nc * (2 * ((h * f) / split_mlp + h * h / split_out)  # last block, context
                                                  + 2 * h * f / split_mlp)
    # single-stream blocks: to_q/k/v and proj_mlp column-parallel, proj_out ([attention ; MLP] -> h) row-parallel
    per_token_single = 2 * (3 * h * h + h * f_single + (h + f_single) * h) / split_all
    linear = b * (layers * (nv + nc_rows) * per_token - dead_tokens + single * nj * per_token_single)
    small = (parts["blocks_modulation"] + parts["refiner_linear"] + parts["embedders"] + parts["output"]) / d_
    flops = dict(attention=total["attention"] / (d_ * t * sq), linear=linear + small)
    flops["total"] = flops["attention"] + flops["linear"]
    return dict(collectives=coll, sent_bytes=sent, flops=flops, step=total, dead_bytes=dead_bytes,
                mlp_whole=split_mlp == 1)

"""Analytic performance and memory planner: FLOPs, bytes, per-chip bounds and MFU for a preset, size and mesh."""

from __future__ import annotations

import functools
import json
import math
import os
import re
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from .errors import HyvInputError
from .layout import context_tokens
from .presets import Preset, get_preset

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


GIB = 2**30

#: The accelerators the planner knows (TPU v4/v5e/v5p/v6e/v7x, GPUs), each with its peak bf16 FLOP/s, HBM and
#: bandwidth and the source of those numbers.
CHIPS: dict[str, Chip] = {
    "v4": Chip("TPU v4", 275e12, 32 * GIB, 1200e9, None, 1,
               "Google Cloud TPU docs, docs.cloud.google.com/tpu/docs/v4: 275 TFLOP/s bf16, 32 GiB HBM2, 1,200 GB/s "
               "per chip (no per-chip ICI figure there)."),
    "v5e": Chip("TPU v5e", 197e12, 16 * GIB, 819e9, 400e9, 1,
                "Google Cloud TPU docs, docs.cloud.google.com/tpu/docs/v5e: 197 TFLOP/s bf16, 16 GB HBM (16 GiB: "
                "17.2e9 bytes in JAX's pallas tpu_info), 819 GB/s, 400 GB/s bidirectional ICI per chip."),
    "v5p": Chip("TPU v5p", 459e12, 95 * GIB, 2765e9, 1200e9, 1,
                "Google Cloud TPU docs, docs.cloud.google.com/tpu/docs/v5p: 459 TFLOP/s bf16, 95 GiB usable HBM "
                "(96 physical), 2,765 GB/s, 1,200 GB/s bidirectional ICI per chip."),
    "v6e": Chip("TPU v6e (Trillium)", 918e12, 32 * GIB, 1638e9, 800e9, 1,
                "Google Cloud TPU docs, docs.cloud.google.com/tpu/docs/v6e: 918 TFLOP/s bf16, 32 GB HBM (32 GiB: "
                "34.4e9 bytes in JAX's pallas tpu_info), 1,638 GB/s, 800 GB/s bidirectional ICI per chip."),
    "v7x": Chip("TPU7x (Ironwood)", 2307e12, 192 * GIB, 7.37e12, None, 2,
                "Google Cloud TPU docs, docs.cloud.google.com/tpu/docs/tpu7x: 2,307 TFLOP/s bf16, 192 GiB HBM; "
                "bandwidth ~7.37 TB/s from Hot Chips reporting (7.3 TB/s) and gpu-tpu-pedia (7,380 GB/s) "
                "[secondary]. Caveat: JAX shows each of the 2 chiplets as its own device, so a 'v7x-8' slice in "
                "maxdiffusion/gpu-tpu-pedia is 4 chips = 8 devices; this planner counts physical chips."),
    "H100": Chip("NVIDIA H100 SXM", 989.4e12, 80e9, 3.35e12, 900e9, 1,
                 "NVIDIA H100 datasheet figures as quoted by glennklockwood.com/garden/processors/h100 "
                 "[secondary]: 989.4 TFLOP/s dense bf16 (1,978.9 with 2:4 sparsity), 80 GB HBM3, 3.35 TB/s; "
                 "NVLink 4: 900 GB/s bidirectional per GPU (18 links x 50 GB/s, NVIDIA)."),
    "H200": Chip("NVIDIA H200 SXM", 989e12, 141e9, 4.8e12, 900e9, 1,
                 "third-party spec pages (itkb.uw.cz, saulelectric) [secondary]: ~989 TFLOP/s dense bf16 (same "
                 "GH100 die as H100), 141 GB HBM3e, 4.8 TB/s; NVLink 4 900 GB/s (MLCommons inference v4.1 "
                 "H200-SXM-141GBx8 system description)."),
}

#: Published HunyuanVideo-1.5 step times (720p, 121 frames, 50 steps, CFG 6, one CFG step = batch 2).
#: All from the gpu-tpu-pedia project (single author, unverified; its hardware labels are partly inconsistent).
CITED_STEP_TIMES: list[dict[str, Any]] = [
    dict(preset="720p_t2v", chip="v6e", n_chips=8, seconds=8.12, label="plain Megatron TP, stock Splash",
         source="gpu-tpu-pedia tpu/HunyuanVideo-1.5/README.md (v6e-8) [U]"),
    dict(preset="720p_t2v", chip="v6e", n_chips=8, seconds=7.29, label="TP with fc2/proj replicated, stock Splash",
         source="gpu-tpu-pedia tpu/HunyuanVideo-1.5/README.md (v6e-8) [U]"),
    dict(preset="720p_t2v", chip="v6e", n_chips=8, seconds=5.81, label="custom exp2 Splash kernel",
         source="gpu-tpu-pedia tpu/HunyuanVideo-1.5/README.md (v6e-8) [U]"),
    dict(preset="720p_t2v", chip="H100", n_chips=8, seconds=5.10, label="FlashAttention-2 (its "
         "docs/deepcache_explained.md gives 5.2)", source="gpu-tpu-pedia tpu/HunyuanVideo-1.5/README.md (8xH100) [U]"),
]


def get_chip(chip: str | Chip) -> Chip:
    """A chip by key (``v5e``, ``v5p``, ``v6e``, ``v7x``, ``H100``, ``H200``) or a Chip passed through."""
    if isinstance(chip, Chip):
        return chip
    try:
        return CHIPS[chip]
    except KeyError:
        raise HyvInputError("chip", f"unknown chip {chip!r}; valid: {', '.join(CHIPS)}") from None


def _check_count(name: str, value: Any) -> None:
    """HyvInputError naming ``name`` unless ``value`` is a positive int (a string "8" or 8.0 is not)."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise HyvInputError(name, f"must be a positive integer, got {value!r}")


def _preset(preset: Preset | str) -> Preset:
    return get_preset(preset) if isinstance(preset, str) else preset


DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}


def dtype_bytes(dtype: str) -> int:
    try:
        return DTYPE_BYTES[dtype]
    except KeyError:
        raise HyvInputError("dtype", f"must be one of {', '.join(DTYPE_BYTES)}, got {dtype!r}") from None


# --------------------------------------------------------------------------------------------------- FLOPs
#: Constants of diffusers' HunyuanVideo-1.5 classes that are not config fields.
TIME_PROJ_DIM = 256  # Timesteps(num_channels=256) in the time embedding and the refiner's time_text_embed
BYT5_HIDDEN = 2048  # HunyuanVideo15ByT5TextProjection(text_embed_2_dim, 2048, inner_dim): fixed width
REFINER_MLP_RATIO = 4.0  # HunyuanVideo15TokenRefiner is built with its default mlp_ratio, not the model's


def _dims(preset: Preset) -> dict[str, int]:
    c = preset.transformer
    heads, head_dim = c["num_attention_heads"], c["attention_head_dim"]
    hidden = heads * head_dim
    return dict(heads=heads, head_dim=head_dim, hidden=hidden, mlp=int(hidden * c["mlp_ratio"]),
                refiner_mlp=int(hidden * REFINER_MLP_RATIO), layers=c["num_layers"],
                refiner_layers=c["num_refiner_layers"], patch=c["patch_size"], patch_t=c["patch_size_t"],
                in_channels=c["in_channels"], out_channels=c["out_channels"], text_dim=c["text_embed_dim"],
                byt5_dim=c["text_embed_2_dim"], image_dim=c["image_embed_dim"])


def token_counts(preset: Preset | str, height: int, width: int, video_length: int) -> dict[str, int]:
    """Tokens of one sample: video (after patching), context (image + ByT5 + text), joint = video + context."""
    preset = _preset(preset)
    d = _dims(preset)
    _, _, t, h, w = preset.latent_shape(height, width, video_length)
    video = (t // d["patch_t"]) * (h // d["patch"]) * (w // d["patch"])
    context = context_tokens(preset)
    return dict(video=video, context=context, joint=video + context, text=preset.text_len,
                byt5=preset.byt5_len, image=preset.image_tokens)


def _pad(n: int, block: int | None) -> int:
    """Key length a blockwise kernel computes: hyv_lib's XLA kernel cuts n keys into near-``block`` blocks."""
    if not block:
        return n
    from .xla_attention import kv_block_layout

    n_blocks, size = kv_block_layout(n, block)
    return n_blocks * size


def step_flops(preset: Preset | str, height: int, width: int, video_length: int, batch: int = 2, *,
               valid_context: int | None = None, kv_block: int | None = None) -> dict[str, Any]:
    """Analytic FLOPs of ONE transformer forward over a batch (CFG: batch 2 = one denoising step).

    Counts matmuls only, 2 FLOPs per multiply-add; elementwise work (norms, activations, softmax, RoPE,
    bias adds) is left out: about 1% at the real sizes (softmax costs ~5 ops per logit against
    4 D = 512 matmul FLOPs). Shapes come from ``preset.transformer``:
    hidden h = heads x head_dim, MLP width f = h x mlp_ratio, tokens from the latent shape.

    - ``attention``: QK^T and PV, 4 B H S S_k D per joint block (S = video + all 1985 context tokens),
      plus the token refiner's self-attention over the text tokens. By default every context token is
      counted, valid or padding: Splash with segment ids, hyv_lib's XLA kernel and a dense mask all
      compute the padded positions. ``valid_context=n`` counts only n context tokens (what varlen
      flash-attn skips to; the refiner always counts all text tokens). ``kv_block`` counts the key
      length a blockwise kernel computes, padding included (hyv_lib's XLA kernel, target 512).
    - ``linear``: 2 x tokens x weights per stream in the joint blocks (video tokens through the img
      weights to_q/k/v, to_out.0, ff; context tokens through add_*_proj, to_add_out, ff_context),
      the AdaLN modulation linears on the B timestep embeddings, the token refiner, the embedders
      (patch embed, time, ByT5, image) and the output head. The last block's context projections
      after attention are dead code (only video tokens reach the head): they are left out of the
      total, as XLA drops them, and reported as ``eager_extra`` (what eager torch spends on top).

    Returns ``attention``, ``linear``, ``total``, ``attention_share``, ``parts`` (summing to total),
    ``eager_extra`` and ``tokens``.
    """
    preset = _preset(preset)
    d = _dims(preset)
    tok = token_counts(preset, height, width, video_length)
    b, h, f, heads, hd = batch, d["hidden"], d["mlp"], d["heads"], d["head_dim"]
    nv, nc = tok["video"], tok["context"]
    if valid_context is not None and not 0 <= valid_context <= nc:
        raise HyvInputError("valid_context", f"must be between 0 and {nc}, got {valid_context}")
    s_attn = nv + (nc if valid_context is None else valid_context)
    per_token_block = 4 * h * h + 2 * h * f  # q, k, v, out + MLP in/out, per stream
    lt = preset.text_len
    per_token_refiner = 4 * h * h + 2 * h * d["refiner_mlp"]
    # The last block's context stream after attention (to_add_out, ff_context) feeds nothing: a compiler
    # drops it (XLA does), eager torch computes it. Reported as ``eager_extra``, not in the total.
    dead = 2 * b * nc * (h * h + 2 * h * f) if d["layers"] else 0
    parts = {
        "blocks_attention": d["layers"] * 4 * b * heads * s_attn * _pad(s_attn, kv_block) * hd,
        "blocks_linear": d["layers"] * 2 * b * (nv + nc) * per_token_block - dead,
        "blocks_modulation": d["layers"] * 2 * (2 * b * h * 6 * h),  # norm1 + norm1_context: h -> 6h on temb
        "refiner_attention": d["refiner_layers"] * 4 * b * heads * lt * _pad(lt, kv_block) * hd,
        "refiner_linear": (2 * b * lt * d["text_dim"] * h  # proj_in
                           + d["refiner_layers"] * (2 * b * lt * per_token_refiner + 2 * b * h * 2 * h)  # + AdaNorm
                           + 2 * b * (TIME_PROJ_DIM * h + h * h) + 2 * b * (d["text_dim"] * h + h * h)),
        "embedders": (2 * b * nv * d["in_channels"] * d["patch_t"] * d["patch"] ** 2 * h  # x_embedder (conv)
                      + 2 * b * (TIME_PROJ_DIM * h + h * h)  # time_embed
                      + 2 * b * preset.byt5_len * (d["byt5_dim"] * BYT5_HIDDEN + BYT5_HIDDEN ** 2 + BYT5_HIDDEN * h)
                      + 2 * b * preset.image_tokens * (d["image_dim"] ** 2 + d["image_dim"] * h)),
        "output": 2 * b * h * 2 * h + 2 * b * nv * h * d["out_channels"] * d["patch_t"] * d["patch"] ** 2,
    }
    attention = parts["blocks_attention"] + parts["refiner_attention"]
    total = sum(parts.values())
    return dict(attention=attention, linear=total - attention, total=total, attention_share=attention / total,
                parts=parts, eager_extra=dead, tokens=dict(tok, batch=batch, attended=s_attn))


def xla_flops(compiled) -> dict[str, Any]:
    """XLA's own counts for a compiled JAX program (``jax.jit(f).lower(...).compile()``).

    ``cost_analysis`` is XLA's HloCostAnalysis: dots as 2 MNK, every elementwise op and reduction as
    1 FLOP per element, exp/tanh/rsqrt under ``transcendentals``; it counts a while loop's body ONCE,
    whatever its trip count (jax 0.10.2), so a ``lax.scan`` over key blocks is undercounted.
    ``matmul`` re-counts only dots and convolutions from the optimised HLO text (2 x output elements x
    contracted size) with while bodies multiplied by their known trip count: the number to compare
    with :func:`step_flops`. ``unknown_trip_counts`` counts loops whose body was counted once.
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
        elif line.startswith("}"):
            current = None
        elif current is not None:
            computations[current].append(line)
    operand = r"(?:\w+\[[\d,]*\]\S* )?%([\w.\-]+)"
    unknown = 0

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
            conv = re.search(rf" convolution\({operand}, {operand}\).*dim_labels=\w+_(\w+)->", line)
            if conv and out is not None:
                rhs = shapes[conv.group(2)]
                groups = re.search(r"feature_group_count=(\d+)", line)
                own += 2 * math.prod(out) * math.prod(rhs) // rhs[conv.group(3).index("o")] // (
                    int(groups.group(1)) if groups else 1)
            trips = 1
            if re.search(r" while\(", line):
                known = re.search(r'"known_trip_count":\{"n":"(\d+)"\}', line)
                trips = int(known.group(1)) if known else 1
                unknown += 0 if known else 1
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


def mfu(flops: float, seconds: float, chip: str | Chip, n_chips: int) -> float:
    """Model FLOP utilisation: ``flops / (seconds x n_chips x peak bf16 FLOP/s)``."""
    _check_count("n_chips", n_chips)
    if not isinstance(seconds, (int, float)) or isinstance(seconds, bool) or not seconds > 0:
        raise HyvInputError("seconds", f"must be a positive number, got {seconds!r}")
    return flops / (seconds * n_chips * get_chip(chip).peak_bf16_flops)


# ----------------------------------------------------------------------------------- parameters and rules
def rule_set_names() -> tuple[str, ...]:
    """``replicated`` (no rule) plus the rule sets the TPU runtime places weights with
    (:data:`hyv_lib.sharding.RULE_SETS`: ``tp``, ``tp_replicated_out``, ``fsdp``)."""
    from .sharding import RULE_SETS

    return ("replicated", *RULE_SETS)


@functools.lru_cache(maxsize=8)
def _meta_params(config_json: str) -> tuple[tuple[str, tuple[int, ...]], ...]:
    import torch
    from diffusers import HunyuanVideo15Transformer3DModel

    with torch.device("meta"):
        model = HunyuanVideo15Transformer3DModel(**json.loads(config_json))
    return tuple((name, tuple(p.shape)) for name, p in model.named_parameters())


def parameter_shapes(preset: Preset | str) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """(name, shape) of every parameter of the preset's transformer, from a meta-device instance (no memory)."""
    return _meta_params(json.dumps(_preset(preset).transformer, sort_keys=True))


MESH_AXES = ("data", "tensor", "sequence")  # hyv_lib.sharding.AXES


class _MeshShape:
    """Stands in for a jax Mesh where only ``.shape`` is read (hyv_lib.sharding.plan): no devices needed."""

    def __init__(self, shape: dict[str, int]):
        self.shape = {axis: shape.get(axis, 1) for axis in MESH_AXES}


def _mesh(mesh_shape: int | str | Mapping[str, int] | None, axis: str = "tensor") -> dict[str, int]:
    """int n -> n devices on ``axis``; a dict of data/tensor/sequence sizes, or the string form the CLI and
    ``make_step`` take ('data=2,tensor=4'); None -> one device."""
    if mesh_shape is None:
        mesh_shape = 1
    if isinstance(mesh_shape, str):
        from .pipeline import parse_mesh

        try:
            mesh_shape = parse_mesh(mesh_shape) or 1
        except HyvInputError as err:  # it names the CLI's --mesh
            raise HyvInputError("mesh_shape", err.message) from None
    mesh = {axis: mesh_shape} if isinstance(mesh_shape, int) else dict(mesh_shape)
    if any(k not in MESH_AXES or not isinstance(v, int) or v < 1 for k, v in mesh.items()):
        raise HyvInputError("mesh_shape", f"an int or a dict of {', '.join(MESH_AXES)} with positive integer "
                                          f"sizes; got {mesh_shape!r}")
    return {a: mesh.get(a, 1) for a in MESH_AXES}


def _plan_specs(preset: Preset, rules: str, mesh: dict[str, int]) -> tuple[dict[str, tuple], list[dict]]:
    from .sharding import RULE_SETS, plan

    return plan(dict(parameter_shapes(preset)), [] if rules == "replicated" else RULE_SETS[rules], _MeshShape(mesh))


def _split(spec: tuple, mesh: dict[str, int]) -> int:
    """How many ways a PartitionSpec splits a tensor on ``mesh``."""
    n = 1
    for axes in spec:
        for axis in (axes if isinstance(axes, tuple) else (axes,) if axes else ()):
            n *= mesh[axis]
    return n


def param_bytes(preset: Preset | str, dtype: str = "bf16", rules: str | Sequence[Any] | None = None,
                mesh_shape: int | Mapping[str, int] | None = None) -> dict[str, Any]:
    """Per-device weight bytes of the transformer under a sharding rule set.

    ``rules``: ``replicated`` (the default: every weight whole on every device) or a rule set of
    :mod:`hyv_lib.sharding`, exactly as the TPU runtime places them: ``tp`` (Megatron on the joint
    blocks: to_q/k/v, add_*_proj, ff(.context).net.0.proj split by output features = column-parallel;
    to_out.0, to_add_out, ff(.context).net.2 split by input features = row-parallel; the rest, including
    the AdaLN modulation linears and the token refiner, replicated), ``tp_replicated_out`` (the
    row-parallel ones replicated instead), ``fsdp`` (every joint-block weight split along its first
    dimension over all devices), or a list of :class:`hyv_lib.sharding.Rule`. ``mesh_shape``: an int
    (that many devices on the ``tensor`` axis) or a dict of ``data``/``tensor``/``sequence`` sizes.
    Parameter names and shapes come from a meta-device instance of the diffusers class. A rule that
    matches no parameter, or a split that does not divide its dimension, raises ValueError.
    Returns ``bytes_per_device`` and one row per rule: tensors, params, bytes per device.
    """
    from .sharding import RULE_SETS, plan

    preset = _preset(preset)
    bpe = dtype_bytes(dtype)
    if rules is None:
        rules = "replicated"
    if isinstance(rules, str) and rules not in rule_set_names():
        raise HyvInputError("rules", f"unknown rule set {rules!r}; valid: {', '.join(rule_set_names())}")
    name = rules if isinstance(rules, str) else "custom"
    rule_list = [] if rules == "replicated" else RULE_SETS[rules] if isinstance(rules, str) else list(rules)
    mesh = _mesh(mesh_shape)
    _, report = plan(dict(parameter_shapes(preset)), rule_list, _MeshShape(mesh))
    rows = [dict(rule=r["rule"], tensors=r["tensors"], params=r["params"], bytes_per_device=r["per_device"] * bpe)
            for r in report]
    total = sum(r["params"] for r in rows)
    return dict(rules=name, dtype=dtype, mesh=mesh, n_devices=math.prod(mesh.values()), rows=rows, params=total,
                bytes_per_device=sum(r["bytes_per_device"] for r in rows), replicated_bytes=total * bpe)


# ------------------------------------------------------------------------------------------- activations
def activation_bytes(preset: Preset | str, height: int, width: int, video_length: int, batch: int = 2, *,
                     dtype: str = "bf16", mesh_shape: int | Mapping[str, int] | None = None,
                     attention: str = "flash") -> dict[str, Any]:
    """Estimated per-device activation working set of ONE joint block (weights excluded).

    ``mesh_shape``: an int (devices on ``tensor``) or a dict of ``data``/``tensor``/``sequence`` sizes.
    With b = ceil(B / data) local samples, s = ceil(S / sequence) local tokens (S = joint sequence, all
    context tokens), t = tensor, heads split over tensor x sequence (h_loc = ceil(H / (t sequence))),
    x = dtype bytes:

    - hidden: 2 b s h x  (the residual stream and its normalised copy)
    - qkv: 3 b s (h / t) x  (after a Ulysses all_to_all each is b S h_loc D x, the same size)
    - attn_out: b s (h / t) x
    - mlp: b s (f / t) x  (the MLP intermediate)
    - attention working set, ``flash`` (Splash / FlashAttention): a fp32 output accumulator plus running
      max and sum per query, b h_loc S (D + 2) 4 bytes, i.e. O(S D) per head (tiles are O(1));
      ``dense``: fp32 logits b h_loc S^2 4 plus diffusers' boolean [B, 1, S, S] mask b S^2 (a lower
      estimate: softmax usually keeps another S^2 copy).
    """
    preset = _preset(preset)
    if attention not in ("flash", "dense"):
        raise HyvInputError("attention", f"must be 'flash' or 'dense', got {attention!r}")
    x = dtype_bytes(dtype)
    mesh = _mesh(mesh_shape)
    t, sp = mesh["tensor"], mesh["sequence"]
    d = _dims(preset)
    s_full = token_counts(preset, height, width, video_length)["joint"]
    b, s = -(-batch // mesh["data"]), -(-s_full // sp)
    h, f, hd = d["hidden"], d["mlp"], d["head_dim"]
    h_loc = -(-d["heads"] // (t * sp))
    parts = {
        "hidden": 2 * b * s * h * x,
        "qkv": 3 * b * s * -(-h // t) * x,
        "attn_out": b * s * -(-h // t) * x,
        "mlp": b * s * -(-f // t) * x,
    }
    if attention == "flash":
        parts["attention"] = b * h_loc * s_full * (hd + 2) * 4
    else:
        parts["attention"] = b * h_loc * s_full * s_full * 4 + b * s_full * s_full
    return dict(parts=parts, bytes_per_device=sum(parts.values()), attention=attention, mesh=mesh,
                tokens_per_device=s, samples_per_device=b)


# ------------------------------------------------------------------------------------------- collectives
#: Strategy -> the mesh axis an int ``mesh_shape`` goes on.
STRATEGIES = {"tp": "tensor", "ulysses": "sequence", "fsdp": "tensor", "dp": "data"}


def collective_bytes(preset: Preset | str, height: int, width: int, video_length: int, batch: int = 2, *,
                     dtype: str = "bf16", strategy: str = "tp",
                     mesh_shape: int | Mapping[str, int] | None = None) -> dict[str, Any]:
    """Bytes each device sends over the interconnect in one forward (one CFG step), by strategy.

    ``mesh_shape``: an int (that many devices on the strategy's axis: tensor for tp and fsdp, sequence
    for ulysses, data for dp) or a dict of data/tensor/sequence sizes. n = that axis' size,
    b = ceil(B / data), x = dtype bytes, N_v / N_c = video / context tokens, S = N_v + N_c, h = hidden.

    - ``tp`` (Megatron, the ``tp`` rule set): each row-parallel output (to_out.0 / to_add_out and
      ff.net.2, per stream) is all-reduced; a ring all-reduce of m bytes sends 2 (n-1)/n m per device.
      Per joint block: 2 x 2 (n-1)/n b S h x. (With ``tp_replicated_out`` XLA chooses other
      collectives; this is the plain-TP count.)
    - ``ulysses`` (sequence parallel; XLA's resharding around head-sharded attention on a mesh with a
      sequence axis is the same pattern): per joint block, all_to_all of q, k, v (sequence -> heads)
      and of the output (heads -> sequence); a device holds m = b S h x / n of each and sends
      (n-1)/n m: 4 (n-1)/n b S h x / n per block; plus a final all-gather of the output latents.
    - ``fsdp``: every weight the ``fsdp`` rule set splits is all-gathered once per forward:
      (n-1)/n of those weight bytes (n = all devices).
    - ``dp`` (CFG-parallel, a whole sample per device): only the final gather of the noise prediction.
    """
    preset = _preset(preset)
    if strategy not in STRATEGIES:
        raise HyvInputError("strategy", f"must be one of {', '.join(STRATEGIES)}, got {strategy!r}")
    x = dtype_bytes(dtype)
    d = _dims(preset)
    tok = token_counts(preset, height, width, video_length)
    mesh = _mesh(mesh_shape, STRATEGIES[strategy])
    b = -(-batch // mesh["data"])
    h = d["hidden"]
    output = b * tok["video"] * d["out_channels"] * x  # the noise prediction of the local samples
    if strategy == "tp":
        n = mesh["tensor"]
        per_block = 2 * (2 * (n - 1) / n) * b * tok["joint"] * h * x
        total = d["layers"] * per_block
        ops = dict(per_block=per_block, blocks=total)
    elif strategy == "ulysses":
        n = mesh["sequence"]
        per_block = 4 * (n - 1) / n * b * tok["joint"] * h * x / n
        gather = (n - 1) / n * output
        total = d["layers"] * per_block + gather
        ops = dict(per_block=per_block, blocks=d["layers"] * per_block, output_gather=gather)
    elif strategy == "fsdp":
        n = math.prod(mesh.values())
        split = param_bytes(preset, dtype, "fsdp", mesh)["rows"]
        total = (n - 1) / n * sum(r["params"] for r in split if r["rule"].startswith("fsdp")) * x
        ops = dict(weight_all_gather=total)
    else:
        n = mesh["data"]
        total = (n - 1) * output  # all-gather: each device sends its b samples to the n - 1 others
        ops = dict(output_gather=total)
    return dict(strategy=strategy, n=n, bytes_per_device=total, ops=ops, mesh=mesh)


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
COMPILED_RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "compiled", "tpu_compile.json")
#: The TPU slice (libtpu topology) of n chips that the saved results use, per chip.
SLICES = {("v5e", 8): "v5e:2x4", ("v5p", 4): "v5p:2x2x1", ("v6e", 8): "v6e:2x4", ("v7x", 4): "tpu7x:2x2x1"}


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
    name = _preset(preset).name
    mesh = _mesh(mesh_shape)
    for r in _compiled_results(COMPILED_RESULTS):
        if (r["preset"] == name and r["topology"] == topology and r["sharding"] == rules and r["mesh"] == mesh
                and r["size"] == dict(height=height, width=width, video_length=video_length)
                and ("programs" in r) == enable_cache):
            return r
    return None


def device_plan(preset: Preset | str, height: int, width: int, video_length: int,
                mesh_shape: int | str | Mapping[str, int] | None = None, rules: str = "tp_replicated_out", *,
                batch: int = 2, dtype: str = "bf16", enable_cache: bool = False,
                topology: str | None = None) -> dict[str, Any]:
    """What one device holds, computes and exchanges in one CFG step of :class:`hyv_lib.tpu.TpuTransformer` on a
    mesh: the planner's side of ``python -m hyv_lib compile`` (which asks the TPU compiler instead).

    ``mesh_shape``: data/tensor/sequence sizes (an int n = ``tensor=n``; or 'data=2,tensor=4'), data dividing
    ``batch``; ``rules``: ``tp``, ``tp_replicated_out``, ``fsdp`` or ``replicated``. With b = B / data samples, N_v
    video and N_c context tokens, L blocks, hidden h, MLP width f, t = tensor, s = sequence, x = dtype bytes, it
    models what the compiled HLO does (checked against the TPU compiler in tests/test_perf.py and chapter 3):

    - ``collectives`` (bytes of the collectives' results per device, as :func:`hlo_collectives` counts them):
      ``tp`` all-reduces each row-parallel output, 2 per block and stream, [b, N_v/s, h] and [b, N_c, h] (the last
      block's context stream is dead code); ``tp_replicated_out`` all-gathers the attention output instead (the
      replicated to_out then runs whole on every device) and still all-reduces the MLP output (XLA slices the
      replicated fc2 to the local columns); a sequence axis adds 4 all-to-alls per block, [b, N_v/s, h/t] each
      (q, k, v to head shards and the output back: Ulysses inside the mesh) and gathers the context stream's
      attention output over it; ``fsdp`` all-gathers every block matrix whole. Token-refiner attention outputs are
      gathered too. ``sent_bytes`` converts them to bytes on the wire (a ring all-reduce of m bytes over n devices
      sends 2 (n-1)/n m, an all-gather or all-to-all (n-1)/n m).
    - ``flops``: attention over data x tensor x sequence (heads over tensor x sequence); block matmuls over data,
      the sequence for video tokens, and tensor only for the weights the rules split (``tp_replicated_out``'s
      to_out runs whole; ``fsdp`` and ``replicated`` run every matmul whole, so their compute splits only over
      data and sequence).
    - ``per_device_bytes``: weights under the rules (exact, :func:`param_bytes`), the step's inputs (latents,
      text, masks, RoPE tables), outputs (the noise prediction; with ``enable_cache`` the cached tokens too) and
      temporaries (see :data:`TEMPORARY_STREAM_COPIES`, :data:`FSDP_GATHERED_BLOCKS`; partly fitted). Weights the
      step never reads (the last block's context stream after attention) are left out, as ``jax.jit`` drops them.
      The compiler's generated code is not
      modelled: 0.04 GiB for ``tp_replicated_out`` at 720p on v6e-8, but about 0.8 GiB for ``tp`` and ``fsdp``.

    ``topology`` (e.g. ``v6e:2x4``): when :data:`COMPILED_RESULTS` holds the compiler's report for this exact
    configuration, ``compiled`` is that report and ``memory_total`` its per-device total (the compiler's word beats
    the model: the planner misses FSDP's generated code, for one); otherwise ``memory_total`` is the planner's.
    """
    preset = _preset(preset)
    mesh = _mesh(mesh_shape)
    d_, t, sq = mesh["data"], mesh["tensor"], mesh["sequence"]
    x = dtype_bytes(dtype)
    dims = _dims(preset)
    h, f, layers, heads, hd = dims["hidden"], dims["mlp"], dims["layers"], dims["heads"], dims["head_dim"]
    if heads % (t * sq):
        raise HyvInputError("mesh_shape", f"{heads} heads cannot be split over tensor x sequence = {t} x {sq}")
    if rules not in rule_set_names():
        raise HyvInputError("rules", f"unknown rule set {rules!r}; valid: {', '.join(rule_set_names())}")
    _check_count("batch", batch)
    if batch % d_:  # the tpu runtime and the compiler refuse it too: a data axis splits whole samples
        raise HyvInputError("mesh_shape", f"data={d_} does not divide the batch of {batch}")
    tok = token_counts(preset, height, width, video_length)
    b = batch // d_
    nv, nc, lt = -(-tok["video"] // sq), tok["context"], preset.text_len
    refiner = dims["refiner_layers"]

    # ---- collectives (HLO result bytes per device) and their group sizes
    coll = {"all-reduce": 0.0, "all-gather": 0.0, "all-to-all": 0.0}
    sent = 0.0

    def add(kind, nbytes, group):
        nonlocal sent
        coll[kind] += nbytes
        if group > 1:
            sent += nbytes * (2 if kind == "all-reduce" else 1) * (group - 1) / group

    weights = param_bytes(preset, dtype, rules, mesh)
    # jax.jit drops arguments the program never reads: the last block's context-stream weights after attention
    last = f"transformer_blocks.{layers - 1}."
    dead_names = {name for name, _ in parameter_shapes(preset)
                  if name.startswith(last) and re.search(r"to_add_out|ff_context", name)}
    specs, _ = _plan_specs(preset, rules, mesh)
    dead_bytes = sum(math.prod(shape) // _split(specs[name], mesh) for name, shape in parameter_shapes(preset)
                     if name in dead_names) * x
    if t * sq > 1:
        add("all-gather", refiner * b * lt * h * x, t * sq)
    if sq > 1:
        add("all-to-all", 4 * layers * b * nv * (h // t) * x, sq)
        add("all-gather", (layers - 1) * b * nc * (h // t) * x, sq)
    if t > 1 and rules == "tp":
        add("all-reduce", 2 * layers * b * nv * h * x + 2 * (layers - 1) * b * nc * h * x, t)
    elif t > 1 and rules == "tp_replicated_out":
        add("all-gather", layers * b * nv * h * x + (layers - 1) * b * nc * h * x, t)
        add("all-reduce", layers * b * nv * h * x + (layers - 1) * b * nc * h * x, t)
    if rules == "fsdp":
        matrices = sum(math.prod(shape) for name, shape in parameter_shapes(preset)
                       if name.startswith("transformer_blocks.") and len(shape) == 2)
        dead = sum(math.prod(shape) for name, shape in parameter_shapes(preset)
                   if name in dead_names and len(shape) == 2)
        add("all-gather", (matrices - dead) * x, d_ * t * sq)

    # ---- FLOPs per device
    total = step_flops(preset, height, width, video_length, batch)
    parts = total["parts"]
    whole = rules in ("fsdp", "replicated")
    split_all = 1 if whole else t  # the tensor split of the column/row matmuls the rules split
    split_out = 1 if whole or rules == "tp_replicated_out" else t  # to_out's
    per_token = 2 * ((3 * h * h + 2 * h * f) / split_all + h * h / split_out)
    dead_tokens = nc * (2 * ((h * f) / split_all + h * h / split_out) + 2 * h * f / split_all)  # last block, context
    linear = b * (layers * (nv + nc) * per_token - dead_tokens)
    small = (parts["blocks_modulation"] + parts["refiner_linear"] + parts["embedders"] + parts["output"]) / d_
    flops = dict(attention=total["attention"] / (d_ * t * sq), linear=linear + small)
    flops["total"] = flops["attention"] + flops["linear"]

    # ---- memory per device
    _, c, frames, lh, lw = preset.latent_shape(height, width, video_length)
    inputs = (b * ((2 * c + 1) * frames * lh * lw * x + lt * dims["text_dim"] * x + lt * 8
                   + preset.byt5_len * (dims["byt5_dim"] * x + 8) + preset.image_tokens * dims["image_dim"] * x
                   + nc * 9 + x) + 2 * tok["video"] * hd * 4)  # masks and gather order as int64, RoPE cos/sin f32
    outputs = b * dims["out_channels"] * tok["video"] * x + (b * (nv + nc) * h * x if enable_cache else 0)
    padded = -(-tok["joint"] // 2048) * 2048  # Splash pads the joint sequence to its key block
    temporaries = (2 * b * tok["video"] * h * x + 4 * b * (heads // (t * sq)) * padded * hd * x
                   + TEMPORARY_STREAM_COPIES * b * nv * h * x)
    if rules == "fsdp":
        block = sum(math.prod(shape) for name, shape in parameter_shapes(preset)
                    if name.startswith("transformer_blocks.0."))
        temporaries += FSDP_GATHERED_BLOCKS * block * x
    memory = dict(weights=weights["bytes_per_device"] - dead_bytes, inputs=inputs, temporaries=temporaries,
                  outputs=outputs)
    memory["total"] = sum(memory.values())
    compiled = (compiled_report(preset, height, width, video_length, topology, mesh, rules, enable_cache)
                if topology else None)
    return dict(mesh=mesh, rules=rules, per_device_bytes=memory, collectives=coll, collective_total=sum(coll.values()),
                sent_bytes=sent, flops=flops, tokens=tok, samples_per_device=b, compiled=compiled,
                memory_total=compiled["per_device_bytes"]["total"] if compiled else memory["total"],
                memory_source="TPU compiler" if compiled else "planner")


# ---------------------------------------------------------------------------------------------- bounds
#: Rule sets that :func:`bounds` plans as TPU runtime layouts (:func:`device_plan`).
RULE_SET_LAYOUTS = ("tp", "tp_replicated_out", "fsdp")


def default_layout(devices: int, heads: int, rules: str = "tp_replicated_out", batch: int = 2) -> dict[str, int]:
    """The mesh ``python -m hyv_lib compile`` uses when none is given: data = the CFG batch when it divides the
    devices, the rest on tensor (on sequence for ``fsdp``, whose gathered weights leave a tensor axis nothing to
    split but the heads); that axis must divide the heads."""
    data = batch if devices % batch == 0 and heads % (devices // batch) == 0 else 1
    rest = "sequence" if rules == "fsdp" else "tensor"
    return {"data": data, "tensor": 1, "sequence": 1, rest: devices // data}


def bounds(preset: Preset | str, height: int, width: int, video_length: int, chip: str | Chip, n_chips: int,
           rules: str = "tp_replicated_out", *, mesh_shape: str | Mapping[str, int] | None = None, batch: int = 2,
           dtype: str = "bf16", strategy: str | None = None, attention: str = "flash") -> dict[str, Any]:
    """Lower bounds on the time of one CFG step on ``n_chips`` chips, and whether it fits in HBM.

    TPU layouts (``rules`` a rule set of :mod:`hyv_lib.sharding`) come from :func:`device_plan` on ``mesh_shape``
    (default :func:`default_layout` over the chips' devices): per-device FLOPs, memory and collectives as the
    compiled step has them. ``rules="replicated"`` is the GPU layout (whole weights per device, ``strategy``
    ``ulysses`` by default: :func:`collective_bytes`, :func:`activation_bytes`).

    - compute: FLOPs per device / the device's peak bf16 FLOP/s
    - hbm: per-device bytes that must cross HBM at least once / bandwidth = its weights + per block the attention
      kernel's q, k, v reads and output write
    - interconnect: bytes each device sends / its share of half the chip's published bidirectional ICI or NVLink
      bandwidth; None when the chip has no sourced figure.

    ``step_s`` is the largest known bound, ``limit`` which one it is.
    """
    preset = _preset(preset)
    spec = get_chip(chip)
    _check_count("n_chips", n_chips)
    x = dtype_bytes(dtype)
    devices = n_chips * spec.devices_per_chip
    flops = step_flops(preset, height, width, video_length, batch)
    d = _dims(preset)
    attention_io = d["layers"] * 4 * batch * flops["tokens"]["joint"] * d["hidden"] * x / devices
    rule_name = rules if isinstance(rules, str) else "custom"
    if rule_name in RULE_SET_LAYOUTS:
        mesh = _mesh(mesh_shape) if mesh_shape else default_layout(devices, d["heads"], rule_name, batch)
        if math.prod(mesh.values()) != devices:
            raise HyvInputError("mesh_shape", f"{mesh} is not {devices} devices ({n_chips} x {spec.name})")
        try:
            plan = device_plan(preset, height, width, video_length, mesh, rule_name, batch=batch, dtype=dtype,
                               topology=SLICES.get((chip, n_chips)) if isinstance(chip, str) else None)
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
        activations = activation_bytes(preset, height, width, video_length, batch, dtype=dtype, attention=attention,
                                       mesh_shape=mesh)["bytes_per_device"]
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
                collective_bytes=sent, strategy=strategy, rules=rule_name, mesh=mesh, memory_source=memory_source,
                fits=weights + activations <= hbm, hbm_bytes=hbm, chip=spec.name, n_chips=n_chips,
                notes=None if spec.interconnect_bandwidth else NO_INTERCONNECT_SOURCE)


def plan_table(presets: Sequence[str] = ("480p_t2v", "720p_t2v"), chips: Sequence[str] = tuple(CHIPS),
               n_chips: int = 8, video_length: int = 121, rules: str = "tp_replicated_out", batch: int = 2,
               dtype: str = "bf16") -> list[dict[str, Any]]:
    """Rows for the book: per preset (16:9 default size) and chip, FLOPs, memory per device, bounds and the
    cited step time with its implied MFU where one exists (:data:`CITED_STEP_TIMES`). TPUs use ``rules`` on
    :func:`default_layout`; GPUs (H100, H200) the Ulysses layout (whole weights on every GPU)."""
    rows = []
    for name in presets:
        preset = get_preset(name)
        height, width = preset.default_height, preset.default_width
        flops = step_flops(preset, height, width, video_length, batch)
        for chip in chips:
            layout = "replicated" if get_chip(chip).name.startswith("NVIDIA") else rules
            b = bounds(preset, height, width, video_length, chip, n_chips, layout, batch=batch, dtype=dtype)
            cited = [c for c in CITED_STEP_TIMES
                     if c["preset"] == name and c["chip"] == chip and c["n_chips"] == n_chips]
            best = min(cited, key=lambda c: c["seconds"]) if cited else None
            rows.append(dict(
                preset=name, height=height, width=width, frames=video_length, chip=chip, n_chips=n_chips,
                rules=layout, mesh=b["mesh"], pflop_per_step=flops["total"] / 1e15,
                attention_share=flops["attention_share"], weights_gb_per_device=b["weights_bytes"] / 1e9,
                activations_gb_per_device=b["activation_bytes"] / 1e9, hbm_gb_per_device=b["hbm_bytes"] / 1e9,
                memory_source=b["memory_source"], fits=b["fits"], compute_s=b["compute_s"], hbm_s=b["hbm_s"],
                interconnect_s=b["interconnect_s"],
                bound_s=b["step_s"], limit=b["limit"], cited_s=best["seconds"] if best else None,
                cited_mfu=mfu(flops["total"], best["seconds"], chip, n_chips) if best else None,
                cited_source=f"{best['label']}; {best['source']}" if best else None,
            ))
    return rows


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

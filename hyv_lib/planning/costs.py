"""What one DiT step costs, counted from the preset: FLOPs, parameter, activation and collective bytes per layout."""

from __future__ import annotations

import functools
import json
import math
from typing import Any, Mapping, Sequence

from ..base.errors import HyvInputError
from ..base.presets import Preset
from ..kernels.ssta import SstaConfig
from ..kernels.xla import kv_block_layout
from ..models.adapter import ModelAdapter
from ..models.families import get_preset
from ..models.registry import ADAPTERS, get_adapter
from ..parallel import sharding
from ..parallel.mesh import parse_mesh
from ..parallel.sharding import plan
from .sparse import ssta_density, ssta_kernel_cost


def as_preset(preset: Preset | str) -> Preset:
    return get_preset(preset) if isinstance(preset, str) else preset


def step_batch(preset: Preset, batch: int | None) -> int:
    """The batch of one denoising step: ``batch`` when given, else the preset's own
    (:attr:`hyv_lib.base.presets.Preset.samples_per_step`: the CFG pair, or 1 sample for the CFG-distilled and
    step-distilled presets, whose guidance is 1)."""
    if batch is None:
        return preset.samples_per_step
    if not isinstance(batch, int) or isinstance(batch, bool) or batch < 1:
        raise HyvInputError("batch", f"must be a positive integer, got {batch!r}")
    return batch


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


def model_dims(preset: Preset) -> dict[str, int]:
    """The sizes the cost formulas read from a preset's transformer config, as its model adapter gives them
    (:meth:`hyv_lib.models.adapter.ModelAdapter.cost_dims`): ``streams`` is 2 where the context tokens have their own
    weights and 1 where text and video share them; a model without a token refiner, ByT5 or image input has 0 there.
    HyvInputError for a model whose adapter has no cost model."""
    dims = get_adapter(preset.model).cost_dims(preset.transformer)
    if dims is None:
        counted = ", ".join(name for name, adapter in ADAPTERS.items()
                            if type(adapter).cost_dims is not ModelAdapter.cost_dims)
        raise HyvInputError("preset", f"{preset.name} runs {preset.model!r}: the analytic cost model covers "
                                      f"{counted}; compile it for the TPU compiler's numbers")
    return dims


def token_counts(preset: Preset | str, height: int, width: int, video_length: int) -> dict[str, int]:
    """Tokens of one sample: video (after patching the latents the denoising loop runs on,
    :meth:`hyv_lib.base.presets.Preset.denoising_shape`: CogVideoX1.5 pads 21 latent frames to 22), context (image +
    ByT5 + text; CogVideoX: its 226 T5 tokens), joint = video + context."""
    preset = as_preset(preset)
    d = model_dims(preset)
    shape = preset.denoising_shape(height, width, video_length)
    t, h, w = get_adapter(preset.model).token_grid(shape)
    video = -(-t // d["patch_t"]) * (h // d["patch"]) * (w // d["patch"])
    context = get_adapter(preset.model).context_tokens(preset)
    return dict(video=video, context=context, joint=video + context, text=preset.text_len,
                byt5=preset.byt5_len, image=preset.image_tokens)


def _pad(n: int, block: int | None) -> int:
    """Key length a blockwise kernel computes: hyv_lib's XLA kernel cuts n keys into near-``block`` blocks."""
    if not block:
        return n

    n_blocks, size = kv_block_layout(n, block)
    return n_blocks * size


def step_flops(preset: Preset | str, height: int, width: int, video_length: int, batch: int | None = None, *,
               valid_context: int | None = None, kv_block: int | None = None,
               attention: str | SstaConfig | None = None) -> dict[str, Any]:
    """Analytic FLOPs of ONE transformer forward over a batch: one denoising step at the preset's own batch by
    default (:func:`step_batch`: the CFG pair, 2, or one sample for a preset with guidance 1, the distilled ones).

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
      ``attention``: ``dense`` (or ``flash``), ``ssta``, a :class:`hyv_lib.SstaConfig`, or None / ``auto``: the
      preset's own (:data:`hyv_lib.planning.sparse.ATTENTIONS`; SSTA for the ``*_sparse`` presets). With SSTA each
      joint block that runs it counts the dense FLOPs over the tiled sequence (video and context each padded to
      whole 384-token tiles: the kernel computes the padding) times the tile density's upper bound,
      :func:`hyv_lib.planning.sparse.ssta_density` (``valid_context`` also sets its valid text tiles); the token
      refiner and ``dense_every``'s blocks stay dense. ``ssta`` in the result is that density (None when dense).
    - ``linear``: 2 x tokens x weights per stream in the joint blocks (video tokens through the img
      weights to_q/k/v, to_out.0, ff; context tokens through add_*_proj, to_add_out, ff_context),
      the AdaLN modulation linears on the B timestep embeddings, the token refiner, the embedders
      (patch embed, time, ByT5, image, pooled text, embedded guidance) and the output head. The last block's
      context projections after attention are dead code (only video tokens reach the head): they are left out of
      the total, as XLA drops them, and reported as ``eager_extra`` (what eager torch spends on top).
    - single-stream blocks (``single_layers`` of :meth:`hyv_lib.models.adapter.ModelAdapter.cost_dims`, after the
      dual-stream ones: HunyuanVideo's 40): each runs [video ; context] through one set of weights, to_q/k/v (3 h
      h), proj_mlp (h f_s) and proj_out over [attention ; MLP] ((h + f_s) h): 4 h h + 2 h f_s per token, the same
      as a dual block's per stream when f_s = f; their attention is counted as a dual block's, their AdaLN linear is
      h -> 3 h. They are in ``blocks_attention``, ``blocks_linear`` and ``blocks_modulation``. Nothing is dead code
      then: the dual blocks' context stream feeds the single blocks, and the last single block's context rows go
      through the same matmuls as its video rows (concatenated), which a compiler keeps.
      (tests/test_hunyuan_video_costs.py holds both counts to torch's FlopCounterMode over diffusers' forward, tiny
      and at the real size: equal.)

    Returns ``attention``, ``linear``, ``total``, ``attention_share``, ``parts`` (summing to total),
    ``eager_extra``, ``tokens`` and ``ssta``.
    """
    preset = as_preset(preset)
    batch = step_batch(preset, batch)
    d = model_dims(preset)
    tok = token_counts(preset, height, width, video_length)
    b, h, f, heads, hd = batch, d["hidden"], d["mlp"], d["heads"], d["head_dim"]
    nv, nc = tok["video"], tok["context"]
    if valid_context is not None and not 0 <= valid_context <= nc:
        raise HyvInputError("valid_context", f"must be between 0 and {nc}, got {valid_context}")
    sparse = ssta_density(preset, height, width, video_length, attention, valid_context)
    s_attn = nv + (nc if valid_context is None else valid_context)
    per_token_block = 4 * h * h + 2 * h * f  # q, k, v, out + MLP in/out, per stream
    if d["streams"] == 1:  # one joint stream: text and video tokens through the same weights
        parts = _joint_stream_parts(preset, d, b, nv, nc, s_attn, kv_block)
        attention = parts["blocks_attention"]
        total = sum(parts.values())
        return dict(attention=attention, linear=total - attention, total=total, attention_share=attention / total,
                    parts=parts, eager_extra=0, tokens=dict(tok, batch=batch, attended=s_attn), ssta=None)
    lt = preset.text_len
    per_token_refiner = 4 * h * h + 2 * h * d["refiner_mlp"]
    single, f_single = d.get("single_layers", 0), d.get("single_mlp", 0)
    # The last block's context stream after attention (to_add_out, ff_context) feeds nothing: a compiler
    # drops it (XLA does), eager torch computes it. Reported as ``eager_extra``, not in the total. With
    # single-stream blocks after the dual ones, it feeds them: nothing is dead.
    dead = 2 * b * nc * (h * h + 2 * h * f) if d["layers"] and not single else 0
    dense_blocks = d["layers"] + single - (sparse["sparse_blocks"] if sparse else 0)
    parts = {
        "blocks_attention": dense_blocks * 4 * b * heads * s_attn * _pad(s_attn, kv_block) * hd + (
            sparse["sparse_blocks"] * ssta_kernel_cost(sparse, b, heads, hd, 2)["flops"] if sparse else 0),
        "blocks_linear": (d["layers"] * 2 * b * (nv + nc) * per_token_block - dead
                          + single * 2 * b * (nv + nc) * (4 * h * h + 2 * h * f_single)),
        # norm1 + norm1_context: h -> 6h on temb per dual block; norm: h -> 3h per single block
        "blocks_modulation": d["layers"] * 2 * (2 * b * h * 6 * h) + single * 2 * b * h * 3 * h,
        "refiner_attention": d["refiner_layers"] * 4 * b * heads * lt * _pad(lt, kv_block) * hd,
        "refiner_linear": (2 * b * lt * d["text_dim"] * h  # proj_in
                           + d["refiner_layers"] * (2 * b * lt * per_token_refiner + 2 * b * h * 2 * h)  # + AdaNorm
                           + 2 * b * (TIME_PROJ_DIM * h + h * h) + 2 * b * (d["text_dim"] * h + h * h)),
        "embedders": (2 * b * nv * d["in_channels"] * d["patch_t"] * d["patch"] ** 2 * h  # x_embedder (conv)
                      + 2 * b * (TIME_PROJ_DIM * h + h * h) * (1 + d.get("guidance_embed", 0))  # time, guidance
                      + 2 * b * (d.get("pooled_dim", 0) * h + h * h if d.get("pooled_dim") else 0)  # pooled text
                      + 2 * b * preset.byt5_len * (d["byt5_dim"] * BYT5_HIDDEN + BYT5_HIDDEN ** 2 + BYT5_HIDDEN * h)
                      + 2 * b * preset.image_tokens * (d["image_dim"] ** 2 + d["image_dim"] * h)),
        "output": 2 * b * h * 2 * h + 2 * b * nv * h * d["out_channels"] * d["patch_t"] * d["patch"] ** 2,
    }
    attention = parts["blocks_attention"] + parts["refiner_attention"]
    total = sum(parts.values())
    return dict(attention=attention, linear=total - attention, total=total, attention_share=attention / total,
                parts=parts, eager_extra=dead, tokens=dict(tok, batch=batch, attended=s_attn), ssta=sparse)


def _joint_stream_parts(preset: Preset, d: dict[str, int], b: int, nv: int, nc: int, s_attn: int,
                     kv_block: int | None) -> dict[str, int]:
    """:func:`step_flops`' parts for a one-stream model (CogVideoX's): one joint stream of ``nc`` T5 + ``nv`` video tokens through each
    block's to_q/k/v, to_out.0 and MLP (the same weights for both); two AdaLN-zero linears per block (time_dim ->
    6 h); the patch embedding (a Linear over C x p_t x p x p patches), text_proj, the time embedding (h sinusoids ->
    time_dim -> time_dim), ``norm_out``'s linear (time_dim -> 2 h) and ``proj_out``. Nothing is dead code: the last
    block's MLP runs on [text ; video] concatenated, so its text rows (and their to_out before it) are computed and
    then dropped, which a compiler cannot skip (the compiled program keeps every dot,
    tests/test_cogvideox_compile.py)."""
    h, f, te, layers = d["hidden"], d["mlp"], d["time_dim"], d["layers"]
    patch = d["in_channels"] * d["patch_t"] * d["patch"] ** 2
    return {
        "blocks_attention": layers * 4 * b * d["heads"] * s_attn * _pad(s_attn, kv_block) * d["head_dim"],
        "blocks_linear": layers * 2 * b * (nv + nc) * (4 * h * h + 2 * h * f),
        "blocks_modulation": layers * 2 * (2 * b * te * 6 * h),  # norm1 + norm2: time_dim -> 6 h on temb
        "refiner_attention": 0, "refiner_linear": 0,
        "embedders": 2 * b * nv * patch * h + 2 * b * nc * d["text_dim"] * h + 2 * b * (h * te + te * te),
        "output": 2 * b * te * 2 * h + 2 * b * nv * h * d["out_channels"] * d["patch_t"] * d["patch"] ** 2,
    }


# ----------------------------------------------------------------------------------- parameters and rules
def rule_set_names() -> tuple[str, ...]:
    """``replicated`` (no rule) plus the strategies the TPU runtime places weights with
    (:data:`hyv_lib.parallel.sharding.STRATEGIES`: ``tp``, ``tp_replicated_out``, ``fsdp``)."""
    return ("replicated", *sharding.STRATEGIES)


@functools.lru_cache(maxsize=8)
def _meta_params(model: str, config_json: str) -> tuple[tuple[str, tuple[int, ...]], ...]:
    import torch

    with torch.device("meta"):
        transformer = get_adapter(model).build(json.loads(config_json))
    return tuple((name, tuple(p.shape)) for name, p in transformer.named_parameters())


def parameter_shapes(preset: Preset | str) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """(name, shape) of every parameter of the preset's transformer, from a meta-device instance (no memory) built
    by the preset's model adapter."""
    preset = as_preset(preset)
    return _meta_params(preset.model, json.dumps(preset.transformer, sort_keys=True))


def rule_list(preset: Preset, rules: str) -> list:
    """The rules of ``rules`` (``replicated`` or a strategy) over the parameter names of the preset's model."""
    return [] if rules == "replicated" else get_adapter(preset.model).rules(rules)


MESH_AXES = ("data", "tensor", "sequence")  # hyv_lib.parallel.mesh.AXES


class _MeshShape:
    """Stands in for a jax Mesh where only ``.shape`` is read (hyv_lib.parallel.sharding.plan): no devices needed."""

    def __init__(self, shape: dict[str, int]):
        self.shape = {axis: shape.get(axis, 1) for axis in MESH_AXES}


def as_mesh(mesh_shape: int | str | Mapping[str, int] | None, axis: str = "tensor") -> dict[str, int]:
    """int n -> n devices on ``axis``; a dict of data/tensor/sequence sizes, or the string form the CLI and
    ``make_step`` take ('data=2,tensor=4'); None -> one device."""
    if mesh_shape is None:
        mesh_shape = 1
    if isinstance(mesh_shape, str):
        try:
            mesh_shape = parse_mesh(mesh_shape) or 1
        except HyvInputError as err:  # it names the mesh of a stage-2 run
            raise HyvInputError("mesh_shape", err.message) from None
    mesh = {axis: mesh_shape} if isinstance(mesh_shape, int) else dict(mesh_shape)
    if any(k not in MESH_AXES or not isinstance(v, int) or v < 1 for k, v in mesh.items()):
        raise HyvInputError("mesh_shape", f"an int or a dict of {', '.join(MESH_AXES)} with positive integer "
                                          f"sizes; got {mesh_shape!r}")
    return {a: mesh.get(a, 1) for a in MESH_AXES}


def plan_specs(preset: Preset, rules: str, mesh: dict[str, int]) -> tuple[dict[str, tuple], list[dict]]:
    return plan(dict(parameter_shapes(preset)), rule_list(preset, rules), _MeshShape(mesh))


def split_factor(spec: tuple, mesh: dict[str, int]) -> int:
    """How many ways a PartitionSpec splits a tensor on ``mesh``."""
    n = 1
    for axes in spec:
        for axis in (axes if isinstance(axes, tuple) else (axes,) if axes else ()):
            n *= mesh[axis]
    return n


def param_bytes(preset: Preset | str, dtype: str = "bf16", rules: str | Sequence[Any] | None = None,
                mesh_shape: int | Mapping[str, int] | None = None) -> dict[str, Any]:
    """Per-device weight bytes of the transformer under a sharding rule set.

    ``rules``: ``replicated`` (the default: every weight whole on every device) or a strategy of
    :data:`hyv_lib.parallel.sharding.STRATEGIES` with the preset's model adapter's rule set for it, exactly as the TPU
    runtime places them (HunyuanVideo-1.5's, :data:`hyv_lib.models.hunyuan_video15.adapter.RULE_SETS`): ``tp`` (Megatron on the joint
    blocks: to_q/k/v, add_*_proj, ff(.context).net.0.proj split by output features = column-parallel;
    to_out.0, to_add_out, ff(.context).net.2 split by input features = row-parallel; the rest, including
    the AdaLN modulation linears and the token refiner, replicated), ``tp_replicated_out`` (the
    row-parallel ones replicated instead), ``fsdp`` (every joint-block weight split along its first
    dimension over all devices), or a list of :class:`hyv_lib.parallel.sharding.Rule`. ``mesh_shape``: an int
    (that many devices on the ``tensor`` axis) or a dict of ``data``/``tensor``/``sequence`` sizes.
    Parameter names and shapes come from a meta-device instance of the diffusers class. A rule that
    matches no parameter, or a split that does not divide its dimension, raises ValueError.
    Returns ``bytes_per_device`` and one row per rule: tensors, params, bytes per device.
    """
    preset = as_preset(preset)
    bpe = dtype_bytes(dtype)
    if rules is None:
        rules = "replicated"
    if isinstance(rules, str) and rules not in rule_set_names():
        raise HyvInputError("rules", f"unknown rule set {rules!r}; valid: {', '.join(rule_set_names())}")
    name = rules if isinstance(rules, str) else "custom"
    chosen = rule_list(preset, rules) if isinstance(rules, str) else list(rules)
    mesh = as_mesh(mesh_shape)
    _, report = plan(dict(parameter_shapes(preset)), chosen, _MeshShape(mesh))
    rows = [dict(rule=r["rule"], tensors=r["tensors"], params=r["params"], bytes_per_device=r["per_device"] * bpe)
            for r in report]
    total = sum(r["params"] for r in rows)
    return dict(rules=name, dtype=dtype, mesh=mesh, n_devices=math.prod(mesh.values()), rows=rows, params=total,
                bytes_per_device=sum(r["bytes_per_device"] for r in rows), replicated_bytes=total * bpe)


# ------------------------------------------------------------------------------------------ attention HBM
#: Query rows per tile of flash-attention 2's forward at head dim 128 on sm80/sm90 (``run_mha_fwd_hdim128`` in
#: flash_fwd_launch_template.h, also in PyTorch's copy under aten/src/ATen/native/transformers/cuda/flash_attn):
#: each tile streams every K/V row of its (batch, head) once.
FLASH_BLOCK_Q = 128
#: Query tiles of one (sample, head) resident at once on an H100/H200 (132 SMs, one 128-row tile each; NVIDIA H100
#: whitepaper): flash-attn's grid puts a head's query tiles next to each other, so those tiles read each K/V tile
#: from HBM about once and share it through L2. An estimate (no GPU profile here): a GPU's K/V re-reads are counted
#: per ``FLASH_BLOCK_Q x GPU_RESIDENT_TILES`` query rows. A TPU has no such cache: Splash re-reads per query block.
GPU_RESIDENT_TILES = 132


def attention_hbm_bytes(preset: Preset | str, height: int, width: int, video_length: int, batch: int | None = None, *,
                        dtype: str = "bf16", block_q: int = 2048, block_kv: int | None = None,
                        pad: bool = True, attention: str | SstaConfig | None = None) -> dict[str, Any]:
    """HBM bytes the attention kernel moves in one transformer forward, following how a flash-style kernel (Splash,
    flash-attn) walks the sequence: per (sample, head) it reads Q once and writes O once, and for each of the
    ``ceil(S / block_q)`` query tiles it streams all of K and V again (they do not fit in VMEM / shared memory).
    Per joint block (a single-stream block attends over the same joint sequence: counted as one):
    ``B H D x (2 S_q + 2 (S_q / block_q) S_kv)``; the token refiner's self-attention over the text counts the same
    way. ``pad``: Splash pads the joint sequence to a multiple of its blocks (``S_q``, ``S_kv``
    rounded up); flash-attn's varlen kernel reads only the real rows (``pad=False``). ``attention`` as for
    :func:`step_flops` (None: the preset's own): with SSTA the joint blocks that run it count
    :func:`hyv_lib.planning.sparse.ssta_kernel_cost`'s bytes instead (Q and O once over the tiled sequence, each
    384-token query tile re-reading only its attended K/V tiles); ``passes`` is then its mean K/V reads per block
    and ``block_q`` its tile.

    Returns ``total``, ``joint_blocks``, ``refiner``, ``passes`` (K/V reads per joint block), the block sizes,
    ``flops`` (the attention FLOPs of :func:`step_flops`) and ``intensity`` = flops / total: the kernel's arithmetic
    intensity, about ``2 block_q / x`` FLOP per byte at long sequences (x = bytes per element), whatever the layout.
    """
    preset = as_preset(preset)
    batch = step_batch(preset, batch)
    x = dtype_bytes(dtype)
    for name, value in (("block_q", block_q), ("block_kv", block_kv)):
        if value is not None and (not isinstance(value, int) or value < 1):
            raise HyvInputError(name, f"must be a positive integer, got {value!r}")
    d = model_dims(preset)
    tok = token_counts(preset, height, width, video_length)

    def per_block(tokens: int) -> tuple[int, int, int]:
        bq = min(block_q, _round_up(tokens, 128)) if pad else block_q
        bkv = min(block_kv or bq, _round_up(tokens, 128)) if pad else (block_kv or bq)
        s_q = _round_up(tokens, max(bq, bkv)) if pad else tokens
        passes = -(-s_q // bq)
        return batch * d["heads"] * d["head_dim"] * x * (2 * s_q + 2 * passes * s_q), passes, bq

    joint, passes, bq = per_block(tok["joint"])
    blocks = d["layers"] + d.get("single_layers", 0)
    joint_blocks = blocks * joint
    sparse = ssta_density(preset, height, width, video_length, attention)
    if sparse:
        kernel = ssta_kernel_cost(sparse, batch, d["heads"], d["head_dim"], x)
        joint_blocks = (blocks - sparse["sparse_blocks"]) * joint + sparse["sparse_blocks"] * kernel["bytes"]
        passes, bq, block_kv = kernel["passes"], kernel["block_q"], kernel["block_q"]
    refiner, _, _ = per_block(preset.text_len)
    total = joint_blocks + d["refiner_layers"] * refiner
    flops = step_flops(preset, height, width, video_length, batch, attention=attention)["attention"]
    return dict(total=total, joint_blocks=joint_blocks, refiner=d["refiner_layers"] * refiner, passes=passes,
                block_q=bq, block_kv=block_kv or bq, flops=flops, intensity=flops / total)


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


# ------------------------------------------------------------------------------------------- activations
def activation_bytes(preset: Preset | str, height: int, width: int, video_length: int, batch: int | None = None, *,
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
    - single (models with single-stream blocks only): b s ((h + f_s) / t) x, the [attention ; MLP] features a
      single-stream block concatenates for its proj_out (its MLP intermediate is ``mlp`` when f_s = f)
    - attention working set, ``flash`` (Splash / FlashAttention): a fp32 output accumulator plus running
      max and sum per query, b h_loc S (D + 2) 4 bytes, i.e. O(S D) per head (tiles are O(1));
      ``dense``: fp32 logits b h_loc S^2 4 plus diffusers' boolean [B, 1, S, S] mask b S^2 (a lower
      estimate: softmax usually keeps another S^2 copy).
    """
    preset = as_preset(preset)
    batch = step_batch(preset, batch)
    if attention not in ("flash", "dense"):
        raise HyvInputError("attention", f"must be 'flash' or 'dense', got {attention!r}")
    x = dtype_bytes(dtype)
    mesh = as_mesh(mesh_shape)
    t, sp = mesh["tensor"], mesh["sequence"]
    d = model_dims(preset)
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
    if d.get("single_layers", 0):
        parts["single"] = b * s * -(-(h + d["single_mlp"]) // t) * x
    if attention == "flash":
        parts["attention"] = b * h_loc * s_full * (hd + 2) * 4
    else:
        parts["attention"] = b * h_loc * s_full * s_full * 4 + b * s_full * s_full
    return dict(parts=parts, bytes_per_device=sum(parts.values()), attention=attention, mesh=mesh,
                tokens_per_device=s, samples_per_device=b)


# ------------------------------------------------------------------------------------------- collectives
#: Strategy -> the mesh axis an int ``mesh_shape`` goes on.
STRATEGIES = {"tp": "tensor", "ulysses": "sequence", "fsdp": "tensor", "dp": "data"}


def collective_bytes(preset: Preset | str, height: int, width: int, video_length: int, batch: int | None = None, *,
                     dtype: str = "bf16", strategy: str = "tp",
                     mesh_shape: int | Mapping[str, int] | None = None) -> dict[str, Any]:
    """Bytes each device sends over the interconnect in one forward (one denoising step at the preset's batch,
    :func:`step_batch`), by strategy.

    ``mesh_shape``: an int (that many devices on the strategy's axis: tensor for tp and fsdp, sequence
    for ulysses, data for dp) or a dict of data/tensor/sequence sizes. n = that axis' size,
    b = ceil(B / data), x = dtype bytes, N_v / N_c = video / context tokens, S = N_v + N_c, h = hidden.

    - ``tp`` (Megatron, the ``tp`` rule set): each row-parallel output (to_out.0 / to_add_out and
      ff.net.2, per stream) is all-reduced; a ring all-reduce of m bytes sends 2 (n-1)/n m per device.
      Per joint block: 2 x 2 (n-1)/n b S h x; per single-stream block one (its proj_out): 2 (n-1)/n b S h x.
      (With ``tp_replicated_out`` XLA chooses other collectives; this is the plain-TP count.)
    - ``ulysses`` (sequence parallel; XLA's resharding around head-sharded attention on a mesh with a
      sequence axis is the same pattern): per joint block, all_to_all of q, k, v (sequence -> heads)
      and of the output (heads -> sequence); a device holds m = b S h x / n of each and sends
      (n-1)/n m: 4 (n-1)/n b S h x / n per block, single-stream blocks too; plus a final all-gather of the output
      latents.
    - ``fsdp``: every weight the ``fsdp`` rule set splits is all-gathered once per forward:
      (n-1)/n of those weight bytes (n = all devices).
    - ``dp`` (CFG-parallel, a whole sample per device): only the final gather of the noise prediction.
    """
    preset = as_preset(preset)
    batch = step_batch(preset, batch)
    if strategy not in STRATEGIES:
        raise HyvInputError("strategy", f"must be one of {', '.join(STRATEGIES)}, got {strategy!r}")
    x = dtype_bytes(dtype)
    d = model_dims(preset)
    tok = token_counts(preset, height, width, video_length)
    mesh = as_mesh(mesh_shape, STRATEGIES[strategy])
    b = -(-batch // mesh["data"])
    h = d["hidden"]
    single = d.get("single_layers", 0)
    output = b * tok["video"] * d["out_channels"] * x  # the noise prediction of the local samples
    if strategy == "tp":
        n = mesh["tensor"]
        per_block = 2 * (2 * (n - 1) / n) * b * tok["joint"] * h * x
        total = d["layers"] * per_block + single * per_block / 2  # a single-stream block: one all-reduce
        ops = dict(per_block=per_block, blocks=total)
    elif strategy == "ulysses":
        n = mesh["sequence"]
        per_block = 4 * (n - 1) / n * b * tok["joint"] * h * x / n
        gather = (n - 1) / n * output
        total = (d["layers"] + single) * per_block + gather
        ops = dict(per_block=per_block, blocks=(d["layers"] + single) * per_block, output_gather=gather)
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

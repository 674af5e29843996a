"""Per-device memory of a HunyuanVideo-1.5 fine-tuning step (LoRA or full; remat, FSDP, Ulysses) and which cards fit."""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass
from typing import Any, Sequence

from ..base.errors import HyvInputError
from ..base.presets import Preset
from ..models.lora import lora_target_names, target_names
from ..models.registry import get_adapter
from . import gpu_memory as gm
from .costs import BYT5_HIDDEN, as_preset, model_dims, parameter_shapes, token_counts
from .hardware import GIB, check_count, get_chip

TRAINABLE, DEVICES = ("lora", "full"), ("gpu", "tpu", "cpu")


# ----------------------------------------------------------------------------------------- saved tensors
@dataclass(frozen=True)
class Saved:
    """What a piece of the model keeps for its backward per token, as tensor counts by width: ``h`` [hidden], ``f`` [MLP
    width], ``stats`` [1] (LayerNorm's mean and 1/std), ``rank`` [LoRA rank] and ``wide`` (elements of any other width)
    in the activation dtype; ``h_fp32``, ``heads_fp32``, ``rank_fp32`` in fp32."""

    h: float = 0
    f: float = 0
    h_fp32: float = 0
    heads_fp32: float = 0
    stats: float = 0
    rank: float = 0
    rank_fp32: float = 0
    wide: int = 0

    def bytes_per_token(self, h: int, f: int, heads: int, rank: int, x: int) -> float:
        return ((self.h * h + self.f * f + self.stats + self.rank * rank + self.wide) * x
                + (self.h_fp32 * h + self.heads_fp32 * heads + self.rank_fp32 * rank) * 4)


# Counted with torch.autograd.graph.saved_tensors_hooks on one HunyuanVideo15TransformerBlock (diffusers 0.42.1,
# hyv_lib's JointAttnProcessor with SDPA) at tiny widths: the storages it saves that it allocated (its inputs, RoPE
# tables and weights are counted elsewhere), each sorted by its token count and width (tests/test_train_memory.py
# repeats the count). Both streams keep the same, per token ("stream"); per joint token (video + context; under
# Ulysses a rank's heads) "joint". Keys: what trains.
# - full (every weight): h: the norm1 LayerNorm output and its modulated copy; q and k before and after their RMSNorm
#   (4); the attention output after to_out (for its gate); the residual into norm2, its output, the modulated copy
#   into the MLP; the MLP output (for its gate): 11. f: GELU's input and output. h_fp32 and heads_fp32: RMSNorm's fp32
#   copy of q and k and their 1/rms per head. stats: two LayerNorms. Joint: q, k, v, the kernel's output and its
#   flattened copy (to_out's input); the kernel's log-sum-exp.
# - lora (hyv_lib.models.lora's default targets, the q, k, v and output projections of both streams; factors in the
#   activation dtype): a frozen linear keeps no input, a frozen gate no multiplicand: the modulated norm (the input
#   of q, k, v's LoRA), q and k before RMSNorm, the norm2 residual (4 h), GELU's input (1 f), the 4 down-projections.
# - lora_fp32 (fp32 factors on bf16 weights, as hyv_lib.runtimes.torch_train keeps them in one process): peft casts each
#   adapted layer's input to fp32 and the factor keeps that copy: 3 (q, k, v) + 1 (output) fp32 inputs instead of the
#   modulated norm and the joint flattened copy; fp32 down-projections.
BLOCK_SAVED: dict[str, dict[str, Saved]] = {
    "full": dict(stream=Saved(h=11, f=2, h_fp32=2, heads_fp32=2, stats=4), joint=Saved(h=5, heads_fp32=1)),
    "lora": dict(stream=Saved(h=4, f=1, h_fp32=2, heads_fp32=2, stats=4, rank=4), joint=Saved(h=5, heads_fp32=1)),
    "lora_fp32": dict(stream=Saved(h=3, f=1, h_fp32=6, heads_fp32=2, stats=4, rank_fp32=4),
                      joint=Saved(h=4, heads_fp32=1)),
}
#: A LoRA's first block, whose inputs need no gradient (the frozen embedders make them): its norm1s keep no statistics.
FIRST_BLOCK_STATS = 2
#: Around the blocks, per video token: the output head (norm_out's LayerNorm input; with its weights trained also its
#: output and proj_out's input); the loss keeps its fp32 difference (out_channels wide, counted on its own).
HEAD_SAVED = {"full": Saved(h=3, stats=2), "lora": Saved(h=1, stats=2)}
#: Full fine-tuning also keeps the embedders' tensors (frozen under LoRA, they need no gradient): per text token each
#: token-refiner layer (a block's stream without RMSNorm, with its own 4h MLP, and its attention's log-sum-exp); per
#: ByT5 token the LayerNorm output (its input width, added below) and two GELUs' inputs and outputs at the projection's
#: fixed 2048 width; per image token the LayerNorm output, GELU's input and output (3 x its width, added below) and
#: the output LayerNorm's input.
REFINER_SAVED = Saved(h=11, f=2, heads_fp32=1, stats=4)
BYT5_SAVED = Saved(stats=2, wide=4 * BYT5_HIDDEN)
IMAGE_SAVED = Saved(h=1, stats=4)

# Measured, not derived: torch's live tensor bytes of one block's forward and backward on the CPU (live_peak_bytes)
# less the saved tensors above, per token, in units of h elements of the activation dtype. The backward peaks inside
# the attention's backward, after both streams' MLP backward has freed their MLP tensors: per video token the
# gradients in flight add copies; per context token more is freed than is in flight (hence negative). The last
# block's context output feeds nothing (only the video tokens reach the head), so its context MLP is never walked back
# and frees nothing. The same at three widths (h = 60 to 64, 2 to 4 heads) within 0.01 units, fp32 factors or not; at
# h = 48 larger (6.15 and 10.2 video copies): part of it is the CPU attention kernel's work buffers, fixed in size
# (about 1.5 MB on one thread). A GPU's kernels differ: benchmarks/gpu_check.py's train section measures the real model.
BACKWARD_EXTRA = {"full": dict(video=5.73, context=-8.0), "lora": dict(video=8.94, context=-2.0)}
LAST_BLOCK_EXTRA = {"full": dict(video=5.73, context=1.0), "lora": dict(video=8.94, context=1.0)}


# ------------------------------------------------------------------------------------ precision recipes
@dataclass(frozen=True)
class Recipe:
    """Bytes per parameter of one training recipe: ``frozen`` weights; for each trained parameter its ``weight``,
    ``gradient``, ``master`` copy and AdamW's two ``moments``; ``activation`` bytes per element; ``lora_fp32``: LoRA
    factors in fp32 on bf16 weights (their activations: :data:`BLOCK_SAVED`'s ``lora_fp32``)."""

    frozen: int
    weight: int
    gradient: int
    master: int
    moments: int
    activation: int = 2
    lora_fp32: bool = False
    #: the weights no gradient reaches (:func:`dead_parameters`) get gradient and moments all the same (JAX's
    #: gradient of every parameter, optax's state for all); torch.optim.AdamW skips a parameter whose grad is None
    dead_have_state: bool = True
    source: str = ""

    @property
    def per_trained_param(self) -> int:
        return self.weight + self.gradient + self.master + self.moments


FP32_LORA = Recipe(2, 4, 4, 0, 8, lora_fp32=True, dead_have_state=False, source="fp32 LoRA factors on a bf16 model")
#: The recipes (``precision``), by trainable (``lora`` / ``full``).
RECIPES: dict[str, dict[str, Recipe]] = {
    # hyv_lib.runtimes.torch_train.TorchTrainStep in one process: torch.optim.AdamW keeps its moments in each
    # parameter's dtype; the LoRA factors are fp32 (16 bytes each), full fine-tuning trains the bf16 weights as they
    # are, no master copy (8 bytes per parameter). Under FSDP2 a LoRA stays bf16 (one dtype per sharded group).
    "torch": dict(lora=FP32_LORA, full=Recipe(2, 2, 2, 0, 4, dead_have_state=False,
                                              source="bf16 weights, gradients and moments")),
    # hyv_lib.runtimes.jax_train.JaxTrainStep (and planning.train_compile): bf16 frozen weights; each trained parameter
    # an fp32 master, its fp32 gradient and fp32 moments (16 bytes; the bf16 copy the forward uses is made in the step).
    "mixed": dict.fromkeys(TRAINABLE, Recipe(2, 0, 4, 4, 8, source="fp32 master, gradient and moments")),
    # torch.optim.AdamW on bf16 (fp32) weights
    "bf16": dict.fromkeys(TRAINABLE, Recipe(2, 2, 2, 0, 4, dead_have_state=False, source="all bf16")),
    "fp32": dict.fromkeys(TRAINABLE, Recipe(4, 4, 4, 0, 8, 4, dead_have_state=False, source="all fp32")),
}


def recipe(precision: str, trainable: str, fsdp: int = 1) -> Recipe:
    if precision not in RECIPES:
        raise HyvInputError("precision", f"must be one of {', '.join(RECIPES)}, got {precision!r}")
    if precision == "torch" and trainable == "lora" and fsdp > 1:
        return RECIPES["bf16"]["lora"]
    return RECIPES[precision][trainable]


# ----------------------------------------------------------------------------------------------- LoRA
@functools.lru_cache(maxsize=8)
def _lora_layers(model: str, config_json: str, targets: tuple[str, ...] | None) -> tuple[tuple[str, int, int], ...]:
    """(name, in_features, out_features) of the linear layers a LoRA on ``targets`` adapts, in a meta-device build:
    the adapter's target groups (:func:`~hyv_lib.models.lora.lora_target_names`) or module names (``target_names``)."""
    import torch

    with torch.device("meta"):
        transformer = get_adapter(model).build(json.loads(config_json))
    modules, groups = dict(transformer.named_modules()), targets and set(targets) <= set(get_adapter(model).lora_targets)
    names = (lora_target_names(transformer, list(targets)) if groups
             else target_names(transformer, targets and list(targets)))
    return tuple((n, modules[n].in_features, modules[n].out_features) for n in names)


def lora_parameters(preset: Preset | str, rank: int, targets: Sequence[str] | None = None) -> dict[str, Any]:
    """Parameters of a rank-``rank`` LoRA on ``targets`` (default: :data:`hyv_lib.models.lora.DEFAULT_TARGETS` in the
    blocks' attention): per adapted layer ``rank x (in + out)`` (A: rank x in, B: out x rank). Returns ``params``,
    ``modules``, ``block_params`` (those inside the blocks) and ``largest`` (one factor's)."""
    preset = as_preset(preset)
    check_count("lora_rank", rank)
    layers = _lora_layers(preset.model, json.dumps(preset.transformer, sort_keys=True),
                          tuple(targets) if targets is not None else None)
    return dict(params=sum(rank * (i + o) for _, i, o in layers), modules=len(layers),
                block_params=sum(rank * (i + o) for n, i, o in layers if gm.block_of(preset, n) is not None),
                largest=max(rank * max(i, o) for _, i, o in layers))


# ---------------------------------------------------------------------------------------------- state
#: The last block's context-stream layers after its attention: no gradient reaches them (their output feeds nothing).
DEAD_LAYERS = ("attn.to_add_out", "ff_context.")


def dead_parameters(preset: Preset, lora: dict[str, Any] | None = None, lora_rank: int = 0,
                    lora_targets: Sequence[str] | None = None) -> int:
    """Trained parameters no gradient reaches (:data:`DEAD_LAYERS` of the last block; under a LoRA, its factors; none
    where single-stream blocks follow, which read the last dual block's context stream)."""
    prefix = f"{get_adapter(preset.model).block_prefix}{model_dims(preset)['layers'] - 1}."
    dead = () if model_dims(preset).get("single_layers") else tuple(prefix + layer for layer in DEAD_LAYERS)
    if lora is not None:
        layers = _lora_layers(preset.model, json.dumps(preset.transformer, sort_keys=True),
                              tuple(lora_targets) if lora_targets is not None else None)
        return sum(lora_rank * (i + o) for n, i, o in layers if n.startswith(dead))
    return sum(math.prod(shape) for name, shape in parameter_shapes(preset) if name.startswith(dead))


def state_bytes(preset: Preset | str, trainable: str = "lora", *, lora_rank: int = 16,
                lora_targets: Sequence[str] | None = None, precision: str = "torch", fsdp: int = 1) -> dict[str, Any]:
    """Per-device bytes a train step keeps from one step to the next: ``weights`` (frozen and trained, LoRA factors
    included), ``gradients`` (``block_gradients``: the blocks' share), ``master`` (fp32 copies) and ``optimizer``
    (AdamW's two moments), each a rank's shard under FSDP over ``fsdp`` ranks (every parameter split along its first
    dimension, padded, as :func:`~hyv_lib.planning.gpu_memory.fsdp_shard_bytes` lays them out); and the counts."""
    preset = as_preset(preset)
    rec = recipe(precision, trainable, fsdp)
    layout = gm.weight_layout(preset, "bf16")
    params, block_params = layout["total"] // 2, layout["blocks"] // 2
    lora = lora_parameters(preset, lora_rank, lora_targets) if trainable == "lora" else None
    trained, block_trained = (lora["params"], lora["block_params"]) if lora else (params, block_params)
    frozen = params if lora else 0
    live = trained - (0 if rec.dead_have_state else dead_parameters(preset, lora, lora_rank, lora_targets))
    block_live = block_trained - (trained - live)
    share = 1.0 if fsdp == 1 else gm.fsdp_shard_bytes(preset, fsdp, "bf16") / layout["total"]
    largest = lora["largest"] if lora else max(math.prod(shape) for _, shape in parameter_shapes(preset))
    return dict(weights=(frozen * rec.frozen + trained * rec.weight) * share, gradients=live * rec.gradient * share,
                largest_trained=largest,
                block_gradients=block_live * rec.gradient * share, master=trained * rec.master * share,
                optimizer=live * rec.moments * share, params=params, trained_params=trained, lora=lora, recipe=rec)


# ---------------------------------------------------------------------------------------- activations
def block_saved_bytes(kind: str, *, video_tokens: int, context_tokens: int, hidden: int, mlp: int, heads: int,
                      rank: int = 0, activation_bytes: int = 2, batch: int = 1, sequence_parallel: int = 1,
                      first: bool = False) -> float:
    """Bytes one block keeps for its backward (:data:`BLOCK_SAVED` ``kind``: ``full``, ``lora``, ``lora_fp32``) for
    ``batch`` samples of ``video_tokens`` (a rank's) and ``context_tokens``: per token of each stream, plus per joint
    token (every rank's video tokens and the context) with a rank's share of the heads under Ulysses over
    ``sequence_parallel`` ranks. ``first``: a LoRA's first block, whose inputs need no gradient
    (:data:`FIRST_BLOCK_STATS` fewer)."""
    n, x = sequence_parallel, activation_bytes
    saved = BLOCK_SAVED[kind]
    per_token = saved["stream"].bytes_per_token(hidden, mlp, heads, rank, x)
    if first and kind != "full":
        per_token -= FIRST_BLOCK_STATS * x
    joint = (video_tokens * n + context_tokens) * saved["joint"].bytes_per_token(hidden // n, mlp, heads // n, rank, x)
    return batch * ((video_tokens + context_tokens) * per_token + joint)


def activation_phases(preset: Preset | str, height: int, width: int, video_length: int, *, batch_size: int = 1,
                      trainable: str = "lora", lora_rank: int = 16, remat: bool = True, sequence_parallel: int = 1,
                      activation_bytes: int = 2, lora_fp32: bool = False, block_gradients: float = 0,
                      gradients: float = 0, optimizer_temporaries: float = 0,
                      previous_gradients: float = 0) -> dict[str, Any]:
    """Bytes a train step allocates on top of what it keeps between steps, at the points where it can peak:
    ``forward_end`` (the loss computed; with the last step's ``previous_gradients`` where they are cleared only after
    the forward, as hyv_lib's torch step does), ``backward_start`` (the last block's backward), ``backward_end`` (the
    first block's backward, with the blocks' gradients ``block_gradients``) and ``optimizer`` (all ``gradients`` and
    the update's ``optimizer_temporaries``). With b samples, N_v video tokens (N_v / n under Ulysses over n ranks), N_c
    context tokens (whole on every rank), hidden h and x bytes per activation element:

    - a block holds its inputs, b (N_v + N_c) h x, for its backward: with ``remat`` that is all it holds until its
      backward recomputes it; without, also what it saves (:data:`BLOCK_SAVED` per token of each stream and per
      joint token with a rank's heads; a LoRA's first block :data:`FIRST_BLOCK_STATS`);
    - around the blocks: the RoPE tables (2 N_v head_dim fp32); the prediction (out_channels wide; the step holds it
      to the end); until the head's backward the head and the loss (:data:`HEAD_SAVED`, fp32 out_channels); in full
      fine-tuning the embedders (:data:`REFINER_SAVED`, :data:`BYT5_SAVED`, :data:`IMAGE_SAVED`);
    - the block in backward adds :data:`LAST_BLOCK_EXTRA` (the last) or :data:`BACKWARD_EXTRA` (measured).
    """
    preset = as_preset(preset)
    d = model_dims(preset)
    tok = token_counts(preset, height, width, video_length)
    n, b, x = sequence_parallel, batch_size, activation_bytes
    h, f, heads, r = d["hidden"], d["mlp"], d["heads"], lora_rank if trainable == "lora" else 0
    nv, nc = -(-tok["video"] // n), tok["context"]
    kind = "full" if trainable == "full" else "lora_fp32" if lora_fp32 else "lora"

    def block(first: bool = False) -> float:
        return block_saved_bytes(kind, video_tokens=nv, context_tokens=nc, hidden=h, mlp=f, heads=heads, rank=r,
                                 activation_bytes=x, batch=b, sequence_parallel=n, first=first)

    def extra(copies: dict[str, float]) -> float:
        return b * (nv * copies["video"] + nc * copies["context"]) * h * x

    saved = block()
    first = block(first=True)
    inputs = b * (nv + nc) * h * x
    rope = 2 * nv * d["head_dim"] * 4
    head = b * nv * (HEAD_SAVED[trainable].bytes_per_token(h, f, heads, r, x) + d["out_channels"] * 4)
    prediction = b * nv * d["out_channels"] * x  # the model's output, which the train step holds until it returns
    embedders = 0.0
    if trainable == "full":
        embedders = b * (
            d["refiner_layers"] * preset.text_len * REFINER_SAVED.bytes_per_token(h, d["refiner_mlp"], heads, 0, x)
            + preset.byt5_len * (BYT5_SAVED.bytes_per_token(h, f, heads, 0, x) + d["byt5_dim"] * x)
            + preset.image_tokens * (IMAGE_SAVED.bytes_per_token(h, f, heads, 0, x) + 3 * d["image_dim"] * x))
    first_inputs = inputs if (remat or trainable == "full") else 0  # a frozen first block keeps no inputs
    blocks = d["layers"] + d.get("single_layers", 0)  # single-stream blocks: saved as a dual-stream block's
    if remat:
        held, last = blocks * inputs, saved  # the checkpoints' inputs; the last block recomputed
    else:
        held, last = (blocks - 1) * (saved + inputs) + first + first_inputs, 0.0
    around = rope + embedders + prediction
    key = "full" if trainable == "full" else "lora"
    phases = dict(forward_end=held + around + head + previous_gradients,
                  backward_start=held + around + last + extra(LAST_BLOCK_EXTRA[key]),
                  backward_end=first_inputs + first + around + extra(BACKWARD_EXTRA[key]) + block_gradients,
                  optimizer=gradients + optimizer_temporaries)
    peak_phase = max(phases, key=phases.get)
    return dict(phases=phases, peak_phase=peak_phase, peak=phases[peak_phase], tokens_per_device=nv,
                parts=dict(block_saved=saved, block_inputs=inputs, held=held, rope=rope, head=head,
                           prediction=prediction, embedders=embedders))


# --------------------------------------------------------------------------------------------- the step
def check_train_layout(preset: Preset, trainable: str, fsdp: int, data_parallel: int, sequence_parallel: int,
                       batch_size: int, remat: bool, device: str) -> None:
    """HyvInputError naming the argument of a layout this model does not describe."""
    if trainable not in TRAINABLE:
        raise HyvInputError("trainable", f"must be one of {', '.join(TRAINABLE)}, got {trainable!r}")
    if device not in DEVICES:
        raise HyvInputError("device", f"must be one of {', '.join(DEVICES)}, got {device!r}")
    if not isinstance(remat, bool):
        raise HyvInputError("remat", f"must be True or False, got {remat!r}")
    for name, value in (("batch_size", batch_size), ("fsdp", fsdp), ("data_parallel", data_parallel),
                        ("sequence_parallel", sequence_parallel)):
        check_count(name, value)
    heads = model_dims(preset)["heads"]
    if heads % sequence_parallel:
        valid = ", ".join(str(n) for n in range(1, heads + 1) if heads % n == 0)
        raise HyvInputError("sequence_parallel", f"Ulysses splits the {heads} heads: one of {valid}, got "
                                                 f"{sequence_parallel}")
    devices = data_parallel * sequence_parallel
    if devices % fsdp:
        raise HyvInputError("fsdp", f"shards over a divisor of the {devices} devices (data_parallel x "
                                    f"sequence_parallel), got {fsdp}")


def train_step_memory(preset: Preset | str, *, height: int, width: int, video_length: int, batch_size: int = 1,
                      trainable: str = "lora", lora_rank: int = 16, lora_targets: Sequence[str] | None = None,
                      remat: bool = True, fsdp: int = 1, data_parallel: int = 1, sequence_parallel: int = 1,
                      precision: str = "torch", device: str = "gpu") -> dict[str, Any]:
    """Peak per-device memory of one fine-tuning step (forward, flow-matching loss, backward, AdamW update) of the
    preset's transformer, in bytes.

    ``batch_size``: samples per data-parallel rank; ``data_parallel`` x ``sequence_parallel`` devices; the parameters,
    gradients and optimizer state sharded over ``fsdp`` of them (FSDP2 / ZeRO-3; 1: whole on each); Ulysses
    (``sequence_parallel`` = n) splits the video tokens and the attention heads n ways, the context whole on every rank.
    ``trainable``: ``lora`` (rank ``lora_rank`` on ``lora_targets``, default
    :data:`hyv_lib.models.lora.DEFAULT_TARGETS`; the base frozen) or ``full``; ``remat``: each block recomputed in the
    backward (gradient checkpointing); ``precision``: a :data:`RECIPES` key (``torch``: hyv_lib's torch train step,
    ``mixed``: its TPU one); ``device``: ``gpu`` (torch's allocator workspace, AdamW's foreach temporaries, the CUDA
    context), ``tpu`` or ``cpu`` (none of those).

    The parts, summed in ``allocated``: ``weights``, ``master``, ``optimizer`` (:func:`state_bytes`); ``inputs`` (the
    forward's keywords and the fp32 target on the device); ``buffers``: FSDP's gathered weights (the root's parameters
    for the step, :data:`~hyv_lib.planning.gpu_memory.FSDP_BLOCK_BUFFERS` blocks, a trained block's unsharded
    gradient) and a ``mixed`` recipe's bf16 copy of its trained weights; ``transient``: the peak of
    :func:`activation_phases` (``peak_phase``; the end of the backward and the update hold the ``gradients``, which
    are therefore not a part of their own); ``workspace``. ``total`` adds the CUDA context on a GPU.
    """
    preset = as_preset(preset)
    check_train_layout(preset, trainable, fsdp, data_parallel, sequence_parallel, batch_size, remat, device)
    state = state_bytes(preset, trainable, lora_rank=lora_rank, lora_targets=lora_targets, precision=precision,
                        fsdp=fsdp)
    rec, x = state["recipe"], state["recipe"].activation
    layout = gm.weight_layout(preset, "bf16")
    share = 1.0 if fsdp == 1 else gm.fsdp_shard_bytes(preset, fsdp, "bf16") / layout["total"]
    buffers = state["trained_params"] * 2 * share if rec.master else 0  # the bf16 copies the forward uses
    if fsdp > 1:
        buffers += layout["outside"] + (gm.FSDP_BLOCK_BUFFERS + (trainable == "full")) * layout["block"]
    # torch.optim.AdamW's update: on a GPU (foreach) one temporary the size of a moment (the second's square root); on
    # the CPU (one tensor at a time) that square root and its quotient for the largest trained tensor
    temporaries = 0.0
    if precision != "mixed" and device == "gpu":
        temporaries = state["optimizer"] / 2
    elif precision != "mixed" and device == "cpu":
        temporaries = 2 * state["largest_trained"] * rec.moments / 2
    d = model_dims(preset)
    _, c, t, hh, ww = preset.latent_shape(height, width, video_length)
    inputs = gm.step_inputs_bytes(preset, height, width, video_length, batch_size, x) + batch_size * c * t * hh * ww * 4
    act = activation_phases(preset, height, width, video_length, batch_size=batch_size, trainable=trainable,
                            lora_rank=lora_rank, remat=remat, sequence_parallel=sequence_parallel, activation_bytes=x,
                            lora_fp32=rec.lora_fp32, block_gradients=state["block_gradients"],
                            gradients=state["gradients"], optimizer_temporaries=temporaries,
                            previous_gradients=state["gradients"] if precision == "torch" else 0)
    parts = dict(weights=state["weights"], master=state["master"], optimizer=state["optimizer"], inputs=inputs,
                 buffers=buffers, transient=act["peak"], workspace=gm.ALLOCATOR_WORKSPACE if device == "gpu" else 0)
    allocated = sum(parts.values())
    context = gm.CUDA_CONTEXT if device == "gpu" else 0
    held_gradients = dict(backward_end=state["block_gradients"], optimizer=state["gradients"] + temporaries,
                          forward_end=state["gradients"] if precision == "torch" else 0)
    return dict(parts, gradients=state["gradients"], optimizer_temporaries=temporaries,
                activations=act["peak"] - held_gradients.get(act["peak_phase"], 0), phases=act["phases"],
                peak_phase=act["peak_phase"], activation_parts=act["parts"], allocated=allocated, context=context,
                total=allocated + context, params=state["params"], trained_params=state["trained_params"],
                lora=state["lora"], bytes_per_trained_param=rec.per_trained_param, recipe=rec.source,
                tokens_per_device=act["tokens_per_device"], hidden=d["hidden"],
                layout=dict(trainable=trainable, lora_rank=lora_rank if trainable == "lora" else None, remat=remat,
                            fsdp=fsdp, data_parallel=data_parallel, sequence_parallel=sequence_parallel,
                            precision=precision, batch_size=batch_size, device=device))


# -------------------------------------------------------------------------------------------- the table
@dataclass(frozen=True)
class TrainLayout:
    """A row of :func:`train_memory_table`: what trains and how the devices share the step."""

    name: str
    trainable: str
    remat: bool = True
    fsdp: int = 1
    data_parallel: int = 1
    sequence_parallel: int = 1


#: The layouts the book's table lists (8 devices where several: one host's GPUs, a v5e-8 / v6e-8 slice).
TRAIN_LAYOUTS = (
    TrainLayout("LoRA, one device", "lora"),
    TrainLayout("LoRA, one device, no remat", "lora", remat=False),
    TrainLayout("full, one device", "full"),
    TrainLayout("full, FSDP over 8", "full", fsdp=8, data_parallel=8),
    TrainLayout("full, Ulysses 8 + FSDP 8", "full", fsdp=8, sequence_parallel=8),
)
#: The TPU chips the table checks (per JAX device: a TPU7x chip shows two).
TABLE_CHIPS = ("v5e", "v6e", "v5p", "v7x")


def device_hbm(chip: str) -> float:
    """HBM bytes of one JAX device of a TPU chip (:data:`hyv_lib.planning.hardware.CHIPS`)."""
    return get_chip(chip).hbm_bytes / get_chip(chip).devices_per_chip


def train_memory_table(presets: Sequence[str] = ("480p_t2v", "720p_t2v"), video_lengths: Sequence[int] = (33, 61, 121),
                       layouts: Sequence[TrainLayout] = TRAIN_LAYOUTS, cards_gb: Sequence[int] = (24, 48, 80, 141),
                       chips: Sequence[str] = TABLE_CHIPS, *, lora_rank: int = 16,
                       headroom: float = gm.HEADROOM) -> list[dict[str, Any]]:
    """One row per preset (at its default 16:9 size), video length and layout: the modelled per-device peak of a train
    step (batch 1 per data-parallel rank) on a GPU with hyv_lib's torch recipe (``gpu_gib``: with the CUDA context) and
    on a TPU with its JAX recipe (``tpu_gib``: ``mixed``), and ``fits``: card GB or chip -> ``"yes"`` / ``"no"``
    (``headroom`` of the memory left free, as :func:`hyv_lib.planning.gpu_memory.fits`)."""
    for gb in cards_gb:
        gm.check_card(gb)
    for chip in chips:
        get_chip(chip)
    rows = []
    for name in presets:
        preset = as_preset(name)
        for frames in video_lengths:
            size = dict(height=preset.default_height, width=preset.default_width, video_length=frames)
            for lay in layouts:
                common = dict(size, trainable=lay.trainable, lora_rank=lora_rank, remat=lay.remat, fsdp=lay.fsdp,
                              data_parallel=lay.data_parallel, sequence_parallel=lay.sequence_parallel)
                gpu = train_step_memory(preset, **common, precision="torch", device="gpu")
                tpu = train_step_memory(preset, **common, precision="mixed", device="tpu")
                fit = {f"{gb} GB": "yes" if gm.fits(gpu["total"], gb, headroom) else "no" for gb in cards_gb}
                fit.update({chip: "yes" if tpu["total"] <= (1 - headroom) * device_hbm(chip) else "no"
                            for chip in chips})
                devices = lay.data_parallel * lay.sequence_parallel
                rows.append(dict(preset=name, **size, layout=lay.name, devices=devices, trainable=lay.trainable,
                                 remat=lay.remat, gpu_gib=gpu["total"] / GIB, tpu_gib=tpu["total"] / GIB,
                                 gpu_peak_phase=gpu["peak_phase"], fits=fit))
    return rows


def train_memory_markdown(rows: Sequence[dict[str, Any]]) -> str:
    """Markdown of :func:`train_memory_table` rows: per preset and size a caption and a table of the layouts, the
    modelled GiB per device (GPU: torch recipe; TPU: JAX recipe) and a yes/no column per card and chip."""
    out, group = [], None
    for r in rows:
        if (r["preset"], r["height"], r["width"], r["video_length"]) != group:
            group = (r["preset"], r["height"], r["width"], r["video_length"])
            targets = list(r["fits"])
            head = ["Layout", "Devices", "GPU GiB", "TPU GiB", *targets]
            out += ["" if out else None, f"**{r['preset']}, {r['height']}x{r['width']}, {r['video_length']} frames**"
                    " (train step, batch 1, GiB per device, modelled)", "", "| " + " | ".join(head) + " |",
                    "|" + "|".join(["---", "---:", "---:", "---:"] + [":---:"] * len(targets)) + "|"]
        cells = [r["layout"], str(r["devices"]), f"{r['gpu_gib']:.1f}", f"{r['tpu_gib']:.1f}",
                 *[r["fits"][t] for t in targets]]
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(line for line in out if line is not None) + "\n"

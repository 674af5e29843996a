"""Per-GPU memory of the torch GPU layouts (one GPU, Ulysses, FSDP, offload) for a preset and size, and which cards fit."""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass
from typing import Any, Sequence

from ..base.errors import HyvInputError
from ..base.presets import Preset
from ..models.families import get_preset
from ..models.registry import get_adapter
from ..runtimes.vae_memory import decode_peak_bytes
from .costs import as_preset, dtype_bytes, model_dims, param_bytes, parameter_shapes, step_batch, token_counts
from .hardware import GIB, check_count

# --------------------------------------------------------------------------------------------- live copies
# Counted from the code that runs (diffusers 0.42.1's HunyuanVideo15TransformerBlock with hyv_lib's JointAttnProcessor;
# hyv_lib.runtimes.ulysses; diffusers' tiled VAE decode) and checked on the CPU by the peak of live tensor bytes of the
# real classes at tiny widths (tests/test_gpu_memory.py), then against the H200 measurements in the same tests.

#: Video-stream tensors [b, N_v, h] alive at the peak of a block in the eager forward on one GPU, besides the MLP's
#: two [b, N_v, f] tensors (its up-projection and its GELU): the block's input, the attention output (still referenced),
#: the residual after attention and the modulated norm that feeds the MLP. The RoPE of q and k ties it: input, norm,
#: q, k, v and apply_rotary_emb's fp32 temporaries (x.float() x cos: 2 bf16-sized copies, the rotated copy: 1, its fp32
#: copy and x sin: 4) are 12 copies too, as many as 4 + 2 x mlp_ratio (4) are.
STEP_STREAM_COPIES = 4
#: Context-stream tensors [b, N_c, h] alive at that peak in a block: its input, attention output, residual and
#: modulated norm ...
BLOCK_CONTEXT_COPIES = 4
#: ... and in diffusers' forward around the blocks: the condition-type embeddings of the text, ByT5 and image tokens
#: and their sums (one context's worth each) and the per-sample valid-first list it stacks.
FORWARD_CONTEXT_COPIES = 3
#: Ulysses (:mod:`hyv_lib.runtimes.ulysses`): the local video tensors [b, N_v / N, h] a rank holds while q, k and v
#: go from sequence to head shards: the block's input, the modulated norm, q, k and v ...
ULYSSES_HELD_COPIES = 5
#: ... and the all-to-all's own buffers, 3 (q, k, v) each: stacked, the send buffer, the receive buffer and its
#: reordered copy.
ULYSSES_ALL_TO_ALL_COPIES = 12
#: The replicated context [b, N_c, h] each rank holds then: its input and its modulated norm.
ULYSSES_CONTEXT_COPIES = 2
#: ``--offload block``: blocks on the GPU at once, the one that runs and the next one, copied on a CUDA stream while
#: it runs (diffusers' group offloading with ``use_stream``); the parameters outside the blocks stay on the GPU.
OFFLOAD_RESIDENT_BLOCKS = 2
#: ``--shard_weights fsdp`` (FSDP2, :mod:`hyv_lib.runtimes.fsdp`): block-sized buffers beside the local shards while a
#: block runs: its gathered weights, and the next block's all-gather output (FSDP2 issues the next all-gather on its
#: own stream while a block computes). The root's own parameters (outside the blocks) are gathered for the whole
#: step. An estimate from FSDP2's design, not measured on GPUs.
FSDP_BLOCK_BUFFERS = 2
# ------------------------------------------------------------------------------------------------ overheads
#: What torch's allocator held on the H200 before each measured step besides the weights and the forward's inputs
#: (peak_allocated_gib - extra_gib - weights - inputs: 0.03 to 0.04 GiB in benchmarks/results/
#: gpu_check_2026-11-26_H200_run2.json and run3.json; cuBLAS's workspace is allocated there).
ALLOCATOR_WORKSPACE = 0.03 * GIB
#: The process's CUDA context, outside torch's allocator (driver, kernels, cuBLAS/cuDNN handles): counted against the
#: card but not in torch's peaks. Not measured here yet: an estimate.
CUDA_CONTEXT = 0.5 * GIB
#: Share of a card's memory left free by :func:`fits`: torch's caching allocator fragments (on the H200 its reserved
#: peak exceeded the allocated one by 21% at 480p and 33% at 720p; it frees its cache and retries before an
#: out-of-memory error, so the allocated peak is what must fit, with a margin). A stated margin, not a measurement.
HEADROOM = 0.10


@dataclass(frozen=True)
class Card:
    """A GPU memory size: the vendor's GB (10^9 bytes) and the bytes the card offers (its reported total)."""

    gb: int
    usable_bytes: int
    source: str


#: The card sizes the table checks, by the vendor's GB.
CARDS: dict[int, Card] = {
    24: Card(24, 24 * 10**9, "a 24 GB card (vendor's GB): 24 x 10^9 bytes, nothing subtracted (no reported total here)"),
    48: Card(48, 48 * 10**9, "a 48 GB card (vendor's GB): 48 x 10^9 bytes, nothing subtracted (no reported total here)"),
    80: Card(80, 81559 * 2**20, "NVIDIA H100 80GB: 81,559 MiB = 79.6 GiB, nvidia-smi's total on one H100 80GB HBM3"),
    141: Card(141, 143155 * 2**20, "NVIDIA H200 (141 GB): 143,155 MiB = 139.8 GiB, torch's total_memory in "
                                   "benchmarks/results/gpu_check_2026-11-26_H200_run2.json (nvidia-smi: 143,771 MiB)"),
}

WEIGHTS = ("replicated", "fsdp")
OFFLOADS = ("none", "block", "model")


# ------------------------------------------------------------------------------------------------ weights
def block_of(preset: Preset, name: str) -> str | None:
    """The block a parameter belongs to, as ``"<group prefix><index>"`` (``transformer_blocks.3``,
    ``single_transformer_blocks.0``), or None outside the blocks: every block group of the model adapter's
    :attr:`~hyv_lib.models.adapter.ModelAdapter.block_prefixes`."""
    for prefix in get_adapter(preset.model).block_prefixes:
        if name.startswith(prefix):
            return prefix + name[len(prefix):].split(".")[0]
    return None


def weight_layout(preset: Preset | str, dtype: str = "bf16") -> dict[str, int]:
    """The transformer's parameter bytes (exact, from a meta-device build): ``total`` (:func:`param_bytes`),
    ``blocks`` (the block stack: every block group, :func:`block_of`), ``block`` (the largest block), ``outside``
    (embedders, token refiner, head) and ``blocks_count``."""
    preset = as_preset(preset)
    x = dtype_bytes(dtype)
    per_block: dict[str, int] = {}
    for name, shape in parameter_shapes(preset):
        block = block_of(preset, name)
        if block is not None:
            per_block[block] = per_block.get(block, 0) + math.prod(shape) * x
    total = param_bytes(preset, dtype)["bytes_per_device"]
    blocks = sum(per_block.values())
    return dict(total=total, blocks=blocks, block=max(per_block.values(), default=0), outside=total - blocks,
                blocks_count=len(per_block))


def fsdp_shard_bytes(preset: Preset | str, gpus: int, dtype: str = "bf16", blocks_only: bool = False) -> int:
    """Bytes of one rank's FSDP2 shards: every parameter split along dim 0 over ``gpus`` ranks, padded to a multiple
    of it (``fully_shard``'s layout); ``blocks_only``: the block stack's parameters alone (every block group)."""
    preset = as_preset(preset)
    x = dtype_bytes(dtype)
    return sum(-(-shape[0] // gpus) * math.prod(shape[1:]) * x for name, shape in parameter_shapes(preset)
               if shape and (block_of(preset, name) is not None or not blocks_only))


# --------------------------------------------------------------------------------------------------- step
def check_layout(preset: Preset, gpus: int, weights: str, ulysses: bool, offload: str) -> None:
    """HyvInputError naming the argument for a layout the GPU runtimes do not run: ``gpus`` a positive int (Ulysses:
    dividing the heads), ``weights`` of :data:`WEIGHTS`, ``offload`` of :data:`OFFLOADS`; offloading runs on one
    process's whole model (not with Ulysses, not with FSDP: both refuse it, as the CLI does)."""
    check_count("gpus", gpus)
    if weights not in WEIGHTS:
        raise HyvInputError("weights", f"must be one of {', '.join(WEIGHTS)}, got {weights!r}")
    if offload not in OFFLOADS:
        raise HyvInputError("offload", f"must be one of {', '.join(OFFLOADS)}, got {offload!r}")
    if not isinstance(ulysses, bool):
        raise HyvInputError("ulysses", f"must be True or False, got {ulysses!r}")
    heads = model_dims(preset)["heads"]
    if ulysses and heads % gpus:
        valid = ", ".join(str(n) for n in range(1, heads + 1) if heads % n == 0)
        raise HyvInputError("gpus", f"Ulysses splits the {heads} heads over the GPUs: one of {valid}, got {gpus}")
    if offload != "none" and ulysses:
        raise HyvInputError("offload", f"{offload} moves one process's whole model on the torch runtime, not under "
                                       "Ulysses: use offload='none'")
    if offload != "none" and weights == "fsdp":
        raise HyvInputError("offload", f"{offload} is not combined with fsdp (both decide where the weights live)")


def step_inputs_bytes(preset: Preset, height: int, width: int, video_length: int, batch: int, x: int) -> int:
    """The forward's keyword tensors on the GPU: latents with their condition channels and mask, the timestep, text and
    ByT5 embeddings with their int64 masks, image embeddings (every rank holds them whole under Ulysses)."""
    d = model_dims(preset)
    _, _, t, h, w = preset.latent_shape(height, width, video_length)
    return batch * (d["in_channels"] * t * h * w * x + x + preset.text_len * (d["text_dim"] * x + 8)
                    + preset.byt5_len * (d["byt5_dim"] * x + 8) + preset.image_tokens * d["image_dim"] * x)


def step_memory(preset: Preset | str, height: int, width: int, video_length: int, gpus: int = 1,
                weights: str = "replicated", ulysses: bool = False, offload: str = "none", *,
                batch: int | None = None, dtype: str = "bf16") -> dict[str, Any]:
    """Peak GPU memory of one denoising step on each of ``gpus`` GPUs (torch runtime), in bytes: what torch's
    allocator peaks at (``allocated``) and that plus :data:`CUDA_CONTEXT` (``total``, what a card must hold).

    ``weights``: ``replicated`` (all on every GPU) or ``fsdp`` (FSDP2: 1/N shards, padded, + the root's parameters
    gathered for the step + :data:`FSDP_BLOCK_BUFFERS` blocks); ``ulysses``: the video tokens split over the GPUs
    (the context replicated); without it every GPU runs the whole sequence (``gpus`` > 1: FSDP over ranks that each
    compute the same step); ``offload``: ``block`` (the parameters outside the blocks + :data:`OFFLOAD_RESIDENT_BLOCKS`
    blocks on the GPU), ``model`` (the whole transformer during the step: it leaves only for the decode, see
    :func:`gpu_memory`) or ``none``. With b samples (:func:`step_batch`), N_v video and N_c context tokens, hidden h,
    MLP ratio r, x bytes per element, the parts:

    - ``weights``: on the GPU while a block runs (exact parameter bytes from the preset's config);
    - ``inputs``: the forward's keyword tensors and the fp32 RoPE tables (2 x N_v x head_dim x 4 bytes; a rank's rows
      under Ulysses);
    - ``activations``: the peak over the step's phases (``phases``; ``peak_phase`` names it): one GPU ``mlp`` =
      (:data:`STEP_STREAM_COPIES` + 2 r) b N_v h x + (:data:`BLOCK_CONTEXT_COPIES` + :data:`FORWARD_CONTEXT_COPIES`)
      b N_c h x; Ulysses
      ``all_to_all`` = (:data:`ULYSSES_HELD_COPIES` + :data:`ULYSSES_ALL_TO_ALL_COPIES`) b ceil(N_v / N) h x +
      :data:`ULYSSES_CONTEXT_COPIES` b N_c h x;
    - ``attention``: the attention call's own largest temporaries, inside the ``attention`` phase: the joint q, k, v
      and output over S = N_v + N_c tokens (a rank's heads under Ulysses), one sample's kernel output and log-sum-exp;
      no S x S tensor (hyv_lib's attention). Not added again: it is below the peak phase at every real size;
    - ``workspace``: :data:`ALLOCATOR_WORKSPACE`; ``context``: :data:`CUDA_CONTEXT`.
    """
    preset = as_preset(preset)
    check_layout(preset, gpus, weights, ulysses, offload)
    x = dtype_bytes(dtype)
    b = step_batch(preset, batch)
    d = model_dims(preset)
    tok = token_counts(preset, height, width, video_length)
    h, heads, hd, r = d["hidden"], d["heads"], d["head_dim"], d["mlp"] / d["hidden"]
    layout = weight_layout(preset, dtype)
    if weights == "fsdp":
        resident = fsdp_shard_bytes(preset, gpus, dtype, blocks_only=True) + layout["outside"] \
            + FSDP_BLOCK_BUFFERS * layout["block"]
    elif offload == "block":
        resident = layout["outside"] + min(OFFLOAD_RESIDENT_BLOCKS, layout["blocks_count"]) * layout["block"]
    else:
        resident = layout["total"]
    n = gpus if ulysses else 1
    local = -(-tok["video"] // n)  # video tokens per rank (the last shard padded)
    context = b * tok["context"] * h * x
    rope = 2 * local * hd * 4
    inputs = step_inputs_bytes(preset, height, width, video_length, b, x) + rope
    joint = local * n + tok["context"]  # the sequence attention runs over, per rank's heads
    attention = ((3 + 1) * b * joint * (h // n) * x + joint * (h // n) * x  # q, k, v, output; one sample's output
                 + (heads // n) * joint * 4)  # its log-sum-exp, fp32
    stream = b * local * h * x
    if ulysses:
        phases = dict(
            all_to_all=(ULYSSES_HELD_COPIES + ULYSSES_ALL_TO_ALL_COPIES) * stream + ULYSSES_CONTEXT_COPIES * context,
            mlp=(STEP_STREAM_COPIES + 2 * r) * stream + BLOCK_CONTEXT_COPIES * context,
            attention=ULYSSES_HELD_COPIES * stream + 3 * context + attention,
        )
    else:
        phases = dict(
            mlp=(STEP_STREAM_COPIES + 2 * r) * stream + (BLOCK_CONTEXT_COPIES + FORWARD_CONTEXT_COPIES) * context,
            attention=2 * stream + (2 + FORWARD_CONTEXT_COPIES) * context + attention,
        )
    peak_phase = max(phases, key=phases.get)
    parts = dict(weights=resident, inputs=inputs, activations=phases[peak_phase], workspace=ALLOCATOR_WORKSPACE)
    allocated = sum(parts.values())
    return dict(parts, attention=attention, phases=phases, peak_phase=peak_phase, allocated=allocated,
                context=CUDA_CONTEXT, total=allocated + CUDA_CONTEXT, tokens_per_gpu=local, batch=b,
                layout=dict(gpus=gpus, weights=weights, ulysses=ulysses, offload=offload))


# ---------------------------------------------------------------------------------------------------- VAE
@functools.lru_cache(maxsize=8)
def _meta_vae(vae_class: str, config_json: str):
    """The VAE (diffusers' class ``vae_class``) of a config on the meta device (shapes and parameter counts, no
    memory)."""
    import diffusers
    import torch

    with torch.device("meta"):
        return getattr(diffusers, vae_class)(**json.loads(config_json))


def vae_decode_memory(preset: Preset | str, height: int, width: int, video_length: int, gpus: int = 1, *,
                      vae_dtype: str = "bf16") -> dict[str, Any]:
    """Peak GPU memory of the tiled VAE decode (stage 3, diffusers' 256 px spatial tiles, each spanning every frame)
    on each of ``gpus`` GPUs (tiles spread round-robin), in bytes: the terms of
    :func:`hyv_lib.runtimes.vae_memory.decode_peak_bytes` (the model ``--vae_memory_gb`` sizes tiles by), its
    ``allocated`` total, and ``total`` = allocated + :data:`CUDA_CONTEXT`."""
    import torch

    preset = as_preset(preset)
    check_count("gpus", gpus)
    if vae_dtype not in ("bf16", "fp32"):
        raise HyvInputError("vae_dtype", f"must be bf16 or fp32, got {vae_dtype!r}")
    vae = _meta_vae(get_adapter(preset.model).vae_class, json.dumps(preset.vae, sort_keys=True))
    terms = decode_peak_bytes(vae, preset.latent_shape(height, width, video_length), vae.tile_sample_min_height,
                              torch.bfloat16 if vae_dtype == "bf16" else torch.float32, ranks=gpus)
    allocated = terms.pop("total")
    return dict(terms, allocated=allocated, context=CUDA_CONTEXT, total=allocated + CUDA_CONTEXT)


# ------------------------------------------------------------------------------------------------ together
def gpu_memory(preset: Preset | str, height: int, width: int, video_length: int, gpus: int = 1,
               weights: str = "replicated", ulysses: bool = False, offload: str = "none", *,
               batch: int | None = None, dtype: str = "bf16", vae_dtype: str = "bf16") -> dict[str, Any]:
    """Per-GPU peaks of a whole generation (GiB), stage 1's encoders excluded (they run before stage 2 and leave the
    GPU, one at a time; an in-memory pipeline without offload keeps them there: add their weights, 13.2 GiB for
    Qwen2.5-VL-7B's language model in bf16):

    - ``step``: one denoising step (:func:`step_memory`);
    - ``decode``: the VAE decode as stage 3 runs it, in its own process (:func:`vae_decode_memory`);
    - ``pipeline_decode``: the decode in the same process as the denoising (``generate``, ``load_pipeline``): the
      transformer's weights stay on the GPU meanwhile unless offloaded (``model`` moves it to the host first,
      ``block`` keeps it there; FSDP's shards stay);
    - ``staged`` = max(step, decode) (the three-stage CLI) and ``pipeline`` = max(step, pipeline_decode).

    Each value is a ``total`` (with :data:`CUDA_CONTEXT`); ``parts`` holds the step's and the decode's breakdowns.
    """
    preset = as_preset(preset)
    step = step_memory(preset, height, width, video_length, gpus, weights, ulysses, offload, batch=batch, dtype=dtype)
    vae = vae_decode_memory(preset, height, width, video_length, gpus if ulysses or weights == "fsdp" else 1,
                            vae_dtype=vae_dtype)
    layout = weight_layout(preset, dtype)
    left = (0 if offload in ("model", "block") else fsdp_shard_bytes(preset, gpus, dtype) if weights == "fsdp"
            else layout["total"])
    out = dict(step=step["total"], decode=vae["total"], pipeline_decode=vae["total"] + left)
    out["staged"] = max(out["step"], out["decode"])
    out["pipeline"] = max(out["step"], out["pipeline_decode"])
    gib = {k: v / GIB for k, v in out.items()}
    return dict(gib, bytes=out, parts=dict(step=step, decode=vae), layout=step["layout"])


def check_card(gb: int) -> Card:
    """The :data:`CARDS` entry of ``gb`` (HyvInputError naming ``cards_gb`` otherwise)."""
    if gb not in CARDS:
        raise HyvInputError("cards_gb", f"card sizes known: {', '.join(map(str, CARDS))} (GB), got {gb!r}")
    return CARDS[gb]


def fits(total_bytes: float, gb: int, headroom: float = HEADROOM) -> bool:
    """Whether ``total_bytes`` (a peak with the CUDA context) fits a ``gb`` card with ``headroom`` of it left free."""
    if not isinstance(headroom, (int, float)) or isinstance(headroom, bool) or not 0 <= headroom < 1:
        raise HyvInputError("headroom", f"must be a fraction in [0, 1), got {headroom!r}")
    return total_bytes <= (1 - headroom) * check_card(gb).usable_bytes


#: The layouts :func:`gpu_memory_table` lists on N > 1 GPUs: (weights, ulysses). Replicated weights without Ulysses
#: would run the same whole job on every GPU: per GPU, the one-GPU row.
MULTI_GPU_LAYOUTS = (("replicated", True), ("fsdp", True), ("fsdp", False))


def layout_name(gpus: int, weights: str, ulysses: bool, offload: str) -> str:
    """A layout as the table prints it: 'one GPU', 'one GPU, offload block', 'Ulysses', 'Ulysses + fsdp', 'fsdp (no
    Ulysses)' (every GPU runs the whole sequence on its shards)."""
    if gpus == 1 and not ulysses and weights == "replicated":
        return "one GPU" if offload == "none" else f"one GPU, offload {offload}"
    if ulysses:
        return "Ulysses" if weights == "replicated" else "Ulysses + fsdp"
    return f"{weights} (no Ulysses)"


def gpu_memory_table(presets: Sequence[str] = ("480p_t2v", "720p_t2v"),
                     sizes: Sequence[tuple[int, int, int]] | None = None, gpus: Sequence[int] = (1, 2, 4, 8),
                     cards_gb: Sequence[int] = (24, 48, 80, 141), headroom: float = HEADROOM, *,
                     dtype: str = "bf16", vae_dtype: str = "bf16") -> list[dict[str, Any]]:
    """One row per preset, size ((height, width, frames); default each preset's 16:9 size at its default length) and
    layout: one GPU with offload none / model / block, and each of :data:`MULTI_GPU_LAYOUTS` on every N > 1 of
    ``gpus``. Each row has the layout, the peaks of :func:`gpu_memory` (GiB) and ``fits``: card GB -> ``"yes"`` (the
    in-memory pipeline fits with ``headroom`` left), ``"staged"`` (only the three-stage CLI, stage 3 in its own
    process, fits) or ``"no"``."""
    for gb in cards_gb:
        check_card(gb)
    rows = []
    for name in presets:
        preset = get_preset(name)
        for height, width, frames in sizes or [(preset.default_height, preset.default_width,
                                               preset.default_video_length)]:
            layouts = [(1, "replicated", False, o) for o in OFFLOADS if 1 in gpus]
            layouts += [(n, w, u, "none") for w, u in MULTI_GPU_LAYOUTS for n in gpus if n > 1]
            for n, w, u, o in layouts:
                m = gpu_memory(preset, height, width, frames, n, w, u, o, dtype=dtype, vae_dtype=vae_dtype)
                fit = {gb: "yes" if fits(m["bytes"]["pipeline"], gb, headroom)
                       else "staged" if fits(m["bytes"]["staged"], gb, headroom) else "no" for gb in cards_gb}
                rows.append(dict(preset=name, height=height, width=width, frames=frames, gpus=n, weights=w, ulysses=u,
                                 offload=o, layout=layout_name(n, w, u, o), step_gib=m["step"], decode_gib=m["decode"],
                                 pipeline_gib=m["pipeline"], staged_gib=m["staged"],
                                 peak_phase=m["parts"]["step"]["peak_phase"], fits=fit))
    return rows


def gpu_memory_markdown(rows: Sequence[dict[str, Any]]) -> str:
    """Markdown of :func:`gpu_memory_table` rows: for each preset and size a caption line and a table of the layouts,
    GPUs, the modelled per-GPU peaks (GiB: the step, stage 3's decode alone, the in-memory pipeline) and a column per
    card size (yes / staged / no)."""
    out, group = [], None
    for r in rows:
        if (r["preset"], r["height"], r["width"], r["frames"]) != group:
            group = (r["preset"], r["height"], r["width"], r["frames"])
            cards = list(r["fits"])
            head = ["Layout", "GPUs", "Step", "Decode", "Pipeline", *[f"{gb} GB" for gb in cards]]
            out += ["" if out else None, f"**{r['preset']}, {r['height']}x{r['width']}, {r['frames']} frames** "
                    "(GiB per GPU, modelled)", "", "| " + " | ".join(head) + " |",
                    "|" + "|".join(["---", "---:"] + ["---:"] * 3 + [":---:"] * len(cards)) + "|"]
        cells = [r["layout"], str(r["gpus"]), f"{r['step_gib']:.1f}", f"{r['decode_gib']:.1f}",
                 f"{r['pipeline_gib']:.1f}", *[r["fits"][gb] for gb in cards]]
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(line for line in out if line is not None) + "\n"

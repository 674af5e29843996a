"""One command on one GPU: the real-size evidence for hyv_lib's GPU claims, as one JSON file and a markdown table.

    python benchmarks/gpu_check.py [--output FILE] [--budget_s 420] [--sections attention,step,cache,offload,vae,train]
    python benchmarks/gpu_check.py --tiny      # the same code on the CPU in seconds (the test suite runs it)

Sections, each catching and recording its own failure so one broken backend does not lose the rest:

- ``environment``: torch/CUDA/GPU, hyv_lib's ``available_backends()``, and the card's measured ceilings (a bf16
  matrix product's TFLOP/s and a device-to-device copy's GB/s).
- ``attention``: the real 720p/121f joint attention (CFG batch 2, 16 heads x 128, 111,600 video + 1,985 context
  tokens, context padded as a real prompt pads it) through every backend that runs here and through diffusers' own
  dense-mask path: ms, TFLOP/s of useful work, peak memory, max error against an fp32 reference on a slice of queries.
- ``step``: one denoising step (CFG batch 2) of the full 54-block DiT with random bf16 weights at 480p and 720p,
  121 frames: hyv_lib's torch runtime against diffusers' stock forward on the same weights and inputs (s/step, peak
  memory, MFU by :func:`hyv_lib.planning.costs.step_flops`, the ratio and the output difference).
- ``cache``: a full step that records the DeepCache features and a cached step that reuses them (the work of every
  step DeepCache or MagCache skips), and what that makes of 50 steps under DeepCache's default schedule.
- ``offload``: ``--offload model`` (the transformer's trips between host and GPU, and what stays allocated), then the
  step with ``--offload block`` (:func:`hyv_lib.runtimes.placement.offload_blocks`: diffusers' block-level group
  offloading, weights on the host, one block on the GPU at a time, a CUDA stream): peak memory and s/step.
- ``vae``: the VAE decode of 720p/121f latents, random bf16 weights, at several tile sizes: s and peak memory beside
  :func:`hyv_lib.runtimes.vae_memory.decode_peak_bytes`'s model, and the tiles ``--vae_memory_gb`` picks for a few
  budgets with whether the measured peak stayed within them.
- ``distributed``: ``torchrun --nproc_per_node 1 -m hyv_lib stage2`` with Ulysses, Ulysses + ``--shard_weights fsdp``
  and torch + fsdp on the tiny model (nccl on the GPU), against the same stage 2 in one process.
- ``train``: fine-tuning steps of the full 54-block DiT (random bf16 weights, hyv_lib's SDPA attention) through
  :class:`hyv_lib.runtimes.torch_train.TorchTrainStep` (flow-matching loss, backward, clipping, AdamW): one full
  fine-tune at 480p/33 frames, then a rank-16 LoRA (:func:`hyv_lib.models.lora.add_lora`) at 480p and 720p, 33 to 121
  frames, with gradient checkpointing (and once without), cheapest first: s/step, peak memory and
  :func:`hyv_lib.planning.train_memory.train_step_memory`'s model of it; an out-of-memory row says ``oom``.
- ``ssta``: SSTA sparse attention (``benchmarks/gpu_ssta.py``) against the dense default on the same inputs and
  weights: the 720p/121f and 480p/121f joint attention (ms, tile density, the mask's own time, error against a float32
  reference on a slice of query tiles) and the full step (CFG batch, and the distilled sparse preset's batch of one).
- ``ssta_backward``: SSTA's gradients (FlexAttention's compiled backward on CUDA, hyv_lib's tile backward on the CPU)
  against autograd through the float32 reference, per attention call and through the tiny DiT.
- ``cogvideox``: the second model (``benchmarks/gpu_cogvideox.py``): the tiny CogVideoX with hyv_lib's attention on the
  GPU against diffusers' fp32 forward on the CPU, then one CFG step of CogVideoX1.5-5B (random bf16 weights) at
  768x1360 and 720x1280, 81 frames: diffusers' stock forward against hyv_lib's attention, eager and with its blocks
  compiled (``make_step(..., compile=True)``; target >= 1.15x diffusers).
- ``hunyuanvideo``: the third model (``benchmarks/gpu_hunyuanvideo.py``, the same rows by ``benchmarks/gpu_model_step.py``):
  the tiny HunyuanVideo against diffusers' fp32 forward, then one step of the 13B DiT (guidance embedded: one sample,
  no CFG pair; random bf16 weights) at 544x960 and 720x1280, 129 frames: diffusers' stock forward against hyv_lib's
  attention, eager and compiled.
- ``compiled``: the step of the ``step`` section with hyv_lib's blocks compiled (``make_step(model, "torch",
  attention="auto", compile=True)``: regional torch.compile, attention as one custom op) on a model rebuilt with the
  same seeded weights: the first call (compile + run) apart from the steady s/step, the ratios to the step section's
  eager hyv_lib and diffusers rows of the same run, and the compiled output's difference to the eager one (target at
  480p/121f: <= 4.6 s and >= 3.8x diffusers' stock forward).
- ``e2e``: the whole video on one GPU (``benchmarks/gpu_e2e.py``) at 480x832x121 and 720x1280x121, hyv_lib against
  diffusers' ``HunyuanVideo15Pipeline`` on the same random weights: text encoding (real-size Qwen2.5-VL-7B and ByT5
  stand-ins), N CFG steps (hyv_lib compiled against the pipeline's loop) and the VAE decode, each timed, and the
  50-step video measured where the budget allows, else projected (target: 480p <= 240 s).

The ``environment`` section and the attention section's ``sdpa`` row record which kernel torch's SDPA dispatches to
(cuDNN, flash, efficient or math): torch's own choice for the shapes, and the SDPA operators a profiled call ran.

Everything is written after every section (``--output``, default ``benchmarks/results/gpu_check.json``, and the markdown
table next to it), so a run stopped at its time limit keeps what it measured. Rows that would not fit the remaining
``--budget_s`` are recorded as skipped. It needs PyTorch >= 2.10, transformers and the pure-Python wheels of
``requirements-gpu-check.txt`` (diffusers and what it imports); torchax and JAX are not imported.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import inspect
import json
import math
import os
import platform
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hyv_lib.base.memory import LargestTensor  # noqa: E402
from hyv_lib.models.families import get_preset  # noqa: E402
from hyv_lib.kernels.dispatch import (  # noqa: E402
    attention,
    available_backends,
    kernel_record,
    resolve_backend,
    sdpa_kernel,
)
from hyv_lib.kernels.registry import BACKENDS  # noqa: E402
from hyv_lib.models.hunyuan_video15.layout import context_tokens, video_tokens  # noqa: E402
from hyv_lib.models.registry import get_adapter  # noqa: E402
from hyv_lib.planning.costs import step_flops  # noqa: E402
from hyv_lib.planning.hardware import CHIPS, mfu  # noqa: E402
from hyv_lib.runtimes.deepcache import DeepCacheSchedule, TorchDeepCache  # noqa: E402
from hyv_lib.models.devices import placed  # noqa: E402
from hyv_lib.runtimes.placement import offload_blocks  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_cogvideox import cogvideox_section  # noqa: E402
from gpu_e2e import compiled_graphs, e2e_section  # noqa: E402
from gpu_hunyuanvideo import hunyuanvideo_section  # noqa: E402
from gpu_ssta import backward_section, ssta_section  # noqa: E402

GIB = 2**30
#: The backends the attention section tries, in this order, besides diffusers' dense-mask path.
ATTENTION_BACKENDS = ("flash3", "flash", "torch_varlen", "sdpa", "sage")
#: Valid context tokens per CFG sample: a 160-token prompt with a 12-token quoted text (ByT5), and a 31-token
#: negative prompt; text-to-video has no image tokens. The rest of the 1,985 context tokens are padding.
VALID_CONTEXT = ((160, 12), (31, 0))


# ------------------------------------------------------------------------------------------ sizes
def sizes(tiny: bool) -> dict[str, Any]:
    """The presets and video sizes of each section: the real ones, or the tiny twins ``--tiny`` runs on the CPU."""
    if tiny:
        # "large" has enough tokens (240 video + 170 context) that S x S outgrows every other tensor of the tiny model
        return dict(preset="tiny", attention=(128, 160, 9), steps={"small": (32, 48, 9), "large": (128, 160, 9)},
                    vae=(64, 96, 9), vae_tiles=(64,), vae_budgets=(0.037,), repeats=1,
                    train=[("full", "small", (64, 96, 9), True), ("lora", "small", (128, 224, 9), True),
                           ("lora", "small", (128, 224, 9), False)])
    p480, p720 = (480, 848), (720, 1280)
    return dict(preset="720p_t2v", attention=(720, 1280, 121),
                steps={"480p": (480, 848, 121), "720p": (720, 1280, 121)}, vae=(720, 1280, 121),
                vae_tiles=(128, 192, 256, 384), vae_budgets=(8, 12, 24), repeats=3,
                # (what trains, size name, (height, width, frames), remat): the full fine-tune first (before the
                # LoRA is attached), then the LoRA rows by their expected time
                train=[("full", "480p", (*p480, 33), True), ("lora", "480p", (*p480, 33), True),
                       ("lora", "480p", (*p480, 33), False), ("lora", "480p", (*p480, 61), True),
                       ("lora", "720p", (*p720, 33), True), ("lora", "480p", (*p480, 121), True),
                       ("lora", "720p", (*p720, 61), True), ("lora", "720p", (*p720, 121), True)])


# ------------------------------------------------------------------------------------------ measuring
class Clock:
    """Wall-clock seconds of a call, synchronising CUDA around it."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def time(self, fn: Callable[[], Any], repeats: int = 1) -> tuple[float, Any]:
        """Mean seconds over ``repeats`` calls (after the caller's warm-up) and the last result."""
        self.sync()
        start = time.perf_counter()
        for _ in range(repeats):
            out = fn()
        self.sync()
        return (time.perf_counter() - start) / repeats, out


@contextlib.contextmanager
def gpu_memory(device: torch.device, into: dict[str, Any]):
    """Peak GPU memory of the block: allocated and reserved peaks (GiB) and the growth over what was allocated
    before it (``extra_gib``); nothing on the CPU (RSS is what generation_config.json records there)."""
    if device.type != "cuda":
        yield
        return
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    try:
        yield
    finally:
        torch.cuda.synchronize()
        into.update(peak_allocated_gib=round(torch.cuda.max_memory_allocated() / GIB, 2),
                    peak_reserved_gib=round(torch.cuda.max_memory_reserved() / GIB, 2),
                    extra_gib=round((torch.cuda.max_memory_allocated() - before) / GIB, 2))


def largest_tensor(fn: Callable[[], Any]) -> int:
    """Most elements of any tensor one call of ``fn`` creates (an untimed pass: the probe slows every op)."""
    with LargestTensor() as probe:
        fn()
    return probe.elements


#: torch's SDPA operators (the profiler's names without ``aten::``) and the kernel each one is.
SDPA_OPS = {"_scaled_dot_product_cudnn_attention": "cudnn", "_scaled_dot_product_flash_attention": "flash",
            "_scaled_dot_product_flash_attention_for_cpu": "flash (cpu)",
            "_scaled_dot_product_efficient_attention": "efficient", "_scaled_dot_product_attention_math": "math",
            "_scaled_dot_product_fused_attention_overrideable": "overrideable"}


def sdpa_dispatch(fn: Callable[[], Any], device: torch.device) -> dict[str, Any]:
    """Which SDPA kernels one profiled call of ``fn`` ran: ``sdpa_ops`` (kernel -> calls, from torch's operator
    names) and on CUDA the names of the attention kernels launched (``cuda_kernels``, at most 4)."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
    ops: dict[str, int] = {}
    kernels: set[str] = set()
    for event in prof.events():
        kind = SDPA_OPS.get(event.name.removeprefix("aten::"))
        if kind:
            ops[kind] = ops.get(kind, 0) + 1
        if event.device_type == torch.autograd.DeviceType.CUDA and any(
                word in event.name.lower() for word in ("fmha", "flash", "cudnn", "attention", "sdpa")):
            kernels.add(event.name[:120])
    out: dict[str, Any] = dict(sdpa_ops=ops)
    if device.type == "cuda":
        out["cuda_kernels"] = sorted(kernels)[:4]
    return out


class Budget:
    """The seconds left of ``--budget_s``; a row that needs more is skipped and says so."""

    def __init__(self, seconds: float):
        self.deadline = time.monotonic() + seconds

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def allows(self, need_s: float) -> bool:
        return self.left() >= need_s


def free_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# ------------------------------------------------------------------------------------------ the report
class Report:
    """The JSON report, written (with its markdown table) after every section."""

    def __init__(self, path: Path, tiny: bool, argv: list[str]):
        self.path = path
        self.data: dict[str, Any] = dict(
            check="hyv_lib gpu_check", tiny=tiny, command=" ".join(["python benchmarks/gpu_check.py", *argv]),
            started=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), sections={})

    def section(self, name: str) -> dict[str, Any]:
        return self.data["sections"].setdefault(name, dict(status="running", rows=[]))

    def write(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        for target, text in ((self.path, json.dumps(self.data, indent=1, default=str) + "\n"),
                             (self.path.with_suffix(".md"), markdown(self.data))):
            tmp = target.with_name(f".{target.name}.partial")
            tmp.write_text(text)
            os.replace(tmp, target)


def run_section(report: Report, name: str, fn: Callable[[dict[str, Any]], None]) -> None:
    """Run one section; an exception is recorded in it (type, message, last frames) and the check goes on."""
    section = report.section(name)
    start = time.perf_counter()
    try:
        fn(section)
        section["status"] = "ok"
    except Exception as err:  # noqa: BLE001 - recorded, the next section still runs
        section.update(status="failed", error=f"{type(err).__name__}: {err}"[:2000],
                       traceback=traceback.format_exc(limit=6)[-3000:])
        print(f"[{name}] failed: {type(err).__name__}: {err}"[:500], flush=True)
    finally:
        section["seconds"] = round(time.perf_counter() - start, 1)
        free_memory()
        report.write()


def row_failure(row: dict[str, Any], err: BaseException) -> None:
    row.update(status="failed", error=f"{type(err).__name__}: {err}"[:1000])
    print(f"  {row.get('name', '')}: failed: {type(err).__name__}: {str(err)[:300]}", flush=True)


# ------------------------------------------------------------------------------------------ environment
def environment(section: dict[str, Any], device: torch.device, clock: Clock, tiny: bool) -> None:
    import diffusers
    import transformers

    info = dict(python=platform.python_version(), torch=torch.__version__, cuda=torch.version.cuda,
                diffusers=diffusers.__version__, transformers=transformers.__version__, device=str(device),
                backends={name: reason or "available" for name, reason in available_backends().items()})
    try:  # torch_varlen skips packing where varlen_attn takes seqused_k (torch >= 2.12)
        from hyv_lib.kernels.torch_kernels import torch_varlen_kernel

        info["torch_varlen_layout"] = ("seqused_k (no packing)" if "seqused_k" in
                                       inspect.signature(torch_varlen_kernel()).parameters else "packed cu_seqlens")
    except ImportError as err:
        info["torch_varlen_layout"] = f"absent: {err}"
    try:  # what SDPA runs for the DiT's heads (128 wide, bf16): torch's own choice, and auto's record
        info["sdpa_kernel_bf16_d128"] = sdpa_kernel(device, torch.bfloat16, 128, heads=16)
        info["attention_auto"] = kernel_record("auto", device, torch.bfloat16, 128)
    except Exception as err:  # noqa: BLE001 - a record, not a measurement
        info["sdpa_kernel_bf16_d128"] = f"unknown: {type(err).__name__}: {err}"[:300]
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(gpu=props.name, capability=".".join(map(str, torch.cuda.get_device_capability(device))),
                    memory_mib=props.total_memory // 2**20, multiprocessors=props.multi_processor_count)
    n = 256 if tiny else 8192
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    clock.time(lambda: a @ a)
    seconds, _ = clock.time(lambda: a @ a, 3 if tiny else 10)
    info["matmul_bf16_tflops"] = round(2 * n**3 / seconds / 1e12, 1)
    x = torch.empty(2**24 if tiny else 2**31, dtype=torch.uint8, device=device)
    y = torch.empty_like(x)
    clock.time(lambda: y.copy_(x))
    seconds, _ = clock.time(lambda: y.copy_(x), 3 if tiny else 10)
    info["copy_gb_s"] = round(2 * x.numel() / seconds / 1e9, 1)  # bytes read + written
    section.update(info)
    print(json.dumps(info, indent=1), flush=True)


# ------------------------------------------------------------------------------------------ attention
def joint_mask(preset, height: int, width: int, frames: int, device: torch.device) -> tuple[torch.Tensor, int]:
    """[2, S] key mask of the CFG batch in hyv_lib's valid-first layout (video tokens, then valid context first)."""
    nv, nc = video_tokens(preset, height, width, frames), context_tokens(preset)
    valid = [min(text, preset.text_len) + min(byt5, preset.byt5_len) for text, byt5 in VALID_CONTEXT]
    mask = torch.zeros(2, nv + nc, dtype=torch.bool, device=device)
    for b, n in enumerate(valid):
        mask[b, : nv + n] = True
    return mask, nv


def dense_mask_attention(q, k, v, kv_mask) -> torch.Tensor:
    """diffusers' HunyuanVideo-1.5 processor: a [B, 1, S, S] boolean mask (m_i & m_j, built by repeat and
    transpose as it does) handed to SDPA."""
    b, s = kv_mask.shape
    rows = kv_mask.view(b, 1, 1, s).repeat(1, 1, s, 1)
    mask = rows & rows.transpose(2, 3)
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def attention_section(section, device, clock, budget, cfg, tiny) -> None:
    preset = get_preset(cfg["preset"])
    height, width, frames = cfg["attention"]
    heads, head_dim = preset.transformer["num_attention_heads"], preset.transformer["attention_head_dim"]
    mask, nv = joint_mask(preset, height, width, frames, device)
    b, s = mask.shape
    g = torch.Generator(device=device).manual_seed(0)
    q, k, v = (torch.randn(b, heads, s, head_dim, generator=g, device=device, dtype=torch.bfloat16)
               for _ in range(3))
    lengths = mask.sum(1).tolist()
    useful = sum(4 * heads * n * n * head_dim for n in lengths)
    # The fp32 reference on a slice of valid queries: spread over the video and the valid context of each sample.
    rows = torch.unique(torch.cat([torch.linspace(0, nv - 1, 48 if not tiny else 8).long(),
                                   torch.arange(nv, min(lengths), max(1, (min(lengths) - nv) // 8))])).to(device)
    scale = head_dim**-0.5
    scores = torch.einsum("bhqd,bhkd->bhqk", q[:, :, rows].float(), k.float()) * scale
    scores = scores.masked_fill(~mask[:, None, None, :], float("-inf"))
    expected = torch.einsum("bhqk,bhkd->bhqd", torch.softmax(scores, -1), v.float())
    del scores
    section.update(shape=dict(batch=b, heads=heads, head_dim=head_dim, tokens=s, video_tokens=nv,
                              valid_tokens=lengths, dtype="bf16"),
                   useful_gflop=round(useful / 1e9, 1), reference_rows=len(rows))
    available = available_backends()
    candidates = [(name, f"hyv_lib attention(backend={name!r})") for name in ATTENTION_BACKENDS]
    candidates.append(("diffusers_dense", "diffusers' dense [B,1,S,S] bool mask + SDPA"))
    repeats = cfg["repeats"]
    for name, what in candidates:
        row: dict[str, Any] = dict(name=name, what=what)
        section["rows"].append(row)
        if name in BACKENDS and available[name] is not None:
            row.update(status="skipped", reason=available[name])
            continue
        if name in BACKENDS and BACKENDS[name].takes(device, torch.bfloat16) is not None:
            row.update(status="skipped", reason=BACKENDS[name].takes(device, torch.bfloat16))
            continue
        if not budget.allows(20 if not tiny else 1):
            row.update(status="skipped", reason="time budget")
            continue
        fn = ((lambda: dense_mask_attention(q, k, v, mask)) if name == "diffusers_dense"
              else (lambda name=name: attention(q, k, v, mask, backend=name)))
        try:
            if name == "diffusers_dense":
                row["mask_gib"] = round(b * s * s / GIB, 2)
            with gpu_memory(device, row):
                fn()  # warm-up
                seconds, out = clock.time(fn, repeats)
            got = out[:, :, rows].float()
            row.update(status="ok", ms=round(seconds * 1e3, 2), tflops=round(useful / seconds / 1e12, 1),
                       max_error=float((got - expected).abs().max()),
                       exact=BACKENDS[name].exact if name in BACKENDS else True)
            if name != "diffusers_dense":  # hyv_lib's kernels never build an S x S tensor
                row["largest_tensor_elements"] = largest_tensor(fn)
            if name in ("sdpa", "diffusers_dense"):  # which of torch's SDPA kernels these shapes get
                row.update(sdpa_dispatch(fn, device))
            del out
        except Exception as err:  # noqa: BLE001
            row_failure(row, err)
        free_memory()
        print(f"  attention {name}: {row.get('ms', row.get('reason', row.get('error')))}", flush=True)
    section["s_squared"] = s * s


# ------------------------------------------------------------------------------------------ model
def init_weights(module: torch.nn.Module, seed: int = 0) -> None:
    """Random weights under which every block and every attention moves the output: matrices N(0, 1/fan_in) (unit
    gain, so AdaLN's gates are O(1)), norm scales 1, biases 0. The checkpoints are not here; the timings do not
    depend on the values, and the output comparison needs attention to matter."""
    g = torch.Generator(device=next(module.parameters()).device).manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if p.ndim >= 2:
                p.normal_(0.0, p[0].numel() ** -0.5, generator=g)
            elif "norm" in name and name.endswith("weight"):
                p.fill_(1.0)
            else:
                p.zero_()
        for buffer in module.buffers():
            if not torch.isfinite(buffer).all():
                buffer.zero_()


def build_transformer(preset, device: torch.device) -> torch.nn.Module:
    """The DiT of ``preset`` on ``device`` in bf16 with random weights (built on meta, allocated once in bf16)."""
    with torch.device("meta"):
        model = get_adapter(preset.model).build(preset.transformer).to(torch.bfloat16)
    model = model.to_empty(device=device).eval().requires_grad_(False)
    init_weights(model)
    STOCK_PROCESSORS[id(model)] = {name: m.processor for name, m in model.named_modules() if hasattr(m, "processor")}
    return model


#: diffusers' own attention processors of each built model, by id (restored for the stock-forward rows).
STOCK_PROCESSORS: dict[int, dict[str, Any]] = {}
#: The step section's outputs (float32, on the CPU) by (which, size), and under "weights" the fingerprint of the
#: weights that made them: the compiled section compares its compiled step with them.
STEP_OUTPUTS: dict[Any, Any] = {}


def weights_fingerprint(model: torch.nn.Module) -> float:
    """The sum of every weight in float64: equal for two builds with the same seeded weights on the same device."""
    with torch.no_grad():
        return float(sum(p.double().sum() for p in model.parameters()))


def step_inputs(preset, height: int, width: int, frames: int, device: torch.device) -> dict[str, torch.Tensor]:
    """A CFG batch of forward keyword arguments with realistic padding (:data:`VALID_CONTEXT`), random values."""
    adapter = get_adapter(preset.model)
    kwargs = adapter.example_inputs(preset, height, width, frames, batch=2)
    g = torch.Generator().manual_seed(1)
    for key in ("hidden_states", "encoder_hidden_states", "encoder_hidden_states_2"):
        kwargs[key] = torch.randn(kwargs[key].shape, generator=g).to(kwargs[key].dtype)
    kwargs["timestep"] = kwargs["timestep"].to(torch.bfloat16)  # as diffusers' pipeline passes it (latents' dtype)
    for b, (text, byt5) in enumerate(VALID_CONTEXT):
        kwargs["encoder_attention_mask"][b] = (torch.arange(preset.text_len) < text).long()
        kwargs["encoder_attention_mask_2"][b] = (torch.arange(preset.byt5_len) < byt5).long()
    return {k: v.to(device) for k, v in kwargs.items()}


def use_processors(model, which: str) -> None:
    """``diffusers``: the model's stock processors (as built); anything else: hyv_lib's, with that backend."""
    if which != "diffusers":
        get_adapter("hunyuanvideo-1.5").use_attention(model, which)
        return
    stock = STOCK_PROCESSORS[id(model)]
    for name, module in model.named_modules():
        if name in stock:
            module.set_processor(stock[name])


def chip_key(device: torch.device) -> str | None:
    """The planner's chip for this GPU (MFU's peak), or None."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((key for key in ("H200", "H100") if key in name), None)


def step_section(section, device, clock, budget, cfg, tiny, model) -> None:
    preset = get_preset(cfg["preset"])
    chip = chip_key(device)
    section["mfu_peak"] = CHIPS[chip].source if chip else "no planner chip for this device: MFU left out"
    outputs: dict[tuple[str, str], torch.Tensor] = {}
    for size, (height, width, frames) in cfg["steps"].items():
        kwargs = step_inputs(preset, height, width, frames, device)
        flops = step_flops(preset, height, width, frames, batch=2)["total"]
        need = {"480p": 25, "720p": 60}.get(size, 1)
        for which in ("hyv_lib", "diffusers"):
            row: dict[str, Any] = dict(name=f"{which} {size}", size=[height, width, frames],
                                       attention="diffusers stock (dense mask)" if which == "diffusers" else "auto")
            section["rows"].append(row)
            if not budget.allows(need):
                row.update(status="skipped", reason="time budget")
                continue
            try:
                use_processors(model, "diffusers" if which == "diffusers" else "auto")
                if which == "hyv_lib":
                    row["backend"] = resolve_backend("auto", device, torch.bfloat16)

                def fn():
                    return model(**kwargs, return_dict=False)[0]

                with torch.no_grad(), gpu_memory(device, row):
                    fn()  # warm-up
                    repeats = 2 if (size == "480p" or tiny) else 1
                    seconds, out = clock.time(fn, repeats)
                row.update(status="ok", s_per_step=round(seconds, 3), tflop=round(flops / 1e12, 1))
                if chip:
                    row["mfu"] = round(mfu(flops, seconds, chip, 1), 3)
                row["finite"] = bool(torch.isfinite(out).all())
                outputs[(which, size)] = out.float().cpu()
                if tiny:  # the probe slows every op: tiny runs only
                    with torch.no_grad():
                        row["largest_tensor_elements"] = largest_tensor(fn)
                    row["s_squared"] = (video_tokens(preset, height, width, frames) + context_tokens(preset)) ** 2
                del out
            except Exception as err:  # noqa: BLE001
                row_failure(row, err)
            free_memory()
            print(f"  step {row['name']}: {row.get('s_per_step', row.get('reason', row.get('error')))}", flush=True)
        mine, theirs = outputs.get(("hyv_lib", size)), outputs.get(("diffusers", size))
        if mine is not None and theirs is not None:
            diff = (mine - theirs).abs()
            valid = theirs.abs().max()
            section.setdefault("compare", {})[size] = dict(
                speedup=round(next(r for r in section["rows"] if r["name"] == f"diffusers {size}")["s_per_step"]
                              / next(r for r in section["rows"] if r["name"] == f"hyv_lib {size}")["s_per_step"], 3),
                max_abs_diff=float(diff.max()), max_abs_output=float(valid),
                relative_l2=float(diff.norm() / theirs.norm().clamp_min(1e-30)))
    STEP_OUTPUTS.clear()
    STEP_OUTPUTS.update(outputs, weights=weights_fingerprint(model))
    use_processors(model, "auto")


# ------------------------------------------------------------------------------------------ compiled
#: What the compiled rows run, and the torch.compile modes they do not try (with why).
COMPILED_HOW = ("hyv_lib.runtimes.step.make_step(model, 'torch', attention='auto', compile=True): torch.compile "
                "(dynamic=False) of each dual-stream block (hyv_lib.runtimes.compiled.compile_blocks), hyv_lib's "
                "attention as one custom op inside it; the rest of the forward eager")
COMPILE_MODES_NOT_RUN = {"max-autotune-no-cudagraphs": "make_step(compile=True) takes no mode: compile_blocks runs "
                                                       "torch.compile's default"}
#: The issue's target for the dense 480p/121f CFG step (the real ``480p`` rows only).
STEP_TARGET = dict(text="dense 480p/121f CFG step <= 4.6 s and >= 3.8x diffusers' stock forward (issue 44)",
                   s_per_step=4.6, speedup=3.8)


def compiled_section(section, device, clock, budget, cfg, tiny, step_section: dict[str, Any]) -> None:
    """hyv_lib's step with its blocks compiled, beside the step section's eager hyv_lib and diffusers rows of the same
    run: a model rebuilt with the same seeded weights (the step section's model went through the offload section),
    the same inputs; the first call (compile + run) apart from the steady s/step, the ratios, and the compiled
    output's difference to the eager one. Sizes the step section did not run get an eager row here first."""
    from hyv_lib.runtimes.step import make_step

    preset = get_preset(cfg["preset"])
    chip = chip_key(device)
    torch.compiler.reset()  # this section's first call compiles from nothing (inductor's disk caches aside)
    start = time.perf_counter()
    model = build_transformer(preset, device)
    same = STEP_OUTPUTS.get("weights") == weights_fingerprint(model)
    section.update(build_s=round(time.perf_counter() - start, 1), how=COMPILED_HOW, compile_mode="default",
                   modes_not_run=COMPILE_MODES_NOT_RUN,
                   eager_reference="the step section's hyv_lib rows (the same weights: equal fingerprints)" if same
                   else "measured here, before compiling (no step section rows with these weights)")
    stepped = {r["name"]: r for r in step_section.get("rows", [])}
    eager: dict[str, tuple[float, torch.Tensor]] = {}
    for size in cfg["steps"]:
        row = stepped.get(f"hyv_lib {size}", {})
        if same and row.get("status") == "ok" and ("hyv_lib", size) in STEP_OUTPUTS:
            eager[size] = (row["s_per_step"], STEP_OUTPUTS[("hyv_lib", size)])
    step = make_step(model, "torch", attention="auto")
    for phase in ("eager", "compiled"):
        if phase == "compiled":
            step = make_step(model, "torch", attention="auto", compile=True)
        for size, (height, width, frames) in cfg["steps"].items():
            if phase == "eager" and size in eager:
                continue
            row: dict[str, Any] = dict(name=f"hyv_lib {phase} {size}", size=[height, width, frames], attention="auto",
                                       backend=resolve_backend("auto", device, torch.bfloat16))
            section["rows"].append(row)
            if phase == "compiled":
                row["compile_mode"] = "default"
                if size == "480p" and not tiny:
                    row["target"] = STEP_TARGET["text"]
            need = 1 if tiny else {"480p": 25, "720p": 60}[size] * (4 if phase == "compiled" else 1)  # + compile
            if not budget.allows(need):
                row.update(status="skipped", reason="time budget")
                continue
            try:
                kwargs = step_inputs(preset, height, width, frames, device)
                repeats = 2 if (size == "480p" or tiny) else 1
                graphs = compiled_graphs()
                with torch.no_grad(), gpu_memory(device, row):
                    first_s, _ = clock.time(lambda: step(**kwargs))  # eager: a warm-up; compiled: the compile
                    seconds, out = clock.time(lambda: step(**kwargs), repeats)
                row.update(status="ok", s_per_step=round(seconds, 3), finite=bool(torch.isfinite(out).all()))
                if chip:
                    row["mfu"] = round(mfu(step_flops(preset, height, width, frames, batch=2)["total"], seconds,
                                           chip, 1), 3)
                if phase == "eager":
                    eager[size] = (seconds, out.float().cpu())
                    continue
                row.update(first_call_s=round(first_s, 2), compile_s=round(first_s - seconds, 2))
                if graphs is not None:
                    row["graphs_compiled"] = compiled_graphs() - graphs
                compare: dict[str, Any] = dict(against="eager hyv_lib, same weights and inputs")
                if size in eager:
                    row["speedup_vs_eager"] = round(eager[size][0] / seconds, 3)
                    reference = eager[size][1]
                    diff = out.float().cpu() - reference
                    compare.update(speedup_vs_eager=row["speedup_vs_eager"], max_abs_diff=float(diff.abs().max()),
                                   max_abs_output=float(reference.abs().max()),
                                   relative_l2=float(diff.norm() / reference.norm().clamp_min(1e-30)))
                stock = stepped.get(f"diffusers {size}", {})
                if stock.get("status") == "ok":
                    row["speedup_vs_diffusers"] = round(stock["s_per_step"] / seconds, 3)
                    compare["speedup_vs_diffusers"] = row["speedup_vs_diffusers"]
                    if same and ("diffusers", size) in STEP_OUTPUTS:
                        theirs = STEP_OUTPUTS[("diffusers", size)]
                        compare["relative_l2_vs_diffusers"] = float((out.float().cpu() - theirs).norm()
                                                                    / theirs.norm().clamp_min(1e-30))
                section.setdefault("compare", {})[size] = compare
                if "target" in row:
                    row["target_met"] = bool(seconds <= STEP_TARGET["s_per_step"]
                                             and row.get("speedup_vs_diffusers", 0) >= STEP_TARGET["speedup"])
                del out
            except Exception as err:  # noqa: BLE001
                row_failure(row, err)
            free_memory()
            print(f"  compiled {row['name']}: {row.get('s_per_step', row.get('reason', row.get('error')))} s/step, "
                  f"first call {row.get('first_call_s')} s", flush=True)
    del step, model
    torch.compiler.reset()  # drops the compiled blocks' references to the model before its memory is freed
    free_memory()


# ------------------------------------------------------------------------------------------ cache
def cache_section(section, device, clock, budget, cfg, tiny, model) -> None:
    preset = get_preset(cfg["preset"])
    size = list(cfg["steps"])[-1]
    height, width, frames = cfg["steps"][size]
    if not budget.allows(40 if not tiny else 1):
        section["rows"].append(dict(name="deepcache", status="skipped", reason="time budget"))
        return
    use_processors(model, "auto")
    kwargs = step_inputs(preset, height, width, frames, device)
    runtime = TorchDeepCache(model)
    row: dict[str, Any] = dict(name=f"cache {size}", size=[height, width, frames], no_cache_blocks=1)
    section["rows"].append(row)
    with torch.no_grad(), gpu_memory(device, row):
        runtime.run_and_cache(1, **kwargs)  # warm-up
        full_s, (_, cache) = clock.time(lambda: runtime.run_and_cache(1, **kwargs))
        runtime.run_from_cache(cache, 1, **kwargs)
        cached_s, out = clock.time(lambda: runtime.run_from_cache(cache, 1, **kwargs), cfg["repeats"])
    schedule = DeepCacheSchedule(50)
    full, cached = len(schedule.full_steps), 50 - len(schedule.full_steps)
    row.update(status="ok", full_step_s=round(full_s, 3), cached_step_s=round(cached_s, 4),
               cached_over_full=round(cached_s / full_s, 4), finite=bool(torch.isfinite(out).all()),
               deepcache_default=dict(schedule=schedule.describe(), full_steps=full, cached_steps=cached,
                                      projected_50_step_s=round(full * full_s + cached * cached_s, 1),
                                      projected_speedup=round(50 * full_s / (full * full_s + cached * cached_s), 2),
                                      block_bound=round(schedule.block_speedup(54 if not tiny else 2), 2)))
    section["note"] = ("MagCache runs the same two kinds of step (a full step that records, a cached step that "
                       "reuses); only which steps are cached differs, so its 50-step time is full x t_full + "
                       "cached x t_cached for its calibrated schedule.")
    print(f"  cache: full {full_s:.3f} s, cached {cached_s:.4f} s", flush=True)


# ------------------------------------------------------------------------------------------ offload
def offload_section(section, device, clock, budget, cfg, tiny, model) -> None:
    preset = get_preset(cfg["preset"])
    size = list(cfg["steps"])[0]
    height, width, frames = cfg["steps"][size]
    row: dict[str, Any] = dict(name=f"block offload {size}", size=[height, width, frames],
                               how="hyv_lib offload_blocks (--offload block): diffusers' group offloading, block level, "
                                   "one block per group, a CUDA stream")
    section["rows"].append(row)
    if device.type != "cuda":
        row.update(status="skipped", reason="group offloading moves weights between the host and a GPU")
        return
    if not budget.allows(60):
        row.update(status="skipped", reason="time budget")
        return
    moved: dict[str, Any] = dict(name="model offload", how="hyv_lib --offload model: the transformer to the host "
                                                          "after the denoising loop, back to the GPU for the next")
    section["rows"].insert(0, moved)
    start = time.perf_counter()
    torch.nn.Module.to(model, "cpu")
    free_memory()
    moved["to_host_s"] = round(time.perf_counter() - start, 2)
    moved["allocated_on_host_gib"] = round(torch.cuda.memory_allocated() / GIB, 3)  # what the VAE decode finds used
    start = time.perf_counter()
    with placed(model, device):
        clock.sync()
        moved["to_device_s"] = round(time.perf_counter() - start, 2)
        moved["allocated_on_device_gib"] = round(torch.cuda.memory_allocated() / GIB, 2)
        start = time.perf_counter()
    clock.sync()
    moved.update(back_to_host_s=round(time.perf_counter() - start, 2), status="ok",
                 allocated_after_gib=round(torch.cuda.memory_allocated() / GIB, 3))
    print(f"  model offload: to GPU {moved['to_device_s']} s, back {moved['back_to_host_s']} s, "
          f"{moved['allocated_after_gib']} GiB left allocated", flush=True)
    use_processors(model, "auto")
    kwargs = step_inputs(preset, height, width, frames, device)
    start = time.perf_counter()
    offload_blocks(model, device)  # what --offload block does
    free_memory()
    row["setup_s"] = round(time.perf_counter() - start, 1)
    with torch.no_grad(), gpu_memory(device, row):
        model(**kwargs, return_dict=False)  # warm-up
        seconds, out = clock.time(lambda: model(**kwargs, return_dict=False)[0])
    row.update(status="ok", s_per_step=round(seconds, 3), finite=bool(torch.isfinite(out).all()))
    print(f"  offload: {seconds:.3f} s/step, peak {row.get('peak_allocated_gib')} GiB", flush=True)


# ------------------------------------------------------------------------------------------ vae
def vae_section(section, device, clock, budget, cfg, tiny) -> None:
    import diffusers

    from hyv_lib.runtimes.vae import decode_latents
    from hyv_lib.runtimes.vae_memory import decode_peak_bytes, tile_for_budget

    preset = get_preset(cfg["preset"])
    height, width, frames = cfg["vae"]
    with torch.device("meta"):
        vae = diffusers.AutoencoderKLHunyuanVideo15(**preset.vae)
    vae = vae.to_empty(device=device).to(torch.bfloat16).eval().requires_grad_(False)
    init_weights(vae, seed=2)
    _, c, t, h, w = preset.latent_shape(height, width, frames)
    latents = torch.randn(1, c, t, h, w, device=device, dtype=torch.bfloat16)
    measured: dict[int, dict[str, Any]] = {}

    def decode(tile_px: int, name: str, **extra) -> None:
        row: dict[str, Any] = dict(name=name, tiling=True, dtype="bf16", tile_px=tile_px, latents=[1, c, t, h, w],
                                   **extra)
        section["rows"].append(row)
        modelled = decode_peak_bytes(vae, (1, c, t, h, w), tile_px, torch.bfloat16)["total"]
        row["modelled_gib"] = round(modelled / GIB, 2)
        if tile_px in measured:  # the same decode as an earlier row
            row.update({k: measured[tile_px][k] for k in ("status", "seconds", "peak_allocated_gib",
                                                          "peak_reserved_gib", "extra_gib") if k in measured[tile_px]})
        elif not budget.allows(40 if not tiny else 1):
            row.update(status="skipped", reason="time budget")
            return
        else:
            with gpu_memory(device, row):
                seconds, frames_out = clock.time(lambda: decode_latents(vae, latents, tiling=True, tile_px=tile_px))
            row.update(status="ok", seconds=round(seconds, 1), frames=list(frames_out.shape))
            measured[tile_px] = row
        if "budget_gib" in row and "peak_allocated_gib" in row:
            row["fits"] = row["peak_allocated_gib"] <= row["budget_gib"]
        print(f"  {name}: {row.get('seconds')} s, peak {row.get('peak_allocated_gib')} GiB "
              f"(modelled {row['modelled_gib']})", flush=True)

    for tile_px in cfg["vae_tiles"]:
        decode(tile_px, f"vae decode {height}x{width}x{frames}, {tile_px} px tiles")
    for gib in cfg["vae_budgets"]:  # what --vae_memory_gb picks, and whether the decode stayed within it
        decode(tile_for_budget(vae, (1, c, t, h, w), gib, torch.bfloat16), f"--vae_memory_gb {gib}", budget_gib=gib)
    section["note"] = ("modelled_gib: hyv_lib.runtimes.vae_memory.decode_peak_bytes; peak_allocated_gib includes the "
                       "VAE's weights, as the model does.")


# ------------------------------------------------------------------------------------------ distributed
def distributed_section(section, device, clock, budget, cfg, tiny) -> None:
    """``torchrun --nproc_per_node 1 -m hyv_lib stage2`` with ``--runtime ulysses`` and with ``--shard_weights fsdp``
    on the tiny model, against the same stage 2 in this process: the nccl path (gloo without a GPU) through the CLI,
    with one GPU. Several GPUs (the point of both) are not measured by a one-GPU check."""
    import shutil
    import subprocess
    import tempfile

    from safetensors.torch import load_file

    from hyv_lib.pipeline.stages import stage1, stage2

    work = Path(tempfile.mkdtemp(prefix="gpu_check_dist_"))
    try:
        stage1(preset="tiny", prompt="a red ball", output_dir=str(work / "base"))
        reference = stage2(str(work / "base"), str(work / "base"), quiet=True, num_inference_steps=4)
        section["backend"] = "nccl" if device.type == "cuda" else "gloo"
        runs = (("ulysses", ["--runtime", "ulysses"]),
                ("ulysses + fsdp", ["--runtime", "ulysses", "--shard_weights", "fsdp"]),
                ("torch + fsdp", ["--runtime", "torch", "--shard_weights", "fsdp"]))
        for name, flags in runs[1:2] if tiny else runs:  # --tiny: the one that goes through both (15 s a launch)
            row: dict[str, Any] = dict(name=f"torchrun 1 rank, {name}", flags=flags)
            section["rows"].append(row)
            if not budget.allows(30 if not tiny else 1):
                row.update(status="skipped", reason="time budget")
                continue
            out = work / name.replace(" + ", "_")
            shutil.copytree(work / "base", out)
            start = time.perf_counter()
            done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "1",
                                   "-m", "hyv_lib", "stage2", "--input_dir", str(out), "--quiet",
                                   "--num_inference_steps", "4", *flags],
                                  capture_output=True, text=True, timeout=300,
                                  cwd=Path(__file__).resolve().parents[1])
            row["seconds"] = round(time.perf_counter() - start, 1)
            if done.returncode != 0:
                row.update(status="failed", error=done.stderr[-600:])
                continue
            latents = load_file(str(out / "stage2_latents.safetensors"))["latents"]
            config = json.loads((out / "generation_config.json").read_text())
            row.update(status="ok", max_abs_diff=float((latents - reference).abs().max()),
                       gpu_peak_allocated_mib=config.get("stage2_gpu_peak_allocated_mib"))
            print(f"  {row['name']}: {row['seconds']} s, max |difference| {row['max_abs_diff']:.3g}", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)


# ------------------------------------------------------------------------------------------ train
#: The train rows' LoRA rank (community LoRAs for this model are rank 16 to 32; the official recipe uses 8).
TRAIN_LORA_RANK = 16
#: The attention backend of the train rows: hyv_lib's SDPA on the valid tokens (torch's fused kernels, with their
#: backward; no [B, 1, S, S] mask).
TRAIN_ATTENTION = "sdpa"
#: Model FLOP utilisation assumed to plan a row's time (the inference step ran at 0.48 to 0.52 on the H200).
PLANNING_MFU = 0.35


def train_batch(preset, height: int, width: int, frames: int, seed: int = 3) -> dict[str, torch.Tensor]:
    """One sample of a train step's host batch (TorchTrainStep's keys): clean latents noised by the flow-matching
    objective (:func:`hyv_lib.models.flow_matching.training_inputs`, a logit-normal noise level with the official shift
    3), random text embeddings padded as :data:`VALID_CONTEXT`'s first prompt, t2v (zero image embeddings)."""
    from hyv_lib.models.flow_matching import NUM_TRAIN_TIMESTEPS, TRAIN_TIMESTEP_SHIFT, sample_sigmas, training_inputs

    g = torch.Generator().manual_seed(seed)
    kwargs = get_adapter(preset.model).example_inputs(preset, height, width, frames, batch=1, dtype=torch.float32)
    x0 = torch.randn(preset.latent_shape(height, width, frames), generator=g)
    sigma = sample_sigmas(1, shift=TRAIN_TIMESTEP_SHIFT, generator=g)
    hidden, target = training_inputs(x0, torch.randn(x0.shape, generator=g), sigma)
    text, byt5 = VALID_CONTEXT[0]
    return dict(hidden_states=hidden, timestep=sigma * NUM_TRAIN_TIMESTEPS, target=target,
                encoder_hidden_states=torch.randn(kwargs["encoder_hidden_states"].shape, generator=g),
                encoder_attention_mask=(torch.arange(preset.text_len) < text).long()[None],
                encoder_hidden_states_2=torch.randn(kwargs["encoder_hidden_states_2"].shape, generator=g),
                encoder_attention_mask_2=(torch.arange(preset.byt5_len) < byt5).long()[None],
                image_embeds=kwargs["image_embeds"])


def train_flops(preset, height: int, width: int, frames: int, trainable: str, remat: bool) -> tuple[float, float]:
    """(useful FLOPs of a train step, FLOPs it runs): the forward, and the backward's 2 forwards' worth for full
    fine-tuning or 1 under a LoRA (the frozen weights' gradients are skipped); ``remat`` runs the forward again."""
    forward = step_flops(preset, height, width, frames, batch=1)["total"]
    useful = forward * (3 if trainable == "full" else 2)
    return useful, useful + (forward if remat else 0)


def train_section(section, device, clock, budget, cfg, tiny) -> None:
    from hyv_lib.models.lora import add_lora
    from hyv_lib.planning.train_memory import train_step_memory
    from hyv_lib.runtimes.torch_train import TorchTrainStep

    live_peak_bytes = None
    if tiny:  # the CPU's measure: torch's live tensor bytes (the test suite's probe)
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
        from memory_probe import live_peak_bytes

    preset = get_preset(cfg["preset"])
    chip = chip_key(device)
    peak_flops = CHIPS[chip or "H100"].peak_bf16_flops
    start = time.perf_counter()
    model = build_transformer(preset, device)
    get_adapter(preset.model).use_attention(model, TRAIN_ATTENTION)
    section.update(build_s=round(time.perf_counter() - start, 1), attention=TRAIN_ATTENTION, lora_rank=TRAIN_LORA_RANK,
                   recipe="hyv_lib.runtimes.torch_train.TorchTrainStep: AdamW (torch.optim, default foreach), clip 1.0, "
                          "lr 1e-5; full: bf16 weights, gradients and moments; LoRA: fp32 factors on bf16 weights",
                   modelled="hyv_lib.planning.train_memory.train_step_memory(precision='torch', device='gpu'): "
                            "modelled_gib is its allocated (torch's allocator peak, CUDA context excluded)",
                   batch_size=1)
    lora_added = False
    for trainable, size_name, (height, width, frames), remat in cfg["train"]:
        row: dict[str, Any] = dict(name=f"{trainable} {size_name} {frames}f{'' if remat else ' no remat'}",
                                   trainable=trainable, size=[height, width, frames], remat=remat,
                                   lora_rank=TRAIN_LORA_RANK if trainable == "lora" else None)
        section["rows"].append(row)
        useful, runs = train_flops(preset, height, width, frames, trainable, remat)
        seconds_per_step = runs / (PLANNING_MFU * peak_flops)
        repeats = 1 if tiny or seconds_per_step > 10 else 2
        need = 1 if tiny else (1 + repeats) * seconds_per_step + 10
        row["planned_s"] = round(need, 1)
        modelled = None
        try:
            modelled = train_step_memory(preset, height=height, width=width, video_length=frames, trainable=trainable,
                                         lora_rank=TRAIN_LORA_RANK, remat=remat, precision="torch",
                                         device="gpu" if device.type == "cuda" else "cpu")
            row.update(modelled_gib=round(modelled["allocated"] / GIB, 2), modelled_peak_phase=modelled["peak_phase"],
                       modelled_parts_gib={k: round(modelled[k] / GIB, 3) for k in (
                           "weights", "optimizer", "inputs", "transient", "gradients", "activations")})
        except Exception as err:  # noqa: BLE001 - the measurement still runs
            row["modelled_error"] = f"{type(err).__name__}: {err}"[:300]
        if not budget.allows(need):
            row.update(status="skipped", reason="time budget")
            print(f"  train {row['name']}: skipped (time budget)", flush=True)
            continue
        step = None
        try:
            if trainable == "lora" and not lora_added:
                for p in model.parameters():
                    p.requires_grad_(False)
                    p.grad = None
                add_lora(model, TRAIN_LORA_RANK)
                lora_added = True
            if not remat:
                model.disable_gradient_checkpointing()
            step = TorchTrainStep(model, trainable=trainable, learning_rate=1e-5, remat=remat)
            batch = train_batch(preset, height, width, frames)
            with gpu_memory(device, row):
                first = step.step(batch)  # warm-up: allocates the gradients and AdamW's state
                seconds, loss = clock.time(lambda: step.step(batch), repeats)
            row.update(status="ok", s_per_step=round(seconds, 3), first_loss=round(first, 5), loss=round(loss, 5),
                       finite=bool(math.isfinite(first) and math.isfinite(loss)),
                       trained_params=sum(p.numel() for p in step.params), useful_tflop=round(useful / 1e12, 2))
            if chip:
                row["mfu"] = round(mfu(useful, seconds, chip, 1), 3)
            if live_peak_bytes is not None:
                for p in step.params:  # over what a step keeps (weights, AdamW's state): the last gradients go first
                    p.grad = None
                measured = live_peak_bytes(lambda: step.step(batch))
                row["live_peak_mib"] = round(measured / 2**20, 3)
                if modelled is not None:
                    row["modelled_live_mib"] = round((modelled["transient"] + modelled["inputs"]) / 2**20, 3)
            if modelled is not None and "peak_allocated_gib" in row:
                row["model_error"] = round(modelled["allocated"] / GIB / row["peak_allocated_gib"] - 1, 3)
        except torch.cuda.OutOfMemoryError as err:
            row.update(status="oom", error=str(err).split("\n")[0][:300])
            print(f"  train {row['name']}: out of memory", flush=True)
        except Exception as err:  # noqa: BLE001
            row_failure(row, err)
        finally:
            step = None
            for p in model.parameters():
                p.grad = None
            model.enable_gradient_checkpointing()
            free_memory()
        print(f"  train {row['name']}: {row.get('s_per_step', row.get('status'))} s/step, peak "
              f"{row.get('peak_allocated_gib', row.get('live_peak_mib'))} (modelled {row.get('modelled_gib')} GiB)",
              flush=True)
    del model
    free_memory()


# ------------------------------------------------------------------------------------------ markdown
def markdown(data: dict[str, Any]) -> str:
    """The report as markdown tables (what the runbook and chapter 8 quote)."""
    sections = data["sections"]
    env = sections.get("environment", {})
    lines = [f"# hyv_lib GPU check: {env.get('gpu', env.get('device', '?'))}", "",
             f"{data['started']}; torch {env.get('torch')}, CUDA {env.get('cuda')}, diffusers {env.get('diffusers')}; "
             f"measured ceilings: bf16 matmul {env.get('matmul_bf16_tflops')} TFLOP/s, copy {env.get('copy_gb_s')} "
             "GB/s.", ""]
    for name, section in sections.items():
        if name == "environment":
            continue
        lines += [f"## {name} ({section.get('status')}, {section.get('seconds', '?')} s)", ""]
        if section.get("error"):
            lines += [f"error: `{section['error'][:300]}`", ""]
        rows = section.get("rows", [])
        keys = [k for k in ("name", "status", "backend", "sdpa_ops", "ms", "tflops", "tile_density", "mask_ms",
                            "max_error", "s_per_step", "mfu", "first_call_s", "compile_s", "speedup_vs_eager",
                            "speedup_vs_diffusers", "how", "text_s", "denoise_s", "decode_s", "video_s",
                            "first_video_s", "tiling", "target_met",
                            "full_step_s", "cached_step_s", "seconds", "peak_allocated_gib", "extra_gib",
                            "modelled_gib", "model_error", "live_peak_mib", "modelled_live_mib", "budget_gib", "fits",
                            "max_abs_diff", "to_device_s", "back_to_host_s",
                            "allocated_after_gib",
                            "reason", "error") if any(k in r for r in rows)]
        if rows:
            lines += ["| " + " | ".join(keys) + " |", "|" + " --- |" * len(keys)]
            for r in rows:
                lines.append("| " + " | ".join(str(r.get(k, "")).replace("|", "/")[:120] for k in keys) + " |")
            lines.append("")
            targets = [f"- {r['name']}: target {r['target']}: {'met' if r.get('target_met') else 'not met'}"
                       if "target_met" in r else f"- {r['name']}: target {r['target']}: not measured"
                       for r in rows if "target" in r]
            lines += targets + [""] * bool(targets)
        if section.get("tiny"):
            t = section["tiny"]
            lines += [f"- tiny model on this device ({t['backend']}) vs diffusers fp32 on the CPU: max |difference| "
                      f"{t['max_abs_diff']:.3g} (output up to {t['max_abs_output']:.3g})", ""]
        if section.get("compare"):
            for size, c in section["compare"].items():
                if "max_abs_diff" not in c or "speedup" not in c:  # other comparisons: their numbers as they are
                    lines.append(f"- {size}: " + ", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}"
                                                           for k, v in c.items()))
                    continue
                lines.append(f"- {size}: diffusers / hyv_lib = {c['speedup']}x; max |difference| "
                             f"{c['max_abs_diff']:.3g} (output up to {c['max_abs_output']:.3g}), relative L2 "
                             f"{c['relative_l2']:.3g}")
            lines.append("")
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------ main
SECTIONS = ("attention", "step", "cache", "offload", "compiled", "e2e", "vae", "distributed", "train", "cogvideox",
            "hunyuanvideo", "ssta", "ssta_backward")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", default="benchmarks/results/gpu_check.json",
                        help="the JSON report (the markdown table goes next to it, .md)")
    parser.add_argument("--tiny", action="store_true", help="tiny shapes on the CPU: the test suite's run")
    parser.add_argument("--budget_s", type=float, default=420.0, help="seconds for all sections (default 420)")
    parser.add_argument("--step_sizes", default=None,
                        help="comma-separated subset of the step sizes (480p,720p; tiny: small,large); the cache and "
                             "offload rows use the last and the first of them, the ssta, compiled and e2e sections "
                             "those they have")
    parser.add_argument("--sections", default=",".join(SECTIONS),
                        help=f"comma-separated subset of {', '.join(SECTIONS)}")
    args = parser.parse_args(argv)
    import diffusers

    diffusers.utils.logging.set_verbosity_error()  # its dtype-cast notice on every random-weight build
    wanted = [s.strip() for s in args.sections.split(",") if s.strip()]
    unknown = sorted(set(wanted) - set(SECTIONS))
    if unknown:
        print(f"error: --sections: unknown {', '.join(unknown)}; valid: {', '.join(SECTIONS)}", file=sys.stderr)
        return 2
    if not math.isfinite(args.budget_s) or args.budget_s <= 0:
        print(f"error: --budget_s must be a positive number of seconds, got {args.budget_s}", file=sys.stderr)
        return 2
    device = torch.device("cpu" if args.tiny or not torch.cuda.is_available() else "cuda")
    if device.type == "cpu" and not args.tiny:
        print("error: no CUDA GPU here (torch.cuda.is_available() is False); --tiny runs the check on the CPU",
              file=sys.stderr)
        return 2
    cfg = sizes(args.tiny)
    if args.step_sizes:
        chosen = [x.strip() for x in args.step_sizes.split(",") if x.strip()]
        if not chosen or set(chosen) - set(cfg["steps"]):
            print(f"error: --step_sizes: must be a comma-separated subset of {', '.join(cfg['steps'])}, got "
                  f"{args.step_sizes!r}", file=sys.stderr)
            return 2
        cfg["steps"] = {k: cfg["steps"][k] for k in chosen}
    report = Report(Path(args.output), args.tiny, list(argv if argv is not None else sys.argv[1:]))
    clock, budget = Clock(device), Budget(args.budget_s)
    run_section(report, "environment", lambda s: environment(s, device, clock, args.tiny))
    if "attention" in wanted:
        run_section(report, "attention", lambda s: attention_section(s, device, clock, budget, cfg, args.tiny))
    model = None
    if {"step", "cache", "offload"} & set(wanted):
        def build(section):
            nonlocal model
            start = time.perf_counter()
            model = build_transformer(get_preset(cfg["preset"]), device)
            section.update(status="ok", seconds=round(time.perf_counter() - start, 1),
                           parameters=sum(p.numel() for p in model.parameters()))
        run_section(report, "model", build)
    for name, fn in (("step", step_section), ("cache", cache_section), ("offload", offload_section)):
        if name in wanted and model is not None:
            run_section(report, name, lambda s, fn=fn: fn(s, device, clock, budget, cfg, args.tiny, model))
    model = None  # the VAE gets the memory
    free_memory()
    if "compiled" in wanted:
        run_section(report, "compiled", lambda s: compiled_section(s, device, clock, budget, cfg, args.tiny,
                                                                   report.data["sections"].get("step", {})))
    STEP_OUTPUTS.clear()
    if "e2e" in wanted:
        helpers = dict(gpu_memory=gpu_memory, row_failure=row_failure, free_memory=free_memory,
                       build_transformer=build_transformer, init_weights=init_weights)
        only = [x.strip() for x in args.step_sizes.split(",")] if args.step_sizes else None
        run_section(report, "e2e", lambda s: e2e_section(s, device, clock, budget, args.tiny, helpers, only))
    if "vae" in wanted:
        run_section(report, "vae", lambda s: vae_section(s, device, clock, budget, cfg, args.tiny))
    if "distributed" in wanted:
        run_section(report, "distributed", lambda s: distributed_section(s, device, clock, budget, cfg, args.tiny))
    if "train" in wanted:
        run_section(report, "train", lambda s: train_section(s, device, clock, budget, cfg, args.tiny))
    if "cogvideox" in wanted:
        helpers = dict(init_weights=init_weights, gpu_memory=gpu_memory, chip_key=chip_key, mfu=mfu,
                       row_failure=row_failure, free_memory=free_memory)
        run_section(report, "cogvideox", lambda s: cogvideox_section(s, device, clock, budget, args.tiny, helpers))
    if "hunyuanvideo" in wanted:
        helpers = dict(init_weights=init_weights, gpu_memory=gpu_memory, chip_key=chip_key, mfu=mfu,
                       row_failure=row_failure, free_memory=free_memory)
        run_section(report, "hunyuanvideo",
                    lambda s: hunyuanvideo_section(s, device, clock, budget, args.tiny, helpers))
    if "ssta" in wanted:
        helpers = dict(gpu_memory=gpu_memory, chip_key=chip_key, mfu=mfu, row_failure=row_failure,
                       free_memory=free_memory, joint_mask=joint_mask, build_transformer=build_transformer,
                       step_inputs=step_inputs)
        only = [x.strip() for x in args.step_sizes.split(",")] if args.step_sizes else None
        run_section(report, "ssta", lambda s: ssta_section(s, device, clock, budget, args.tiny, helpers, only))
    if "ssta_backward" in wanted:
        helpers = dict(row_failure=row_failure)
        run_section(report, "ssta_backward", lambda s: backward_section(s, device, clock, budget, args.tiny, helpers))
    report.data["finished"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    report.write()
    failed = [n for n, s in report.data["sections"].items() if s.get("status") == "failed"]
    print(f"wrote {report.path} and {report.path.with_suffix('.md')}; failed sections: {failed or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

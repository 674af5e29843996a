"""gpu_check.py's ``e2e`` section: one whole video on one GPU, hyv_lib against diffusers' HunyuanVideo15Pipeline, timed.

Same random weights for both in the same run, loaded and freed in the order a run with offloading keeps them
(text encoders, then the DiT, then the VAE decode; the small VAE stays on the device throughout because diffusers'
pipeline object reads its config):

- ``text``: the prompt and negative prompt through real-size stand-ins of the two text encoders, built from their
  configs on the device (:data:`QWEN25_VL_7B_TEXT`: Qwen2.5-VL-7B's language model, 7.07B parameters;
  :data:`BYT5_GLYPH`: the ByT5-small-shaped glyph encoder, 0.22B), bf16, transformers' own random initialisation.
  The hub is out of reach, so the tokenizers are built locally as the tiny presets build them
  (:func:`hyv_lib.models.hunyuan_video15.components.build_tiny_tokenizer`'s byte-level Qwen2 tokenizer, transformers'
  ``ByT5Tokenizer``, which needs no files): every prompt is still padded to the real 1,000 + 108 template tokens
  and 256 ByT5 tokens, so the encoders do the real work; only which tokens are valid differs (a byte per token:
  most of the 1,000 MLLM positions are valid where a real prompt has ~100-200: ~800 more tokens beside 48,360
  video tokens at 480p, ~3% more attention work for hyv_lib's valid-token attention in the DiT and none for
  diffusers' dense mask; recorded as ``text_encoders.valid_tokens``). hyv_lib's stage 1
  (:func:`hyv_lib.pipeline.text.encode_pair`, one batch [negative, positive]) against ``HunyuanVideo15Pipeline.
  encode_prompt`` (one call per prompt, as the pipeline calls it).
- ``denoise``: N CFG steps of the 8.3B DiT (random bf16 weights, seeded) from the same initial latents: diffusers'
  own pipeline loop (``output_type="latent"``: its guider runs the conditional and unconditional forwards one after
  the other, stock attention) against hyv_lib's stage-2 loop (:func:`hyv_lib.pipeline.sampling.sample_latents`) with
  ``make_step(model, "torch", attention="auto", compile=True)``: the first call (compiling) apart from the steady
  steps, and the difference of the latents after N steps. diffusers runs first for every size: the compile happens
  in place, and stock processors inside compiled blocks would not be diffusers' stock forward any more.
- ``decode``: each side's latents to frames: hyv_lib's stage 3 (:func:`hyv_lib.runtimes.vae.decode_latents`,
  diffusers' 256 px tiles, ``--vae_dtype bf16``) against the pipeline's ``vae.decode`` + ``postprocess_video`` in
  the VAE's bf16, untiled as the pipeline runs by default unless :func:`hyv_lib.runtimes.vae_memory.decode_peak_bytes`
  (+ the mid-block's dense [S, S] causal mask) says it would not fit, then with ``enable_tiling()``.
- ``video``: the 50-step video per side (the tiny twin: 8 steps, its preset's default), measured when the budget
  allows those steps, else projected = text + 50 x the steady step + the decode + the loop's measured fixed
  overhead; each row says which. Loading weights from disk is not in it (random weights are built in place);
  hyv_lib's compile is reported apart (``first_video_s`` adds it: the first video after loading).

Targets (issue 44): a dense 480p/121f CFG step <= 4.6 s and >= 3.8x diffusers' stock forward; a 480x832/121f/50-step
video <= 240 s end to end. Reference: vLLM-Omni 259.4 s on one H200 (vllm-project/vllm-omni PR #1516), diffusers
1135.7 s there.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from hyv_lib.models.families import get_preset
from hyv_lib.kernels.dispatch import kernel_record, resolve_backend

#: Qwen2.5-VL-7B-Instruct's language model (``Qwen2_5_VLTextModel``): its published text config.
QWEN25_VL_7B_TEXT = dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                         num_key_value_heads=4, vocab_size=152064, rms_norm_eps=1e-6, max_position_embeddings=128000,
                         rope_parameters={"rope_type": "default", "rope_theta": 1000000.0,
                                          "mrope_section": [16, 24, 24]})
#: HunyuanVideo-1.5's glyph encoder (``T5EncoderModel``): ByT5-small's encoder with the glyph vocabulary (1,510).
BYT5_GLYPH = dict(vocab_size=1510, d_model=1472, d_kv=64, d_ff=3584, num_layers=12, num_heads=6,
                  feed_forward_proj="gated-gelu", relative_attention_num_buckets=32,
                  relative_attention_max_distance=128, layer_norm_epsilon=1e-6)
#: The real rows, and the tiny twins ``--tiny`` runs on the CPU. ``full``: sizes whose 50 steps run when the budget
#: allows (tiny: the first only, so that the test covers both the measured and the projected row).
#: ``video_steps``: the video the section reports (50: the presets' default; the tiny twin's 8, its preset's).
REAL = dict(preset="720p_t2v", sizes={"480p": ("480p_t2v", (480, 832, 121)), "720p": ("720p_t2v", (720, 1280, 121))},
            steps=2, full=("480p", "720p"), video_steps=50, dtype=torch.bfloat16)
TINY = dict(preset="tiny", sizes={"small": ("tiny", (32, 48, 9)), "large": ("tiny", (128, 160, 9))}, steps=2,
            full=("small",), video_steps=8, dtype=torch.bfloat16)
PROMPT = ('A neon sign reading "OPEN 24 HOURS" flickers above a rain-soaked street at night; a cyclist in a yellow '
          "raincoat rides through the puddles, the reflections of red and blue lights ripple on the wet asphalt, the "
          "camera tracks slowly to the left at street level.")
NEGATIVE = "blurry, low quality, distorted"
SEED = 42
TARGETS = {"480p": dict(step="dense 480p/121f CFG step <= 4.6 s and >= 3.8x diffusers' stock forward (issue 44)",
                        step_s=4.6, speedup=3.8,
                        video="480x832/121f/50-step video <= 240 s end to end (issue 44; vLLM-Omni 259.4 s on one "
                              "H200, vllm-project/vllm-omni PR #1516; diffusers 1135.7 s there)", video_s=240.0)}


def built_on(device: torch.device, dtype: torch.dtype, make):
    """``make()`` with its parameters created on ``device`` in ``dtype`` (the library's own initialisation runs
    there: no host copy of 7B parameters), in eval mode without gradients."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            module = make()
    finally:
        torch.set_default_dtype(previous)
    return module.eval().requires_grad_(False)


def text_components(preset, device: torch.device, dtype: torch.dtype) -> dict[str, Any]:
    """The two text encoders (real-size stand-ins, or the tiny preset's configs) and their locally built tokenizers."""
    from transformers import ByT5Tokenizer, Qwen2_5_VLTextModel, T5Config, T5EncoderModel
    from transformers.models.qwen2_5_vl.configuration_qwen2_5_vl import Qwen2_5_VLTextConfig

    from hyv_lib.models.hunyuan_video15.components import build_tiny_tokenizer

    tokenizer = build_tiny_tokenizer()
    qwen = preset.text_encoder if preset.is_tiny else QWEN25_VL_7B_TEXT
    byt5 = preset.text_encoder_2 if preset.is_tiny else BYT5_GLYPH
    config = Qwen2_5_VLTextConfig(**{**dict(vocab_size=len(tokenizer)), **qwen}, pad_token_id=tokenizer.pad_token_id,
                                  bos_token_id=None, eos_token_id=tokenizer.eos_token_id)
    return dict(tokenizer=tokenizer, tokenizer_2=ByT5Tokenizer(),
                text_encoder=built_on(device, dtype, lambda: Qwen2_5_VLTextModel(config)),
                text_encoder_2=built_on(device, dtype, lambda: T5EncoderModel(T5Config(**byt5))))


def diffusers_pipeline(preset, vae, transformer=None, text: dict[str, Any] | None = None, flow_shift: float = 5.0):
    """diffusers' ``HunyuanVideo15Pipeline`` over the given parts (the rest None), with the preset's text lengths and
    template crop (the real preset's equal the pipeline's own 1000, 256 and 108)."""
    from diffusers import FlowMatchEulerDiscreteScheduler, HunyuanVideo15Pipeline
    from diffusers.guiders import ClassifierFreeGuidance

    from hyv_lib.models.hunyuan_video15.text import template_crop_start

    text = text or {}
    pipe = HunyuanVideo15Pipeline(text_encoder=text.get("text_encoder"), tokenizer=text.get("tokenizer"),
                                  transformer=transformer, vae=vae,
                                  scheduler=FlowMatchEulerDiscreteScheduler(shift=flow_shift),
                                  text_encoder_2=text.get("text_encoder_2"), tokenizer_2=text.get("tokenizer_2"),
                                  guider=ClassifierFreeGuidance(guidance_scale=preset.guidance_scale))
    pipe.tokenizer_max_length, pipe.tokenizer_2_max_length = preset.text_len, preset.byt5_len
    if text.get("tokenizer") is not None:
        pipe.prompt_template_encode_start_idx = (preset.crop_start if preset.crop_start is not None
                                                 else template_crop_start(text["tokenizer"]))
    pipe.set_progress_bar_config(disable=True)
    return pipe


def relative(a: torch.Tensor, b: torch.Tensor) -> dict[str, float]:
    """max |a - b|, max |b| and the relative L2 difference of two tensors (as float32 on the CPU)."""
    a, b = a.float().cpu(), b.float().cpu()
    diff = a - b
    return dict(max_abs_diff=float(diff.abs().max()), max_abs_reference=float(b.abs().max()),
                relative_l2=float(diff.norm() / b.norm().clamp_min(1e-30)))


def steady(seconds: list[float]) -> float:
    """The steady per-step seconds: the mean after the first step (which pays one-off work), or the only one."""
    return sum(seconds[1:]) / len(seconds[1:]) if len(seconds) > 1 else seconds[0]


def text_part(section, device, clock, budget, cfg, tiny, helpers, vae) -> tuple[dict | None, dict | None]:
    """Encode with both; returns (hyv_lib's stage-1 tensors, diffusers' pipeline keywords), None where not run."""
    from hyv_lib.pipeline.text import encode_pair

    preset, dtype = get_preset(cfg["preset"]), cfg["dtype"]
    rows = {which: dict(name=f"text {which}", part="text") for which in ("hyv_lib", "diffusers")}
    section["rows"] += list(rows.values())
    if not budget.allows(1 if tiny else 30):
        for row in rows.values():
            row.update(status="skipped", reason="time budget")
        return None, None
    start = time.perf_counter()
    text = text_components(preset, device, dtype)
    section["text_encoders"] = dict(
        build_s=round(time.perf_counter() - start, 1), dtype=str(dtype).removeprefix("torch."),
        parameters={name: sum(p.numel() for p in text[name].parameters()) for name in ("text_encoder",
                                                                                        "text_encoder_2")},
        configs="tiny preset's" if tiny else "QWEN25_VL_7B_TEXT, BYT5_GLYPH (benchmarks/gpu_e2e.py)",
        tokenizers="byte-level Qwen2 tokenizer (hyv_lib.models.hunyuan_video15.components.build_tiny_tokenizer) and ByT5Tokenizer, "
                   "built locally; padded to the real lengths")
    pipe = diffusers_pipeline(preset, vae, text=text)
    dtype_name = {torch.bfloat16: "bf16", torch.float32: "fp32"}[dtype]
    runs = dict(hyv_lib=lambda: encode_pair(text, preset, PROMPT, NEGATIVE, dtype_name),
                diffusers=lambda: (pipe.encode_prompt(PROMPT, device=device, dtype=dtype),
                                   pipe.encode_prompt(NEGATIVE, device=device, dtype=dtype)))
    outputs: dict[str, Any] = {}
    for which, fn in runs.items():
        row = rows[which]
        try:
            with torch.no_grad(), helpers["gpu_memory"](device, row):
                first_s, _ = clock.time(fn)
                seconds, out = clock.time(fn)
            row.update(status="ok", first_call_s=round(first_s, 3), seconds=round(seconds, 3))
            outputs[which] = out
        except Exception as err:  # noqa: BLE001
            helpers["row_failure"](row, err)
        print(f"  e2e {row['name']}: {row.get('seconds', row.get('error'))} s", flush=True)
    mine, theirs = outputs.get("hyv_lib"), outputs.get("diffusers")
    if mine is not None:  # byte tokens: far more valid MLLM tokens than a real prompt's ~100-200 (see the docstring)
        masks = ("prompt_embeds_mask", "negative_prompt_embeds_mask", "prompt_embeds_mask_2",
                 "negative_prompt_embeds_mask_2")
        section["text_encoders"]["valid_tokens"] = {k: int(mine[k].sum()) for k in masks}
    diffusers_kwargs = None
    if theirs is not None:
        (pos, pos_mask, pos2, pos_mask2), (neg, neg_mask, neg2, neg_mask2) = theirs
        diffusers_kwargs = dict(prompt_embeds=pos, prompt_embeds_mask=pos_mask, prompt_embeds_2=pos2,
                                prompt_embeds_mask_2=pos_mask2, negative_prompt_embeds=neg,
                                negative_prompt_embeds_mask=neg_mask, negative_prompt_embeds_2=neg2,
                                negative_prompt_embeds_mask_2=neg_mask2)
        if mine is not None:  # the same encoders and recipe: equal embeddings
            section.setdefault("compare", {})["text"] = relative(mine["prompt_embeds"], pos)
    del text, pipe, runs  # the encoders' memory goes to the DiT
    helpers["free_memory"]()
    return mine, diffusers_kwargs


def diffusers_denoise(row, pipe, kwargs, shape, size_cfg, n, device, clock, helpers) -> torch.Tensor:
    """diffusers' pipeline loop for ``n`` steps; per-step seconds from hooks around the transformer's forwards."""
    from hyv_lib.models.family import initial_latents

    height, width, frames = size_cfg
    marks: list[list[float]] = []

    def before(module, args, kw):
        clock.sync()
        marks.append([time.perf_counter()])

    def after(module, args, kw, out):
        clock.sync()
        marks[-1].append(time.perf_counter())

    hooks = [pipe.transformer.register_forward_pre_hook(before, with_kwargs=True),
             pipe.transformer.register_forward_hook(after, with_kwargs=True)]
    latents = initial_latents(shape, SEED).to(device, pipe.transformer.dtype)
    try:
        with torch.no_grad(), helpers["gpu_memory"](device, row):
            wall, out = clock.time(lambda: pipe(**kwargs, height=height, width=width, num_frames=frames,
                                                num_inference_steps=n, latents=latents, output_type="latent",
                                                return_dict=False)[0])
    finally:
        for hook in hooks:
            hook.remove()
    per_step = len(marks) // n
    steps = [marks[(i + 1) * per_step - 1][1] - marks[i * per_step][0] for i in range(n)]
    row.update(status="ok", steps=n, forwards_per_step=per_step, step_s=[round(s, 3) for s in steps],
               first_step_s=round(steps[0], 3), s_per_step=round(steady(steps), 3),
               loop_overhead_s=round(wall - sum(steps), 3), finite=bool(torch.isfinite(out).all()))
    return out


def hyv_denoise(row, step, model, embeds, size_preset, size_cfg, n, warmup, device, clock, helpers) -> torch.Tensor:
    """hyv_lib's stage-2 loop for ``n`` steps (``warmup`` discarded first calls: the compile); per-call seconds."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    from hyv_lib.pipeline.sampling import sample_latents
    from hyv_lib.pipeline.settings import resolve_settings

    height, width, frames = size_cfg
    settings = resolve_settings(size_preset, height=height, width=width, video_length=frames, num_inference_steps=n,
                                seed=SEED, warmup_steps=warmup)
    calls: list[float] = []

    def timed(**kwargs):
        clock.sync()
        start = time.perf_counter()
        out = step(**kwargs)
        clock.sync()
        calls.append(time.perf_counter() - start)
        return out

    scheduler = FlowMatchEulerDiscreteScheduler(shift=size_preset.flow_shift).config
    with helpers["gpu_memory"](device, row):
        wall, latents = clock.time(lambda: sample_latents(timed, model, scheduler, size_preset, embeds, settings,
                                                          progress=False, device=device))
    steps = calls[warmup:]
    row.update(status="ok", steps=n, step_s=[round(s, 3) for s in steps] if n <= 10 else None,
               s_per_step=round(steady(steps), 3), loop_overhead_s=round(wall - sum(calls), 3),
               wall_s=round(wall, 2), finite=bool(torch.isfinite(latents).all()))
    if warmup:
        row.update(first_call_s=round(calls[0], 2), compile_s=round(calls[0] - steady(steps), 2))
    return latents


def compiled_graphs() -> int | None:
    """Graphs torch.compile has made in this process so far (dynamo's counter), or None where torch has none."""
    try:
        from torch._dynamo.utils import counters

        return int(counters["stats"]["unique_graphs"])
    except (ImportError, KeyError):
        return None


def denoise_part(section, device, clock, budget, cfg, tiny, helpers, vae, embeds, diffusers_kwargs, sizes):
    """The DiT: diffusers' loop for every size, then hyv_lib's compiled loop (and its 50 steps where the budget
    allows). Returns {(which, size): latents}."""
    from hyv_lib.runtimes.step import make_step

    preset, n, video_steps = get_preset(cfg["preset"]), cfg["steps"], cfg["video_steps"]
    latents: dict[tuple[str, str], torch.Tensor] = {}
    start = time.perf_counter()
    model = helpers["build_transformer"](preset, device)
    section["dit"] = dict(build_s=round(time.perf_counter() - start, 1),
                          parameters=sum(p.numel() for p in model.parameters()), steps=n)
    for size, (size_name, size_cfg) in sizes.items():
        size_preset = get_preset(size_name)
        row: dict[str, Any] = dict(name=f"denoise diffusers {size}", part="denoise", size=list(size_cfg),
                                   attention="diffusers stock (dense mask), HunyuanVideo15Pipeline's loop")
        section["rows"].append(row)
        if diffusers_kwargs is None or not budget.allows(1 if tiny else {"480p": 20, "720p": 90}[size] * n + 10):
            row.update(status="skipped", reason="no text embeddings" if diffusers_kwargs is None else "time budget")
            continue
        try:
            pipe = diffusers_pipeline(size_preset, vae, transformer=model, flow_shift=size_preset.flow_shift)
            shape = size_preset.latent_shape(*size_cfg)
            latents[("diffusers", size)] = diffusers_denoise(row, pipe, diffusers_kwargs, shape, size_cfg, n, device,
                                                             clock, helpers).float().cpu()
            del pipe
        except Exception as err:  # noqa: BLE001
            helpers["row_failure"](row, err)
        helpers["free_memory"]()
        print(f"  e2e {row['name']}: {row.get('s_per_step', row.get('reason', row.get('error')))} s/step", flush=True)
    step = None
    for size, (size_name, size_cfg) in sizes.items():
        size_preset = get_preset(size_name)
        row = dict(name=f"denoise hyv_lib compiled {size}", part="denoise", size=list(size_cfg), attention="auto",
                   compile="make_step(model, 'torch', attention='auto', compile=True)", compile_mode="default")
        section["rows"].append(row)
        target = TARGETS.get(size) if not tiny else None
        if target:
            row["target"] = target["step"]
        if embeds is None or not budget.allows(1 if tiny else {"480p": 90, "720p": 200}[size]):  # compile + steps
            row.update(status="skipped", reason="no text embeddings" if embeds is None else "time budget")
            continue
        try:
            if step is None:
                torch.compiler.reset()  # the first call compiles from nothing, not from another section's graphs
                step = make_step(model, "torch", attention="auto", compile=True)
            row.update(backend=resolve_backend("auto", device, cfg["dtype"]),
                       kernel=kernel_record("auto", device, cfg["dtype"], model.config.attention_head_dim))
            graphs = compiled_graphs()
            with torch.no_grad():
                out = hyv_denoise(row, step, model, embeds, size_preset, size_cfg, n, 1, device, clock, helpers)
            if graphs is not None:
                row["graphs_compiled"] = compiled_graphs() - graphs
            latents[("hyv_lib", size)] = out
            theirs = next(r for r in section["rows"] if r["name"] == f"denoise diffusers {size}")
            if theirs.get("status") == "ok":
                row["speedup_vs_diffusers"] = round(theirs["s_per_step"] / row["s_per_step"], 2)
                section.setdefault("compare", {})[f"latents after {n} steps {size}"] = relative(
                    out, latents[("diffusers", size)])
            if target:
                row["target_met"] = bool(row["s_per_step"] <= target["step_s"]
                                         and row.get("speedup_vs_diffusers", 0) >= target["speedup"])
            full = dict(name=f"denoise hyv_lib compiled {size}, {video_steps} steps", part="denoise",
                        size=list(size_cfg))
            section["rows"].append(full)
            reserve = 1 if tiny else {"480p": 40, "720p": 90}[size]  # the two decodes after it
            if size not in cfg["full"]:
                full.update(status="skipped", reason="not run at this size (--tiny runs it at the first size only)")
            elif not budget.allows(video_steps * row["s_per_step"] * 1.1 + reserve):
                full.update(status="skipped", reason=f"time budget: the video is projected from {n} steps")
            else:
                with torch.no_grad():
                    latents[("hyv_lib", size)] = hyv_denoise(full, step, model, embeds, size_preset, size_cfg,
                                                             video_steps, 0, device, clock, helpers)
        except Exception as err:  # noqa: BLE001
            helpers["row_failure"](row, err)
        helpers["free_memory"]()
        print(f"  e2e {row['name']}: {row.get('s_per_step', row.get('reason', row.get('error')))} s/step, first call "
              f"{row.get('first_call_s')} s", flush=True)
    del model, step
    torch.compiler.reset()  # drops the compiled blocks' references to the model before its memory is freed
    helpers["free_memory"]()
    return latents


def untiled_fits(vae, shape, device: torch.device) -> tuple[bool, float | None]:
    """Whether diffusers' untiled decode of ``shape`` fits the free device memory (hyv_lib's decode model plus the
    mid-block's dense [S, S] causal mask and its broadcast copy), and that need in GiB; always True on the CPU."""
    from hyv_lib.runtimes.vae_memory import decode_peak_bytes

    _, _, t, h, w = shape
    need = decode_peak_bytes(vae, shape, None, torch.bfloat16)["total"] + 2 * 2 * (t * h * w) ** 2
    if device.type != "cuda":
        return True, round(need / 2**30, 2)
    free, _ = torch.cuda.mem_get_info(device)
    return need < 0.85 * free, round(need / 2**30, 2)


def decode_part(section, device, clock, budget, tiny, helpers, vae, latents, sizes) -> None:
    """Each side's latents to frames: hyv_lib's stage-3 decode and the pipeline's ``vae.decode`` + postprocess."""
    from diffusers.pipelines.hunyuan_video1_5.image_processor import HunyuanVideo15ImageProcessor

    from hyv_lib.runtimes.vae import decode_latents

    processor = HunyuanVideo15ImageProcessor(vae_scale_factor=vae.config.spatial_compression_ratio)
    for size, (_, size_cfg) in sizes.items():
        for which in ("hyv_lib", "diffusers"):
            row: dict[str, Any] = dict(name=f"decode {which} {size}", part="decode", size=list(size_cfg),
                                       vae_dtype="bf16")
            section["rows"].append(row)
            z = latents.get((which, size))
            if z is None or not budget.allows(1 if tiny else {"480p": 20, "720p": 45}[size]):
                row.update(status="skipped", reason="no latents" if z is None else "time budget")
                continue
            try:
                if which == "hyv_lib":
                    row["tiling"] = "diffusers' tiles, 256 px (hyv_lib's stage 3 default)"

                    def fn():
                        return decode_latents(vae, z, tiling=True, dtype=torch.bfloat16, device=device)
                else:
                    fits, need_gib = untiled_fits(vae, tuple(z.shape), device)
                    row["untiled_need_gib"] = need_gib
                    if fits:
                        row["tiling"] = "off (the pipeline's default)"
                        vae.disable_tiling()
                    else:
                        row["tiling"] = "enable_tiling() (untiled would not fit)"
                        vae.enable_tiling()

                    def fn():
                        video = vae.decode(z.to(device, vae.dtype) / vae.config.scaling_factor, return_dict=False)[0]
                        return processor.postprocess_video(video, output_type="np")
                with torch.no_grad(), helpers["gpu_memory"](device, row):
                    seconds, frames = clock.time(fn)
                row.update(status="ok", seconds=round(seconds, 2), frames=list(frames.shape))
            except torch.cuda.OutOfMemoryError as err:
                row.update(status="oom", error=str(err).split("\n")[0][:300])
            except Exception as err:  # noqa: BLE001
                helpers["row_failure"](row, err)
            finally:
                vae.disable_tiling()
            helpers["free_memory"]()
            print(f"  e2e {row['name']}: {row.get('seconds', row.get('reason', row.get('error')))} s", flush=True)


def video_rows(section, n: int, video_steps: int, tiny: bool, sizes) -> None:
    """The ``video_steps`` video per side and size: measured (text + its whole loop + decode) or projected from the
    ``n`` timed steps."""
    rows = {r["name"]: r for r in section["rows"]}
    for size in sizes:
        for which in ("hyv_lib", "diffusers"):
            label = "hyv_lib compiled" if which == "hyv_lib" else which
            text, decode = rows.get(f"text {which}", {}), rows.get(f"decode {which} {size}", {})
            denoise = rows.get(f"denoise {label} {size}", {})
            full = rows.get(f"denoise {label} {size}, {video_steps} steps", {})
            row: dict[str, Any] = dict(name=f"video {which} {size}", part="video", steps=video_steps)
            section["rows"].append(row)
            target = TARGETS.get(size) if not tiny and which == "hyv_lib" else None
            if target:
                row["target"] = target["video"]
            missing = [r.get("name", part) for r, part in ((text, "text"), (denoise, "denoise"), (decode, "decode"))
                       if r.get("status") != "ok"]
            if missing:
                row.update(status="skipped", reason=f"not measured: {', '.join(missing)}")
                continue
            if full.get("status") == "ok":
                loop, how = full["wall_s"], "measured"
            else:
                loop = video_steps * denoise["s_per_step"] + denoise["loop_overhead_s"]
                how = f"projected from {n} steps"
            total = text["seconds"] + loop + decode["seconds"]
            row.update(status="ok", how=how, text_s=text["seconds"], denoise_s=round(loop, 1),
                       decode_s=decode["seconds"], video_s=round(total, 1))
            if "compile_s" in denoise:  # the first video after loading also compiles
                row["first_video_s"] = round(total + denoise["compile_s"], 1)
            if target:
                row["target_met"] = bool(total <= target["video_s"])
    rows = {r["name"]: r for r in section["rows"]}
    for size in sizes:
        hyv, stock = rows[f"video hyv_lib {size}"], rows[f"video diffusers {size}"]
        if hyv.get("status") == stock.get("status") == "ok":
            section.setdefault("compare", {})[f"video {size}"] = dict(
                speedup=round(stock["video_s"] / hyv["video_s"], 2), hyv_lib=hyv["how"], diffusers=stock["how"])


def e2e_section(section, device, clock, budget, tiny: bool, helpers: dict[str, Any], only=None) -> None:
    """The section (see the module docstring). ``helpers``: gpu_check's gpu_memory, row_failure, free_memory,
    build_transformer, init_weights; ``only``: the size names to run (``--step_sizes``), None for all."""
    from diffusers import AutoencoderKLHunyuanVideo15

    cfg = TINY if tiny else REAL
    sizes = {k: v for k, v in cfg["sizes"].items() if only is None or k in only}
    preset = get_preset(cfg["preset"])
    section.update(reference="vLLM-Omni: 259.4 s for a 480x832/121f/50-step video on one H200 (vllm-project/"
                             "vllm-omni PR #1516); diffusers 1135.7 s there",
                   steps_timed=cfg["steps"], video_steps=cfg["video_steps"],
                   sizes={k: list(v[1]) for k, v in sizes.items()},
                   order="text encoders, then the DiT (diffusers' loop for every size, then hyv_lib compiled), then "
                         "the VAE decodes; each freed before the next")
    with torch.device("meta"):
        vae = AutoencoderKLHunyuanVideo15(**preset.vae).to(cfg["dtype"])
    vae = vae.to_empty(device=device).eval().requires_grad_(False)
    helpers["init_weights"](vae, seed=2)
    embeds, diffusers_kwargs = text_part(section, device, clock, budget, cfg, tiny, helpers, vae)
    latents = denoise_part(section, device, clock, budget, cfg, tiny, helpers, vae, embeds, diffusers_kwargs, sizes)
    embeds = diffusers_kwargs = None
    helpers["free_memory"]()
    decode_part(section, device, clock, budget, tiny, helpers, vae, latents, sizes)
    video_rows(section, cfg["steps"], cfg["video_steps"], tiny, sizes)

"""gpu_check.py's ``cogvideox`` section: CogVideoX1.5-5B's denoising step on one GPU, diffusers' forward and hyv_lib's.

Two parts, both through the model adapter hyv_lib runs CogVideoX with (``get_adapter("cogvideox")``):

- ``tiny``: the tiny CogVideoX (``cogvideox_tiny``, fp32, seeded weights) on this device with hyv_lib's attention
  against diffusers' eager fp32 forward on the CPU (the oracle): the max difference.
- ``real``: one denoising step (the CFG batch of 2) of the 42-block, 5.57B-parameter transformer with random bf16
  weights at 768x1360 and 720x1280, 81 frames (44,880 and 39,600 video tokens + 226 text tokens), diffusers' stock
  forward (its SDPA processor) against the same forward with hyv_lib's attention (``auto``): s/step, peak memory,
  MFU by :func:`hyv_lib.planning.costs.step_flops` where it counts this model, and the output difference. The RoPE
  tables are diffusers' own (``get_3d_rotary_pos_embed`` as ``CogVideoXPipeline`` calls it). Last, the same step
  with the blocks compiled (``make_step(model, "torch", attention="auto", compile=True)``: regional torch.compile,
  attention as one custom op; in place, so after every eager row): the first call apart from the steady s/step,
  the ratios to the eager and diffusers rows and the difference to the eager output. Target (issue 44): >= 1.15x
  diffusers' stock forward.

The reference to put it beside (gpu-tpu-pedia, single author, TPU v6e-8 with data=2 x tensor=4): 1.13 s/step at
768x1360x81, about 2.13 s/step at 720x1280x81 (106.47 s for 50 steps end to end).
"""

from __future__ import annotations

from typing import Any

import torch

from hyv_lib.models.families import get_preset
from hyv_lib.kernels.dispatch import resolve_backend
from hyv_lib.models.registry import get_adapter
from hyv_lib.runtimes.step import make_step

#: (height, width, frames) of the real rows, and of the tiny rows ``--tiny`` runs on the CPU.
REAL_SIZES = {"768x1360": (768, 1360, 81), "720x1280": (720, 1280, 81)}
TINY_SIZES = {"small": (96, 160, 9)}
#: The issue's target for the compiled step against diffusers' stock forward (the real rows).
COMPILED_TARGET = dict(text=">= 1.15x diffusers' stock forward (issue 44)", speedup=1.15)


def pipeline_rope(config, height: int, width: int, latent_frames: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """The (cos, sin) tables CogVideoXPipeline passes as ``image_rotary_emb`` (its
    ``_prepare_rotary_positional_embeddings``, restated from the pipeline's arguments; VAE factor 8)."""
    from diffusers.models.embeddings import get_3d_rotary_pos_embed

    p, p_t = config.patch_size, config.patch_size_t
    grid = (height // (8 * p), width // (8 * p))
    if p_t is None:
        raise ValueError("the section runs CogVideoX 1.5 (patch_size_t=2)")
    return get_3d_rotary_pos_embed(embed_dim=config.attention_head_dim, crops_coords=None, grid_size=grid,
                                   temporal_size=(latent_frames + p_t - 1) // p_t, grid_type="slice",
                                   max_size=(config.sample_height // p, config.sample_width // p), device=device)


def forward_inputs(config, height: int, width: int, frames: int, device, dtype, seed: int = 1) -> dict[str, Any]:
    """A CFG batch of the forward's keywords: latents [2, F, 16, H/8, W/8] with F padded to the temporal patch as the
    pipeline pads it, random T5-shaped text states, a mid-schedule timestep and the pipeline's RoPE tables."""
    latent_frames = (frames - 1) // 4 + 1
    latent_frames += (-latent_frames) % (config.patch_size_t or 1)
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(2, latent_frames, config.in_channels, height // 8, width // 8, generator=g)
    text = torch.randn(2, config.max_text_seq_length, config.text_embed_dim, generator=g)
    rope = pipeline_rope(config, height, width, latent_frames, device)
    return dict(hidden_states=hidden.to(device, dtype), encoder_hidden_states=text.to(device, dtype),
                timestep=torch.full((2,), 500, device=device, dtype=torch.long), image_rotary_emb=rope)


def video_tokens(config, height: int, width: int, frames: int) -> int:
    """Video tokens of one sample: padded latent frames / 2 x (H/16) x (W/16)."""
    latent_frames = (frames - 1) // 4 + 1
    latent_frames += (-latent_frames) % config.patch_size_t
    return latent_frames // config.patch_size_t * (height // 16) * (width // 16)


def tiny_part(section: dict[str, Any], device: torch.device) -> None:
    """hyv_lib's attention on this device against diffusers' fp32 forward on the CPU, tiny CogVideoX."""
    preset = get_preset("cogvideox_tiny")
    adapter = get_adapter(preset.model)
    torch.manual_seed(0)
    oracle = adapter.build(preset.transformer).eval()
    mine = adapter.build(preset.transformer).eval()
    mine.load_state_dict(oracle.state_dict())
    mine = mine.to(device)
    adapter.use_attention(mine, "auto")
    height, width, frames = TINY_SIZES["small"]
    inputs = forward_inputs(oracle.config, height, width, frames, "cpu", torch.float32)
    with torch.no_grad():
        expected = oracle(**inputs, return_dict=False)[0]
        on_device = {k: tuple(t.to(device) for t in v) if isinstance(v, tuple) else v.to(device)
                     for k, v in inputs.items()}
        got = mine(**on_device, return_dict=False)[0].cpu()
    section["tiny"] = dict(backend=resolve_backend("auto", device, torch.float32), size=[height, width, frames],
                           max_abs_diff=float((got - expected).abs().max()),
                           max_abs_output=float(expected.abs().max()))
    print(f"  cogvideox tiny: {section['tiny']}", flush=True)


def real_part(section: dict[str, Any], device, clock, budget, tiny: bool, helpers: dict[str, Any]) -> None:
    """The real-size (or, with ``tiny``, the tiny preset's) step: diffusers' stock forward vs hyv_lib's attention,
    then hyv_lib's with the blocks compiled (:func:`compiled_rows`)."""
    preset = get_preset("cogvideox_tiny" if tiny else "cogvideox1.5_5b")
    adapter = get_adapter(preset.model)
    dtype = torch.float32 if tiny else torch.bfloat16
    with torch.device("meta"):
        model = adapter.build(preset.transformer).to(dtype)
    model = model.to_empty(device=device).eval().requires_grad_(False)
    helpers["init_weights"](model)
    stock = {name: m.processor for name, m in model.named_modules() if hasattr(m, "processor")}
    section["parameters"] = sum(p.numel() for p in model.parameters())
    chip = helpers["chip_key"](device)
    outputs: dict[tuple[str, str], torch.Tensor] = {}
    for size, (height, width, frames) in (TINY_SIZES if tiny else REAL_SIZES).items():
        inputs = forward_inputs(model.config, height, width, frames, device, dtype)
        tokens = video_tokens(model.config, height, width, frames)
        try:
            from hyv_lib.planning.costs import step_flops

            flops = step_flops(preset, height, width, frames, batch=2)["total"]
        except Exception as err:  # noqa: BLE001 - the cost model may not count this model: MFU is left out
            flops, section["flops_note"] = None, f"{type(err).__name__}: {err}"[:300]
        for which in ("hyv_lib", "diffusers"):
            row: dict[str, Any] = dict(name=f"cogvideox {which} {size}", size=[height, width, frames],
                                       video_tokens=tokens, text_tokens=model.config.max_text_seq_length)
            section["rows"].append(row)
            if not budget.allows(20 if tiny else 45):
                row.update(status="skipped", reason="time budget")
                continue
            try:
                if which == "diffusers":
                    for name, module in model.named_modules():
                        if name in stock:
                            module.set_processor(stock[name])
                    row["backend"] = "diffusers stock (SDPA)"
                else:
                    adapter.use_attention(model, "auto")
                    row["backend"] = resolve_backend("auto", device, dtype)

                def fn():
                    return model(**inputs, return_dict=False)[0]

                with torch.no_grad(), helpers["gpu_memory"](device, row):
                    fn()  # warm-up
                    seconds, out = clock.time(fn, 1 if not tiny else 2)
                row.update(status="ok", s_per_step=round(seconds, 3), finite=bool(torch.isfinite(out).all()))
                if flops:
                    row["tflop"] = round(flops / 1e12, 1)
                    if chip:
                        row["mfu"] = round(helpers["mfu"](flops, seconds, chip, 1), 3)
                outputs[(which, size)] = out.float().cpu()
                del out
            except Exception as err:  # noqa: BLE001
                helpers["row_failure"](row, err)
            helpers["free_memory"]()
            print(f"  {row['name']}: {row.get('s_per_step', row.get('reason', row.get('error')))}", flush=True)
        mine, theirs = outputs.get(("hyv_lib", size)), outputs.get(("diffusers", size))
        if mine is not None and theirs is not None:
            diff = (mine - theirs).abs()
            rows = {r["name"]: r for r in section["rows"]}
            section.setdefault("compare", {})[size] = dict(
                speedup=round(rows[f"cogvideox diffusers {size}"]["s_per_step"]
                              / rows[f"cogvideox hyv_lib {size}"]["s_per_step"], 3),
                max_abs_diff=float(diff.max()), max_abs_output=float(theirs.abs().max()),
                relative_l2=float(diff.norm() / theirs.norm().clamp_min(1e-30)))
    compiled_rows(section, model, adapter, preset, dtype, device, clock, budget, tiny, helpers, outputs)


def compiled_rows(section, model, adapter, preset, dtype, device, clock, budget, tiny, helpers, outputs) -> None:
    """The step with hyv_lib's attention and the blocks compiled in place (after every eager row), per size: first
    call (compile + run), steady s/step, the ratios to the eager hyv_lib and diffusers rows and the difference to the
    eager hyv_lib output (``compare["compiled <size>"]``)."""
    rows = {r["name"]: r for r in section["rows"]}
    chip = helpers["chip_key"](device)
    step = None
    for size, (height, width, frames) in (TINY_SIZES if tiny else REAL_SIZES).items():
        row: dict[str, Any] = dict(name=f"cogvideox hyv_lib compiled {size}", size=[height, width, frames],
                                   compile="make_step(model, 'torch', attention='auto', compile=True)",
                                   compile_mode="default")
        section["rows"].append(row)
        if not tiny:
            row["target"] = COMPILED_TARGET["text"]
        if not budget.allows(20 if tiny else 150):
            row.update(status="skipped", reason="time budget")
            continue
        try:
            if step is None:
                torch.compiler.reset()  # compiles from nothing, not from another section's graphs
                step = make_step(model, "torch", attention="auto", adapter=adapter, compile=True)
            row["backend"] = resolve_backend("auto", device, dtype)
            inputs = forward_inputs(model.config, height, width, frames, device, dtype)
            with torch.no_grad(), helpers["gpu_memory"](device, row):
                first_s, _ = clock.time(lambda: step(**inputs))
                seconds, out = clock.time(lambda: step(**inputs), 2 if tiny else 1)
            row.update(status="ok", first_call_s=round(first_s, 2), compile_s=round(first_s - seconds, 2),
                       s_per_step=round(seconds, 3), finite=bool(torch.isfinite(out).all()))
            compare: dict[str, Any] = dict(against="eager hyv_lib attention, same weights and inputs")
            for which, key in (("hyv_lib", "speedup_vs_eager"), ("diffusers", "speedup_vs_diffusers")):
                other = rows.get(f"cogvideox {which} {size}", {})
                if other.get("status") == "ok":
                    row[key] = compare[key] = round(other["s_per_step"] / seconds, 3)
            eager = outputs.get(("hyv_lib", size))
            if eager is not None:
                diff = out.float().cpu() - eager
                compare.update(max_abs_diff_vs_eager=float(diff.abs().max()), max_abs_output=float(eager.abs().max()),
                               relative_l2_vs_eager=float(diff.norm() / eager.norm().clamp_min(1e-30)))
            section.setdefault("compare", {})[f"compiled {size}"] = compare
            if "target" in row:
                row["target_met"] = bool(row.get("speedup_vs_diffusers", 0) >= COMPILED_TARGET["speedup"])
            if chip and "flops_note" not in section:  # the cost model counts this model (see real_part)
                from hyv_lib.planning.costs import step_flops

                flops = step_flops(preset, height, width, frames, batch=2)["total"]
                row["mfu"] = round(helpers["mfu"](flops, seconds, chip, 1), 3)
            del out
        except Exception as err:  # noqa: BLE001
            helpers["row_failure"](row, err)
        helpers["free_memory"]()
        print(f"  {row['name']}: {row.get('s_per_step', row.get('reason', row.get('error')))} s/step, first call "
              f"{row.get('first_call_s')} s", flush=True)
    del step
    torch.compiler.reset()  # drops the compiled blocks' references to the model, which the caller frees next


def cogvideox_section(section, device, clock, budget, tiny: bool, helpers: dict[str, Any]) -> None:
    """The section: the tiny equality, then the real (or tiny) step rows. ``helpers`` are gpu_check's measuring
    functions (init_weights, gpu_memory, chip_key, mfu, row_failure, free_memory)."""
    section["reference"] = ("gpu-tpu-pedia (single author), TPU v6e-8, data=2 x tensor=4: 1.13 s/step at 768x1360x81; "
                            "~2.13 s/step at 720x1280x81 (106.47 s end to end, 50 steps)")
    tiny_part(section, device)
    real_part(section, device, clock, budget, tiny, helpers)

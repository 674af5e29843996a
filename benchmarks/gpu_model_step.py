"""gpu_check.py's per-model step sections (``cogvideox``, ``hunyuanvideo``): one model's denoising step on one GPU,
diffusers' stock forward against the same forward with hyv_lib's attention, then with the blocks compiled.

A :class:`ModelStep` names what differs between models (presets, sizes, the forward's keywords, the batch of one
step); the rows are the same for every model:

- ``tiny``: the model's tiny preset (fp32, seeded weights) on this device with hyv_lib's attention against diffusers'
  eager fp32 forward on the CPU (the oracle): the max difference.
- one row per size and side: diffusers' stock forward and the same forward with hyv_lib's attention (``auto``) on
  the same random bf16 weights of the real preset: s/step, peak memory, MFU by
  :func:`hyv_lib.planning.costs.step_flops` where it counts the model, and the output difference;
- last, the step with the blocks compiled (``make_step(model, "torch", attention="auto", compile=True)``: regional
  torch.compile, attention as one custom op; in place, so after every eager row): the first call apart from the
  steady s/step, the ratios to the eager and diffusers rows and the difference to the eager output.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import torch

from hyv_lib.kernels.dispatch import resolve_backend
from hyv_lib.models.families import get_preset
from hyv_lib.models.registry import get_adapter
from hyv_lib.runtimes.step import make_step


@dataclasses.dataclass(frozen=True)
class ModelStep:
    """What one model's step section needs: ``key`` (the section's and rows' name), its ``tiny`` and ``real``
    presets, ``real_sizes`` / ``tiny_sizes`` ({label: (height, width, frames)}), ``inputs(preset, config, height,
    width, frames, device, dtype)`` (the forward's keywords, one step's batch), ``tokens(config, height, width, frames)``
    (video tokens, text tokens of one sample), ``batch`` (samples per step: 2 for a CFG pair, 1 with embedded
    guidance), ``reference`` (a published number to put beside the rows) and ``target`` (the compiled rows' goal
    against diffusers' stock forward, or None)."""

    key: str
    tiny: str
    real: str
    real_sizes: dict[str, tuple[int, int, int]]
    tiny_sizes: dict[str, tuple[int, int, int]]
    inputs: Callable[..., dict[str, Any]]
    tokens: Callable[..., tuple[int, int]]
    batch: int
    reference: str
    target: dict[str, Any] | None = None


def on_device(inputs: dict[str, Any], device) -> dict[str, Any]:
    return {k: tuple(t.to(device) for t in v) if isinstance(v, tuple) else v.to(device) for k, v in inputs.items()}


def tiny_part(spec: ModelStep, section: dict[str, Any], device: torch.device) -> None:
    """hyv_lib's attention on this device against diffusers' fp32 forward on the CPU, the tiny model."""
    preset = get_preset(spec.tiny)
    adapter = get_adapter(preset.model)
    torch.manual_seed(0)
    oracle = adapter.build(preset.transformer).eval()
    mine = adapter.build(preset.transformer).eval()
    mine.load_state_dict(oracle.state_dict())
    mine = mine.to(device)
    adapter.use_attention(mine, "auto")
    height, width, frames = next(iter(spec.tiny_sizes.values()))
    inputs = spec.inputs(preset, oracle.config, height, width, frames, "cpu", torch.float32)
    with torch.no_grad():
        expected = oracle(**inputs, return_dict=False)[0]
        got = mine(**on_device(inputs, device), return_dict=False)[0].cpu()
    section["tiny"] = dict(backend=resolve_backend("auto", device, torch.float32), size=[height, width, frames],
                           max_abs_diff=float((got - expected).abs().max()),
                           max_abs_output=float(expected.abs().max()))
    print(f"  {spec.key} tiny: {section['tiny']}", flush=True)


def step_flops_or_note(spec: ModelStep, section: dict[str, Any], preset, height: int, width: int,
                       frames: int) -> float | None:
    """The analytic FLOPs of one step, or None with the reason in ``section["flops_note"]``."""
    try:
        from hyv_lib.planning.costs import step_flops

        return step_flops(preset, height, width, frames, batch=spec.batch)["total"]
    except Exception as err:  # noqa: BLE001 - the cost model may not count this model: MFU is left out
        section["flops_note"] = f"{type(err).__name__}: {err}"[:300]
        return None


def real_part(spec: ModelStep, section: dict[str, Any], device, clock, budget, tiny: bool,
              helpers: dict[str, Any]) -> None:
    """The real-size (or, with ``tiny``, the tiny preset's) step: diffusers' stock forward vs hyv_lib's attention,
    then hyv_lib's with the blocks compiled (:func:`compiled_rows`)."""
    preset = get_preset(spec.tiny if tiny else spec.real)
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
    for size, (height, width, frames) in (spec.tiny_sizes if tiny else spec.real_sizes).items():
        inputs = spec.inputs(preset, model.config, height, width, frames, device, dtype)
        video, text = spec.tokens(model.config, height, width, frames)
        flops = step_flops_or_note(spec, section, preset, height, width, frames)
        for which in ("hyv_lib", "diffusers"):
            row: dict[str, Any] = dict(name=f"{spec.key} {which} {size}", size=[height, width, frames],
                                       video_tokens=video, text_tokens=text, batch=spec.batch)
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
                speedup=round(rows[f"{spec.key} diffusers {size}"]["s_per_step"]
                              / rows[f"{spec.key} hyv_lib {size}"]["s_per_step"], 3),
                max_abs_diff=float(diff.max()), max_abs_output=float(theirs.abs().max()),
                relative_l2=float(diff.norm() / theirs.norm().clamp_min(1e-30)))
    compiled_rows(spec, section, model, adapter, preset, dtype, device, clock, budget, tiny, helpers, outputs)


def compiled_rows(spec: ModelStep, section, model, adapter, preset, dtype, device, clock, budget, tiny, helpers,
                  outputs) -> None:
    """The step with hyv_lib's attention and the blocks compiled in place (after every eager row), per size: first
    call (compile + run), steady s/step, the ratios to the eager hyv_lib and diffusers rows and the difference to the
    eager hyv_lib output (``compare["compiled <size>"]``)."""
    rows = {r["name"]: r for r in section["rows"]}
    chip = helpers["chip_key"](device)
    step = None
    for size, (height, width, frames) in (spec.tiny_sizes if tiny else spec.real_sizes).items():
        row: dict[str, Any] = dict(name=f"{spec.key} hyv_lib compiled {size}", size=[height, width, frames],
                                   compile="make_step(model, 'torch', attention='auto', compile=True)",
                                   compile_mode="default")
        section["rows"].append(row)
        if not tiny and spec.target:
            row["target"] = spec.target["text"]
        if not budget.allows(20 if tiny else 150):
            row.update(status="skipped", reason="time budget")
            continue
        try:
            if step is None:
                torch.compiler.reset()  # compiles from nothing, not from another section's graphs
                step = make_step(model, "torch", attention="auto", adapter=adapter, compile=True)
            row["backend"] = resolve_backend("auto", device, dtype)
            inputs = spec.inputs(preset, model.config, height, width, frames, device, dtype)
            with torch.no_grad(), helpers["gpu_memory"](device, row):
                first_s, _ = clock.time(lambda: step(**inputs))
                seconds, out = clock.time(lambda: step(**inputs), 2 if tiny else 1)
            row.update(status="ok", first_call_s=round(first_s, 2), compile_s=round(first_s - seconds, 2),
                       s_per_step=round(seconds, 3), finite=bool(torch.isfinite(out).all()))
            compare: dict[str, Any] = dict(against="eager hyv_lib attention, same weights and inputs")
            for which, key in (("hyv_lib", "speedup_vs_eager"), ("diffusers", "speedup_vs_diffusers")):
                other = rows.get(f"{spec.key} {which} {size}", {})
                if other.get("status") == "ok":
                    row[key] = compare[key] = round(other["s_per_step"] / seconds, 3)
            eager = outputs.get(("hyv_lib", size))
            if eager is not None:
                diff = out.float().cpu() - eager
                compare.update(max_abs_diff_vs_eager=float(diff.abs().max()), max_abs_output=float(eager.abs().max()),
                               relative_l2_vs_eager=float(diff.norm() / eager.norm().clamp_min(1e-30)))
            section.setdefault("compare", {})[f"compiled {size}"] = compare
            if "target" in row:
                row["target_met"] = bool(row.get("speedup_vs_diffusers", 0) >= spec.target["speedup"])
            if chip and "flops_note" not in section:  # the cost model counts this model (see real_part)
                flops = step_flops_or_note(spec, section, preset, height, width, frames)
                row["mfu"] = round(helpers["mfu"](flops, seconds, chip, 1), 3)
            del out
        except Exception as err:  # noqa: BLE001
            helpers["row_failure"](row, err)
        helpers["free_memory"]()
        print(f"  {row['name']}: {row.get('s_per_step', row.get('reason', row.get('error')))} s/step, first call "
              f"{row.get('first_call_s')} s", flush=True)
    del step
    torch.compiler.reset()  # drops the compiled blocks' references to the model, which the caller frees next


def model_step_section(spec: ModelStep, section, device, clock, budget, tiny: bool, helpers: dict[str, Any]) -> None:
    """The section: the tiny equality, then the real (or tiny) step rows. ``helpers`` are gpu_check's measuring
    functions (init_weights, gpu_memory, chip_key, mfu, row_failure, free_memory)."""
    section["reference"] = spec.reference
    tiny_part(spec, section, device)
    real_part(spec, section, device, clock, budget, tiny, helpers)

"""gpu_check.py's ``ssta`` section: SSTA sparse attention against the dense default on one GPU, same inputs and weights.

- ``attention`` rows, per size (720p/121f and 480p/121f; CFG batch 2, 16 heads x 128, context padded as a real prompt
  pads it): hyv_lib's dense default (``auto``), SSTA through FlexAttention at the official parameters
  (``backend="ssta"``, :class:`hyv_lib.SstaConfig`'s defaults) and the window alone (``sparse_type="sta"``): ms, peak
  memory, the tile density, the time of building the mask alone, and the largest error against a float32 reference
  computed on a slice of query tiles over exactly the tokens of their attended tiles.
- ``step`` rows: one denoising step of the full 54-block DiT with random bf16 weights, the CFG batch at each size with
  dense attention and with SSTA, then the CFG-distilled sparse preset's batch of one (``720p_t2v_distilled_sparse``:
  guidance 1.0, SSTA on): s/step, peak memory and how far the sparse output is from the dense one (random weights:
  a number for the record, not a quality measure). Last, if the budget allows, SSTA with every block compiled
  (``torch.compile`` per block, the regional recipe).

The issue's target on one H200: a 720p/121f CFG step <= 12.5 s with SSTA (dense 24.7 s, measured before this
section existed).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from hyv_lib.models.families import get_preset
from hyv_lib.kernels.dispatch import attention, resolve_backend
from hyv_lib.kernels.ssta import SstaConfig, density
from hyv_lib.kernels.ssta_torch import ssta_inputs
from hyv_lib.models.hunyuan_video15.layout import context_tokens
from hyv_lib.models.registry import get_adapter

#: The real sizes, and the tiny twins ``--tiny`` runs on the CPU (tiles scaled to the tiny grid).
REAL = dict(preset="720p_t2v", sparse_preset="720p_t2v_distilled_sparse",
            sizes={"720p": (720, 1280, 121), "480p": (480, 848, 121)}, config=SstaConfig(), repeats=3,
            reference_tiles=6)
TINY = dict(preset="tiny", sparse_preset="tiny", sizes={"small": (128, 160, 9)},
            config=SstaConfig(tile=(1, 4, 4), window=(3, 3, 3), topk=4), repeats=1, reference_tiles=3)


def grid_of(preset, height: int, width: int, frames: int) -> tuple[int, int, int]:
    """The video's token grid (1x1x1 patches: the latent grid)."""
    return tuple(preset.latent_shape(height, width, frames)[2:])


def slice_reference(qt, kt, vt, mask, layout, tiles: list[int]) -> torch.Tensor:
    """float32 outputs of the query tiles ``tiles`` (tile layout), softmax over every token of their attended tiles:
    [B, H, len(tiles) * tile_tokens, D]."""
    size = layout.tile_tokens
    b, h = qt.shape[:2]
    out = torch.empty(b, h, len(tiles) * size, qt.shape[-1], dtype=torch.float32, device=qt.device)
    for bi in range(b):
        for hi in range(h):
            for n, tile in enumerate(tiles):
                keys = torch.nonzero(mask[bi, hi, tile]).flatten()
                cols = (keys[:, None] * size + torch.arange(size, device=qt.device)).flatten()
                q = qt[bi, hi, tile * size: (tile + 1) * size].float()
                scores = q @ kt[bi, hi, cols].float().T / math.sqrt(qt.shape[-1])
                out[bi, hi, n * size: (n + 1) * size] = torch.softmax(scores, -1) @ vt[bi, hi, cols].float()
    return out


def real_positions(layout, device) -> torch.Tensor:
    """Index (into the S unpadded tokens) of each position of the tile layout, -1 where it is padding."""
    from hyv_lib.kernels.ssta import to_tiles

    s = layout.video_tokens + layout.text_len
    index = torch.arange(1, s + 1, dtype=torch.float64, device=device).view(1, 1, s, 1)
    tiled = to_tiles(index, layout, "zero").flatten().long() - 1
    tiled[layout.video_tiles * layout.tile_tokens + layout.text_len:] = -1  # the text's repeated last token
    return tiled


def attention_rows(section, device, clock, budget, cfg, tiny, helpers) -> None:
    preset = get_preset(cfg["preset"])
    heads, head_dim = preset.transformer["num_attention_heads"], preset.transformer["attention_head_dim"]
    for size, (height, width, frames) in cfg["sizes"].items():
        grid = grid_of(preset, height, width, frames)
        mask, nv = helpers["joint_mask"](preset, height, width, frames, device)
        b, s = mask.shape
        g = torch.Generator(device=device).manual_seed(0)
        q, k, v = (torch.randn(b, heads, s, head_dim, generator=g, device=device, dtype=torch.bfloat16)
                   for _ in range(3))
        dense_flops = sum(4 * heads * n * n * head_dim for n in mask.sum(1).tolist())
        base = dict(size=[height, width, frames], grid=list(grid), tokens=s, video_tokens=nv,
                    context_tokens=context_tokens(preset))
        variants = [("dense", None), ("ssta", cfg["config"]),
                    ("sta window only", SstaConfig(**{**cfg["config"].__dict__, "sparse_type": "sta"}))]
        for name, config in variants:
            row: dict[str, Any] = dict(name=f"{name} {size}", **base)
            section["rows"].append(row)
            if not budget.allows(30 if not tiny else 1):
                row.update(status="skipped", reason="time budget")
                continue
            try:
                if config is None:
                    row["backend"] = resolve_backend("auto", device, torch.bfloat16)

                    def fn():
                        return attention(q, k, v, mask, backend="auto")
                else:
                    row.update(backend="ssta (FlexAttention)", config=dict(config.for_grid(grid).__dict__))

                    def fn(config=config):
                        return attention(q, k, v, mask, backend="ssta", grid=grid, ssta=config)
                with helpers["gpu_memory"](device, row):
                    start = clock_now(clock)
                    fn()  # warm-up: compiles FlexAttention for this shape
                    row["first_call_s"] = round(clock_now(clock) - start, 1)
                    seconds, out = clock.time(fn, cfg["repeats"])
                row.update(status="ok", ms=round(seconds * 1e3, 2), dense_tflop=round(dense_flops / 1e12, 2),
                           dense_equivalent_tflops=round(dense_flops / seconds / 1e12, 1))
                if config is not None:
                    qt, kt, vt, layout, tiles = ssta_inputs(q, k, v, mask, grid, config)
                    mask_s, _ = clock.time(lambda: ssta_inputs(q, k, v, mask, grid, config), cfg["repeats"])
                    row.update(mask_ms=round(mask_s * 1e3, 2), tile_density=round(density(tiles), 4),
                               tiles=[layout.video_tiles, layout.text_tiles], tile_tokens=layout.tile_tokens,
                               padded_tokens=layout.padded_length)
                    picks = torch.linspace(0, layout.video_tiles + layout.text_tiles - 1,
                                           cfg["reference_tiles"]).round().long().tolist()
                    expected = slice_reference(qt, kt, vt, tiles, layout, picks)
                    positions = real_positions(layout, device).view(-1, layout.tile_tokens)[picks].flatten()
                    keep = positions >= 0
                    got = out[:, :, positions[keep]].float()
                    row["max_error"] = float((got - expected[:, :, keep]).abs().max())
                    row["max_reference"] = float(expected[:, :, keep].abs().max())  # bf16's rounding scales with it
                    row["reference_tiles"] = picks
                    del qt, kt, vt, tiles, expected, got
                del out
            except Exception as err:  # noqa: BLE001
                helpers["row_failure"](row, err)
            helpers["free_memory"]()
            print(f"  ssta attention {row['name']}: {row.get('ms', row.get('reason', row.get('error')))} ms, "
                  f"density {row.get('tile_density', 1.0)}", flush=True)
        dense = next((r for r in section["rows"] if r["name"] == f"dense {size}" and "ms" in r), None)
        sparse = next((r for r in section["rows"] if r["name"] == f"ssta {size}" and "ms" in r), None)
        if dense and sparse:
            section.setdefault("compare", {})[f"attention {size}"] = dict(
                speedup=round(dense["ms"] / sparse["ms"], 3), tile_density=sparse["tile_density"])


def clock_now(clock) -> float:
    import time

    clock.sync()
    return time.perf_counter()


def step_rows(section, device, clock, budget, cfg, tiny, helpers) -> None:
    preset = get_preset(cfg["preset"])
    adapter = get_adapter(preset.model)
    model = helpers["build_transformer"](preset, device)
    outputs: dict[str, torch.Tensor] = {}
    sizes = list(cfg["sizes"].items())
    sparse_preset = get_preset(cfg["sparse_preset"])
    runs = [(f"step {kind} {size}", size, dims, kind, 2) for size, dims in sizes for kind in ("dense", "ssta")]
    runs.append((f"step {sparse_preset.name} batch 1 {sizes[0][0]}", sizes[0][0], sizes[0][1], "ssta", 1))
    # last: the blocks stay compiled
    runs.append((f"step ssta compiled blocks {sizes[0][0]}", sizes[0][0], sizes[0][1], "ssta compiled", 2))
    chip = helpers["chip_key"](device)
    from hyv_lib.planning.costs import step_flops

    for name, size, (height, width, frames), kind, batch in runs:
        row: dict[str, Any] = dict(name=name, size=[height, width, frames], batch=batch)
        section["rows"].append(row)
        need = 1 if tiny else {"480p": 30, "720p": 80}[size] * (2 if "compiled" in kind else 1) / (3 - batch)
        if not budget.allows(need):
            row.update(status="skipped", reason="time budget")
            continue
        try:
            if kind == "dense":
                adapter.use_attention(model, "auto")
                row["backend"] = resolve_backend("auto", device, torch.bfloat16)
            else:
                adapter.use_attention(model, "ssta", ssta=cfg["config"])
                row["backend"] = "ssta"
            if kind == "ssta compiled":
                for block in adapter.blocks(model):
                    block.compile()
            kwargs = helpers["step_inputs"](preset, height, width, frames, device)
            kwargs = {k: v[:batch] for k, v in kwargs.items()}

            def fn():
                return model(**kwargs, return_dict=False)[0]

            with torch.no_grad(), helpers["gpu_memory"](device, row):
                start = clock_now(clock)
                fn()  # warm-up (and compilation)
                row["first_call_s"] = round(clock_now(clock) - start, 1)
                seconds, out = clock.time(fn, 2 if (size == "480p" or tiny) else 1)
            flops = step_flops(preset, height, width, frames, batch=batch)["total"]
            row.update(status="ok", s_per_step=round(seconds, 3), dense_tflop=round(flops / 1e12, 1),
                       finite=bool(torch.isfinite(out).all()))
            if chip:
                row["dense_equivalent_mfu"] = round(helpers["mfu"](flops, seconds, chip, 1), 3)
            outputs[name] = out.float().cpu()
            del out
        except Exception as err:  # noqa: BLE001
            helpers["row_failure"](row, err)
        helpers["free_memory"]()
        print(f"  ssta step {name}: {row.get('s_per_step', row.get('reason', row.get('error')))} s", flush=True)
    for size, _ in sizes:
        dense, sparse = outputs.get(f"step dense {size}"), outputs.get(f"step ssta {size}")
        rows = {r["name"]: r for r in section["rows"]}
        if dense is not None and sparse is not None:
            section.setdefault("compare", {})[f"step {size}"] = dict(
                speedup=round(rows[f"step dense {size}"]["s_per_step"] / rows[f"step ssta {size}"]["s_per_step"], 3),
                relative_l2_sparse_vs_dense=float((sparse - dense).norm() / dense.norm().clamp_min(1e-30)))
    del model


def ssta_section(section: dict[str, Any], device, clock, budget, tiny: bool, helpers: dict[str, Any],
                 sizes: list[str] | None = None) -> None:
    """The section (see the module docstring); ``helpers``: gpu_check's measuring functions by name; ``sizes``: a
    subset of the size names (``--step_sizes``; None: all)."""
    cfg = dict(TINY if tiny else REAL)
    if sizes:
        cfg["sizes"] = {name: dims for name, dims in cfg["sizes"].items() if name in sizes} or cfg["sizes"]
    section.update(config=dict(cfg["config"].__dict__), preset=cfg["preset"], sparse_preset=cfg["sparse_preset"])
    attention_rows(section, device, clock, budget, cfg, tiny, helpers)
    step_rows(section, device, clock, budget, cfg, tiny, helpers)


# ------------------------------------------------------------------------------------------ backward
def backward_section(section: dict[str, Any], device, clock, budget, tiny: bool, helpers: dict[str, Any]) -> None:
    """``ssta_backward``: SSTA's gradients on this device (compiled FlexAttention's backward on CUDA; hyv_lib's tile
    backward on the CPU) against autograd through the float32 reference, per call and through the tiny DiT.

    - ``attention``: q, k, v [2, 4, S, 64] in float32 and bf16 on a 5x16x24 grid with 2x8x8 tiles (128 tokens: a
      block size FlexAttention's CUDA kernel takes) and 77 context tokens, one sample's text cut short; the loss is
      the output against a fixed random tensor. The largest gradient error of q, k and v relative to the largest
      reference gradient.
    - ``model``: the tiny preset's DiT (float32) with ``use_attention(model, "ssta")`` and with ``"ssta_reference"``,
      the same latents: the loss and the largest relative error over every parameter's gradient."""
    import copy

    from hyv_lib.kernels.ssta_torch import ssta_reference
    from hyv_lib.models.components import build_tiny_components
    from hyv_lib.models.hunyuan_video15.components import example_forward_kwargs

    grid, tile = (5, 16, 24), (2, 8, 8)
    config = SstaConfig(tile=tile, window=(1, 3, 3), topk=4)
    text = 77
    s = math.prod(grid) + text
    for dtype, name in ((torch.float32, "fp32"), (torch.bfloat16, "bf16")):
        row: dict[str, Any] = dict(name=f"attention backward {name}", grid=list(grid), tile=list(tile))
        section["rows"].append(row)
        try:
            g = torch.Generator(device=device).manual_seed(0)
            q, k, v = (torch.randn(2, 4, s, 64, generator=g, device=device, dtype=dtype) for _ in range(3))
            target = torch.randn(2, 4, s, 64, generator=g, device=device)
            kv_mask = torch.ones(2, s, dtype=torch.bool, device=device)
            kv_mask[1, math.prod(grid) + 20:] = False
            grads = {}
            for kind in ("ssta", "reference"):
                leaves = [x.detach().clone().requires_grad_(True) for x in (q, k, v)]
                if kind == "ssta":
                    out = attention(*leaves, kv_mask, backend="ssta", grid=grid, ssta=config)
                else:
                    out = ssta_reference(*[x.float() for x in leaves], kv_mask, grid=grid, ssta=config)
                ((out.float() - target) ** 2).mean().backward()
                grads[kind] = [x.grad.float() for x in leaves]
            scale = max(float(g_.abs().max()) for g_ in grads["reference"])
            row.update(status="ok", max_relative_error=max(float((a - b).abs().max()) / scale
                                                           for a, b in zip(grads["ssta"], grads["reference"])))
        except Exception as err:  # noqa: BLE001
            helpers["row_failure"](row, err)
        print(f"  {row['name']}: {row.get('max_relative_error', row.get('error'))}", flush=True)
    row = dict(name="tiny DiT gradients fp32", grid=[5, 16, 24], tile=list(tile))
    section["rows"].append(row)
    try:
        preset = get_preset("tiny")
        base = build_tiny_components(preset, names=["transformer"])["transformer"].to(device)
        kwargs = {key: value.to(device) for key, value in
                  example_forward_kwargs(preset, latent=(5, 16, 24), text_lengths=(14, 40)).items()}
        results = {}
        for backend in ("ssta", "ssta_reference"):
            model = copy.deepcopy(base).requires_grad_(True)
            get_adapter(preset.model).use_attention(model, backend, ssta=config)
            loss = model(**kwargs, return_dict=False)[0].square().mean()
            loss.backward()
            results[backend] = (loss.item(), {n: p.grad.float() for n, p in model.named_parameters()
                                              if p.grad is not None})
        (loss, mine), (ref_loss, ref) = results["ssta"], results["ssta_reference"]
        scale = max(float(g_.abs().max()) for g_ in ref.values())
        row.update(status="ok", loss=loss, reference_loss=ref_loss, parameters=len(ref),
                   max_relative_error=max(float((mine[n] - ref[n]).abs().max()) / scale for n in ref))
    except Exception as err:  # noqa: BLE001
        helpers["row_failure"](row, err)
    print(f"  {row['name']}: {row.get('max_relative_error', row.get('error'))}", flush=True)

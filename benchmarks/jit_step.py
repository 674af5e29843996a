"""Per-step time of the jitted torchax/JAX step vs diffusers' eager forward, and cold vs cached compile time.

A "bench" configuration larger than tiny: width 256 (2 heads x 128), 4 dual-stream blocks, F x 24 x 40
latents (F = 2, 3, 4: 1,920 / 2,880 / 3,840 video tokens, + 176 context tokens), CFG batch of 2, fp32 on
this CPU. Not a unit test:

    .venv/bin/python benchmarks/jit_step.py [--repeats 5] [--frames 2 3 4]

Goal of the torch->JAX chapter: jitted >= 1.5x faster than eager. Two jitted variants are timed: attention in
XLA (``xla``, blockwise online softmax; what runs on any JAX backend) and attention handed to torch's fused CPU
flash kernel from inside the jitted step (``host_sdpa``, jax.pure_callback; CPU backend only). XLA fuses the
rest of the step (linear layers, norms, modulation, RoPE) but its attention is slower than torch's, and
attention (quadratic) takes a growing share of the step as the token count grows.
Absolute times only compare within one run on one machine.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
import tempfile
import time

LATENT = [4, 24, 40]
HEADS = [2]


def bench_model():
    import torch
    from diffusers import HunyuanVideo15Transformer3DModel

    from hyv_lib.models.families import get_preset

    config = dict(get_preset("tiny").transformer, num_attention_heads=HEADS[0], attention_head_dim=128, num_layers=4,
                  rope_axes_dim=[16, 56, 56])
    torch.manual_seed(0)
    return HunyuanVideo15Transformer3DModel(**config).eval().requires_grad_(False)


def bench_inputs():
    import torch

    from hyv_lib.models.families import get_preset

    tiny = get_preset("tiny")
    g = torch.Generator().manual_seed(0)
    c = tiny.latent_channels
    return dict(
        hidden_states=torch.randn(2, 2 * c + 1, *LATENT, generator=g), timestep=torch.tensor([500.0, 500.0]),
        encoder_hidden_states=torch.randn(2, tiny.text_len, tiny.text_dim, generator=g),
        encoder_attention_mask=(torch.arange(tiny.text_len)[None] < torch.tensor([[14], [60]])).long(),
        encoder_hidden_states_2=torch.zeros(2, tiny.byt5_len, tiny.byt5_dim),
        encoder_attention_mask_2=torch.zeros(2, tiny.byt5_len, dtype=torch.long),
        image_embeds=torch.zeros(2, tiny.image_tokens, tiny.image_dim),
    )


def median_time(fn, repeats: int) -> float:
    import statistics

    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def eager_probe(repeats: int) -> dict:
    """In a child process that never imports JAX: median time of diffusers' eager forward.

    In a process where JAX and torchax are loaded the same eager forward measured ~10% slower on this
    machine (872-955 vs 764-807 ms at 1,920 tokens), so eager gets a clean process of its own.
    """
    import torch

    torch.set_num_threads(os.cpu_count() or 1)
    model, kwargs = bench_model(), bench_inputs()
    with torch.no_grad():
        model(**kwargs)  # warm-up
        return {"eager_s": median_time(lambda: model(**kwargs), repeats), "jax_loaded": "jax" in sys.modules}


def in_child(args, frames: int, *probe_args: str) -> dict:
    """Run this script as a child process in probe mode (``probe_args``); its last stdout line is JSON."""
    command = [sys.executable, __file__, "--heads", str(args.heads), "--frames", str(frames),
               "--repeats", str(args.repeats), *probe_args]
    return json.loads(subprocess.run(command, capture_output=True, text=True, check=True).stdout.splitlines()[-1])


def compile_probe(cache_dir: str) -> dict:
    """In a child process: time the first call (trace + compile, or cache load) of the jitted step."""
    from hyv_lib.parallel.jax_env import enable_compile_cache
    from hyv_lib.runtimes.jax_step import JaxTransformer

    enable_compile_cache(cache_dir)
    tpu = JaxTransformer(bench_model())
    kwargs = bench_inputs()
    start = time.perf_counter()
    tpu(**kwargs)
    return {"first_call_s": time.perf_counter() - start}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5, help="timed calls per measurement (medians are reported)")
    parser.add_argument("--heads", type=int, default=2, help="attention heads of 128 (width = 128 x heads)")
    parser.add_argument("--frames", type=int, nargs="+", default=[2, 3, 4], help="latent frames of 24 x 40 tokens")
    parser.add_argument("--compile-probe", help=argparse.SUPPRESS)
    parser.add_argument("--eager-probe", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    HEADS[0] = args.heads
    if args.eager_probe or args.compile_probe:
        LATENT[0] = args.frames[0]
        print(json.dumps(eager_probe(args.repeats) if args.eager_probe else compile_probe(args.compile_probe)))
        return
    rows = [run_config(args, frames) for frames in args.frames]
    print("\nvideo tokens | eager ms | jit (xla) ms | speed-up | jit (host_sdpa) ms | speed-up")
    for tokens, eager, jitted, hosted, ratios in rows:
        hosted_cells = (f"{hosted * 1e3:18.1f} | {ratios['host_sdpa']:7.2f}x" if hosted is not None
                        else f"{'(CPU backend only)':>18} |")
        print(f"{tokens:12d} | {eager * 1e3:8.1f} | {jitted * 1e3:12.1f} | {ratios['xla']:7.2f}x | {hosted_cells}")
    print("(medians of --repeats calls; eager in a JAX-free child process)")


def attention_breakdown(args, kwargs, tokens: int, eager: float, jitted: float) -> None:
    """Time one joint attention alone on both sides and split the step into attention + the rest (Amdahl)."""
    import jax
    import jax.numpy as jnp
    import torch

    from hyv_lib.models.families import get_preset
    from hyv_lib.kernels.xla import xla_attention_jax
    from hyv_lib.models.hunyuan_video15.layout import context_tokens

    batch, heads, dim = 2, args.heads, 128
    seq = tokens + context_tokens(get_preset("tiny"))  # bench_inputs' context: tiny's text + ByT5 + image slots
    valid = kwargs["encoder_attention_mask"].sum(1) + tokens  # ByT5 and image tokens are all padding (t2v)
    kv_mask = torch.arange(seq)[None] < valid[:, None]
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(batch, heads, seq, dim, generator=g) for _ in range(3))
    dense = kv_mask[:, None, None, :]  # what diffusers hands SDPA: a broadcast boolean mask

    def torch_attention():
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=dense)

    xla = jax.jit(xla_attention_jax)
    jq, jk, jv, jm = (jnp.asarray(t.numpy()) for t in (q, k, v, kv_mask))
    xla(jq, jk, jv, jm).block_until_ready()
    with torch.no_grad():
        t_torch = median_time(torch_attention, args.repeats)
    t_xla = median_time(lambda: xla(jq, jk, jv, jm).block_until_ready(), args.repeats)
    calls = 4  # one joint attention per dual-stream block (the refiner's 2 x 128-token ones are negligible)
    rest_eager, rest_jit = eager - calls * t_torch, jitted - calls * t_xla
    print(f"attention alone : torch SDPA {t_torch * 1e3:6.1f} ms vs XLA blockwise {t_xla * 1e3:6.1f} ms "
          f"({t_xla / t_torch:.2f}x slower); x{calls} = {calls * t_torch / eager:.0%} of the eager step")
    if min(rest_eager, rest_jit) <= 0:  # timing noise larger than the rest of the step
        print("rest of the step: attention alone timed longer than its share of a step; rerun with more --repeats")
        return
    print(f"rest of the step: eager {rest_eager * 1e3:6.1f} ms vs jit {rest_jit * 1e3:6.1f} ms "
          f"({rest_eager / rest_jit:.2f}x faster jitted)")
    print(f"bound           : with torch's attention speed the jitted step would be "
          f"{eager / (rest_jit + calls * t_torch):.2f}x faster than eager")


def run_config(args, frames: int) -> tuple[int, float, float, float, dict]:
    import torch

    from hyv_lib.runtimes.jax_step import JaxTransformer

    LATENT[0] = frames
    torch.set_num_threads(os.cpu_count() or 1)
    model, kwargs = bench_model(), bench_inputs()
    tokens = LATENT[0] * LATENT[1] * LATENT[2]
    from hyv_lib.models.families import get_preset
    from hyv_lib.models.hunyuan_video15.layout import context_tokens

    print(f"\nbench config: width {128 * args.heads}, 4 blocks, {tokens} video tokens + "
          f"{context_tokens(get_preset('tiny'))} context, batch 2, fp32")
    with torch.no_grad():
        oracle = model(**kwargs).sample
    tpu = JaxTransformer(copy.deepcopy(model))
    out = tpu(**kwargs)
    from hyv_lib.kernels.dispatch import available_backends

    # host_sdpa calls torch's CPU kernel from inside jit: it exists only where JAX runs on the CPU
    hosted_tpu = None
    if available_backends().get("host_sdpa") is None:
        hosted_tpu = JaxTransformer(copy.deepcopy(model), attention="host_sdpa")
    hosted_out = hosted_tpu(**kwargs) if hosted_tpu is not None else None

    def eager_in_child() -> float:
        result = in_child(args, frames, "--eager-probe")
        if result["jax_loaded"]:
            raise RuntimeError("the eager probe imported JAX; its timing would not be JAX-free")
        return result["eager_s"]

    # The machine's speed drifts within minutes: eager is timed before and after the jitted steps and averaged.
    eager_before = eager_in_child()
    jitted = median_time(lambda: tpu(**kwargs), args.repeats)
    hosted = median_time(lambda: hosted_tpu(**kwargs), args.repeats) if hosted_tpu is not None else None
    eager_after = eager_in_child()
    eager = (eager_before + eager_after) / 2
    ratios = {"xla": eager / jitted, **({"host_sdpa": eager / hosted} if hosted is not None else {})}
    print(f"diffusers eager : {eager * 1e3:8.1f} ms/step (JAX-free process; {eager_before * 1e3:.1f} before and "
          f"{eager_after * 1e3:.1f} after the jitted runs)")
    print(f"jit, XLA attn   : {jitted * 1e3:8.1f} ms/step   (max |diff| vs eager {(out - oracle).abs().max():.1e}, "
          f"{tpu.compilations} compilation)  {ratios['xla']:.2f}x")
    if hosted_tpu is not None:
        hosted_error = (hosted_out - oracle).abs().max()
        print(f"jit, host SDPA  : {hosted * 1e3:8.1f} ms/step   (max |diff| vs eager {hosted_error:.1e}, "
              f"{hosted_tpu.compilations} compilation)  {ratios['host_sdpa']:.2f}x")
    print(f"speed-up        : {max(ratios.values()):8.2f}x  (best jitted step against eager)")
    attention_breakdown(args, kwargs, tokens, eager, jitted)
    with tempfile.TemporaryDirectory() as cache:
        cold = in_child(args, frames, "--compile-probe", cache)
        warm = in_child(args, frames, "--compile-probe", cache)
    print(f"first call, cold cache : {cold['first_call_s']:6.2f} s (trace + compile)")
    print(f"first call, warm cache : {warm['first_call_s']:6.2f} s (trace + cache load), "
          f"{cold['first_call_s'] / warm['first_call_s']:.1f}x faster")
    return tokens, eager, jitted, hosted, ratios


if __name__ == "__main__":
    main()

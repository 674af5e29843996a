"""Compile one real-size HunyuanVideo-1.5 block at 720p/121 frames on 8 emulated devices and report XLA's
per-device memory analysis, then extrapolate to 54 blocks. Weights: one real-config block (bf16) with
random values; nothing runs, the program is only compiled. Not a unit test:

    .venv/bin/python benchmarks/aot_memory.py [--sharding tp_replicated_out] [--mesh tensor=8]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sharding", default="tp_replicated_out")
    parser.add_argument("--mesh", default="tensor=8")
    parser.add_argument("--frames", type=int, default=121)
    args = parser.parse_args()

    import torch
    from diffusers import HunyuanVideo15Transformer3DModel

    from hyv_lib import perf
    from hyv_lib.pipeline import parse_mesh
    from hyv_lib.presets import get_preset
    from hyv_lib.sharding import make_mesh
    from hyv_lib.tpu import TpuTransformer

    preset = get_preset("720p_t2v")
    height, width = preset.default_height, preset.default_width
    torch.manual_seed(0)
    model = HunyuanVideo15Transformer3DModel(**dict(preset.transformer, num_layers=1)).to(torch.bfloat16).eval()
    model.requires_grad_(False)
    step = TpuTransformer(model, mesh=make_mesh(**parse_mesh(args.mesh)), sharding=args.sharding)
    c = preset.latent_channels
    _, _, t, h, w = preset.latent_shape(height, width, args.frames)
    text_mask = (torch.arange(preset.text_len)[None] < 120).long().repeat(2, 1)
    kwargs = dict(
        hidden_states=torch.zeros(2, 2 * c + 1, t, h, w, dtype=torch.bfloat16), timestep=torch.tensor([900.0] * 2),
        encoder_hidden_states=torch.zeros(2, preset.text_len, preset.text_dim, dtype=torch.bfloat16),
        encoder_attention_mask=text_mask,
        encoder_hidden_states_2=torch.zeros(2, preset.byt5_len, preset.byt5_dim, dtype=torch.bfloat16),
        encoder_attention_mask_2=torch.zeros(2, preset.byt5_len, dtype=torch.long),
        image_embeds=torch.zeros(2, preset.image_tokens, preset.image_dim, dtype=torch.bfloat16))
    start = time.perf_counter()
    compiled = step.lower(**kwargs).compile()
    seconds = time.perf_counter() - start
    mem = compiled.memory_analysis()
    gib = 2**30
    block_weights = sum(r["bytes_per_device"] for r in step.placement)  # 1 block + embedders, per device
    full_weights = perf.param_bytes(preset, "bf16", args.sharding, parse_mesh(args.mesh))["bytes_per_device"]
    print(f"720p x {args.frames} frames ({t}x{h}x{w} latents), 1 block, mesh {args.mesh}, {args.sharding}, bf16; "
          f"compiled in {seconds:.0f} s on 8 emulated CPU devices")
    print(f"  XLA per device: arguments {mem.argument_size_in_bytes / gib:.2f} GiB, temporaries "
          f"{mem.temp_size_in_bytes / gib:.2f} GiB, outputs {mem.output_size_in_bytes / gib:.3f} GiB")
    print(f"  weights of this 1-block model per device (rules): {block_weights / gib:.2f} GiB")
    print(f"  extrapolated to 54 blocks: weights {full_weights / gib:.2f} GiB (planner, same rules) + "
          f"temporaries {mem.temp_size_in_bytes / gib:.2f} GiB (one block's working set; blocks run in turn) "
          f"+ inputs {max(mem.argument_size_in_bytes - block_weights, 0) / gib:.2f} GiB "
          f"= {(full_weights + mem.temp_size_in_bytes + max(mem.argument_size_in_bytes - block_weights, 0)) / gib:.2f}"
          " GiB per device (v6e: 32 GB HBM per chip)")
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()

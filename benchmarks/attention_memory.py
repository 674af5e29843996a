"""Peak memory of one tiny-width DiT forward at long sequence lengths: hyv_lib's masked SDPA vs diffusers.

diffusers' processor builds a dense [B, 1, S, S] boolean mask in every block; hyv_lib passes a [B, S]
key-padding mask and runs SDPA on the valid tokens. Each measurement runs in a fresh process and reports
the growth of peak RSS during the forward (model and inputs already allocated). Not a unit test: run

    .venv/bin/python benchmarks/attention_memory.py            # 16k and 32k video tokens
    .venv/bin/python benchmarks/attention_memory.py --frames 2 4

Also prints the output error of gpu-tpu-pedia's K/V-zeroing scheme against the exact processor.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys

LATENT_HW = (64, 64)  # 4096 video tokens per latent frame


def rss_kib() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024


def measure(processor: str, frames: int) -> dict:
    """Run in a child process: one forward, return sequence length and peak-RSS growth in MiB."""
    import torch

    from hyv_lib.models.families import get_preset
    from hyv_lib.models.components import build_tiny_components
    from hyv_lib.models.hunyuan_video15.processors import use_attention

    torch.set_num_threads(2)
    tiny = get_preset("tiny")
    model = build_tiny_components(tiny, names=["transformer"])["transformer"]
    if processor != "diffusers":
        use_attention(model, processor)
    c = tiny.latent_channels
    g = torch.Generator().manual_seed(0)
    text_mask = (torch.arange(tiny.text_len) < 20).long()[None]
    kwargs = dict(
        hidden_states=torch.randn(1, 2 * c + 1, frames, *LATENT_HW, generator=g),
        timestep=torch.tensor([500.0]),
        encoder_hidden_states=torch.randn(1, tiny.text_len, tiny.text_dim, generator=g),
        encoder_attention_mask=text_mask,
        encoder_hidden_states_2=torch.zeros(1, tiny.byt5_len, tiny.byt5_dim),
        encoder_attention_mask_2=torch.zeros(1, tiny.byt5_len, dtype=torch.long),
        image_embeds=torch.zeros(1, tiny.image_tokens, tiny.image_dim),
    )
    seq = frames * LATENT_HW[0] * LATENT_HW[1] + tiny.image_tokens + tiny.byt5_len + tiny.text_len
    before = rss_kib()
    with torch.no_grad():
        out = model(**kwargs).sample
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    torch.save(out, f"/tmp/hyv_bench_{processor}_{frames}.pt")
    return {"processor": processor, "frames": frames, "seq_len": seq, "extra_mib": (peak - before) / 1024}


def child(processor: str, frames: int) -> dict:
    cmd = [sys.executable, __file__, "--child", processor, str(frames)]
    return json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--frames", type=int, nargs="+", default=[4, 8], help="latent frames (4096 tokens each)")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.child[0], int(args.child[1]))))
        return
    import torch

    rows = []
    for frames in args.frames:
        ours, theirs = child("sdpa", frames), child("diffusers", frames)
        zeroing = child("kv_zeroing", frames)
        exact = torch.load(f"/tmp/hyv_bench_sdpa_{frames}.pt")
        ref = torch.load(f"/tmp/hyv_bench_diffusers_{frames}.pt")
        approx = torch.load(f"/tmp/hyv_bench_kv_zeroing_{frames}.pt")
        rows.append((ours["seq_len"], ours["extra_mib"], theirs["extra_mib"],
                     (exact - ref).abs().max().item(), (approx - ref).abs().max().item()))
    print(f"{'S':>8} {'hyv_lib MiB':>12} {'diffusers MiB':>14} {'ratio':>7} {'|exact-oracle|':>15} {'|kv_zero-oracle|':>17}")
    for s, ours, theirs, err, zerr in rows:
        print(f"{s:8d} {ours:12.0f} {theirs:14.0f} {theirs / ours:7.1f} {err:15.2e} {zerr:17.2e}")
    if len(rows) >= 2:
        (s0, o0, t0, *_), (s1, o1, t1, *_) = rows[0], rows[-1]
        print(f"S x{s1 / s0:.2f}: hyv_lib extra memory x{o1 / o0:.2f} (O(S)), diffusers x{t1 / t0:.2f} (O(S^2) "
              f"would be x{(s1 / s0) ** 2:.2f})")


if __name__ == "__main__":
    main()

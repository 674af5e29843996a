"""Tile-parallel VAE decode: the speed-up of 2 and 4 gloo ranks over 1 rank, one thread per rank, on a 720p decode
of the tiny VAE (the real tile grid: 256-pixel tiles with 0.25 overlap over 1280x720). Not a unit test:

    .venv/bin/python benchmarks/tile_parallel.py [--frames 9] [--ranks 2 4] [--repeats 3]

Each configuration runs in fresh processes (hyv_lib.parallel.distributed.run_distributed); times are the median of the repeats
of the decode call on rank 0, measured in the same run, so the ratios compare like with like. The ranks' per-tile
timelines show whether they decode at the same time. A machine with fewer cores than ranks cannot speed up past
its core count.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time


def _decode(vae, z, repeats):
    import torch
    import torch.distributed as dist

    from hyv_lib.runtimes.tile_parallel import tile_parallel_decode

    torch.set_num_threads(1)
    seconds, timeline = [], []
    for _ in range(repeats):
        dist.barrier()
        start = time.perf_counter()
        timeline.clear()
        tile_parallel_decode(vae, z, timeline=timeline)
        seconds.append(time.perf_counter() - start)
    timelines = [None] * dist.get_world_size()
    dist.all_gather_object(timelines, timeline)
    return statistics.median(seconds), timelines


def _single(vae, z, repeats):
    import torch

    torch.set_num_threads(1)
    vae.enable_tiling()
    seconds = []
    with torch.no_grad():
        for _ in range(repeats):
            start = time.perf_counter()
            vae.decode(z)
            seconds.append(time.perf_counter() - start)
    return statistics.median(seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--frames", type=int, default=9)
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    import torch

    from hyv_lib.models.families import get_preset
    from hyv_lib.models.components import build_tiny_components
    from hyv_lib.parallel.distributed import run_distributed

    tiny = get_preset("tiny")
    vae = build_tiny_components(tiny, names=["vae"])["vae"]
    shape = tiny.latent_shape(720, 1280, args.frames)
    z = torch.randn(shape, generator=torch.Generator().manual_seed(0))
    print(f"tiny VAE decode of latents {list(shape)} (1280x720, {args.frames} frames), 1 thread per rank, "
          f"{os.cpu_count()} CPU cores, median of {args.repeats}")
    base = _single(vae, z, args.repeats)
    print(f"  1 process : {base:.2f} s")
    for ranks in args.ranks:
        seconds, timelines = run_distributed(_decode, ranks, vae, z, args.repeats, timeout=1800)
        tiles = sum(len(t) for t in timelines)
        first_end = min(end for t in timelines for _, _, end in t[:1])
        starts = [t[0][1] for t in timelines if t]
        print(f"  {ranks} ranks   : {seconds:.2f} s -> {base / seconds:.2f}x ({tiles} tiles; every rank started its "
              f"first tile before any rank finished one: {max(starts) < first_end})")
    sys.stdout.flush()


if __name__ == "__main__":
    main()

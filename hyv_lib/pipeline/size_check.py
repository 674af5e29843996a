"""Refuse a video size that cannot fit before any work: a lower bound on its decode's memory vs host and GPU memory."""

from __future__ import annotations

import os

import torch

from ..base.errors import HyvInputError
from ..parallel.distributed import local_device
from ..runtimes.names import TORCH_RUNTIMES, runtime_name

#: Bytes per value of the decoded video [3, F, H, W] that the device decoding it holds at once, at least: the VAE's
#: output in its dtype (2 bytes in bf16, 4 in fp32) and the fp32 copy that
#: :func:`hyv_lib.runtimes.vae.to_uint8_frames` clamps to [-1, 1] (4 bytes).
DECODE_BYTES_PER_VALUE = 6
#: Bytes per value on the host: the uint8 frames [F, H, W, 3] every decode returns there.
FRAMES_BYTES_PER_VALUE = 1
_GIB = 2**30


def host_memory_bytes() -> int | None:
    """The host's memory: physical RAM, or the container's cgroup limit when lower (None if neither is readable)."""
    sizes = []
    try:
        sizes.append(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        pass
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):  # cgroup v2, v1
        try:
            with open(path) as f:
                text = f.read().strip()
        except OSError:
            continue
        if text.isdigit():
            sizes.append(int(text))
    return min(sizes) if sizes else None


def gpu_memory_bytes(device: torch.device) -> int | None:
    """Total memory of a CUDA ``device`` (what torch reports), else None (also when CUDA cannot be asked)."""
    if device.type != "cuda":
        return None
    try:
        return torch.cuda.get_device_properties(device).total_memory
    except (RuntimeError, AssertionError):  # no usable CUDA driver: the run will say so where it starts
        return None


def decode_bytes(height: int, width: int, video_length: int, on_gpu: bool) -> dict[str, int]:
    """Lower bounds on the bytes a video's decode holds at once: ``{"host": ..., "gpu": ...}`` (``gpu`` only when the
    VAE decodes on a GPU; otherwise the host holds both the decode's and the frames' bytes)."""
    values = video_length * height * width * 3
    if on_gpu:
        return {"host": values * FRAMES_BYTES_PER_VALUE, "gpu": values * DECODE_BYTES_PER_VALUE}
    return {"host": values * (FRAMES_BYTES_PER_VALUE + DECODE_BYTES_PER_VALUE)}


def check_fits(height: int, width: int, video_length: int, runtime: str) -> None:
    """HyvInputError naming ``height`` when a ``height`` x ``width`` video of ``video_length`` frames cannot fit
    (:func:`decode_bytes` over the memory of the host and, with the torch and ulysses runtimes on a GPU, of this
    process's GPU), before any model loads. A lower bound: what it refuses cannot run, whatever the dtype or tiling
    (every tile is blended into one whole video); what it lets through may still not fit. The jax runtime's device
    is left to the TPU compiler; the host still holds its frames."""
    device = local_device() if runtime in TORCH_RUNTIMES else torch.device("cpu")
    on_gpu = device.type == "cuda"
    if runtime_name(runtime) == "jax":  # the decode's float bytes are on the TPU: only the uint8 frames are sure to be on the host
        needed = {"host": video_length * height * width * 3 * FRAMES_BYTES_PER_VALUE}
    else:
        needed = decode_bytes(height, width, video_length, on_gpu)
    available = {"host": host_memory_bytes(), "gpu": gpu_memory_bytes(device) if on_gpu else None}
    for where, need in needed.items():
        have = available[where]
        if have is not None and need > have:
            what = "GPU" if where == "gpu" else "host"
            raise HyvInputError("height", f"a {width}x{height} video of {video_length} frames cannot fit: its "
                                          f"decode alone holds at least {need / _GIB:.1f} GiB on the {what}, which "
                                          f"has {have / _GIB:.1f} GiB; make `height`/`width` or `video_length` "
                                          "smaller")

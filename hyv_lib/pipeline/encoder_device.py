"""Where stage 1's encoders run: the ``--text_device`` choice and the encoders the in-memory pipeline keeps there."""

from __future__ import annotations

import re

import torch

from ..base.errors import HyvInputError
from ..parallel.distributed import local_device
from ..runtimes.names import runtime_name

#: ``--text_device`` values: ``auto`` (this process's GPU when CUDA is available, else the host CPU), ``cpu``, ``cuda``
#: (this process's GPU: ``LOCAL_RANK``'s under torchrun) or ``cuda:N``.
TEXT_DEVICES = ("auto", "cpu", "cuda", "cuda:N")

#: The components that encode (text, and a first frame's image); the in-memory pipeline keeps these on the device when
#: nothing is offloaded. The VAE, which also encodes a first frame, is stage 3's too and is only visited.
ENCODERS = ("text_encoder", "text_encoder_2", "image_encoder")

_CUDA = re.compile(r"cuda(?::(\d+))?")


def resolve_text_device(text_device: str | torch.device | None = "auto", runtime: str | None = None) -> torch.device:
    """The device stage 1's encoders (Qwen2.5-VL, ByT5, SigLIP, the VAE's encoder for a first frame; CogVideoX's T5)
    run on, from ``text_device`` (one of :data:`TEXT_DEVICES`, or a ``torch.device``; None is ``auto``).

    ``auto``: :func:`hyv_lib.parallel.distributed.local_device` (the GPU of this process, ``LOCAL_RANK``'s under
    torchrun, when CUDA is available; else the host CPU), except with ``runtime="jax"``, where it is the host CPU
    (JAX holds the accelerator, and the encoders have no torchax path). ``cuda`` / ``cuda:N`` without CUDA, an ``N``
    past the last GPU, or any other value: a HyvInputError naming ``text_device``."""
    value = "auto" if text_device is None else text_device
    if isinstance(value, torch.device):
        value = str(value)
    if not isinstance(value, str):
        raise HyvInputError("text_device", f"must be one of {', '.join(TEXT_DEVICES)}, got {value!r}")
    name = value.strip().lower()
    if name == "auto":
        return torch.device("cpu") if runtime_name(runtime) == "jax" else local_device()
    if name == "cpu":
        return torch.device("cpu")
    match = _CUDA.fullmatch(name)
    if match is None:
        raise HyvInputError("text_device", f"must be one of {', '.join(TEXT_DEVICES)} (N: a GPU index), "
                                           f"got {value!r}")
    if not torch.cuda.is_available():
        raise HyvInputError("text_device", f"is {value!r}, but CUDA is not available here (torch "
                                           f"{torch.__version__}): use auto or cpu")
    if match.group(1) is None:
        return local_device()
    index, count = int(match.group(1)), torch.cuda.device_count()
    if index >= count:
        raise HyvInputError("text_device", f"is {value!r}, but this machine has {count} CUDA device(s): "
                                           f"cuda:0 to cuda:{count - 1}")
    return torch.device("cuda", index)

"""Where stage 1's encoders run: the ``--text_device`` choice, and each encoder on that device for its own call only."""

from __future__ import annotations

import contextlib
import re
from typing import Iterator

import torch

from ..base.errors import HyvInputError
from ..parallel.distributed import local_device
from ..runtimes.placement import placed

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
    torchrun, when CUDA is available; else the host CPU), except with ``runtime="tpu"``, where it is the host CPU
    (JAX holds the accelerator, and the encoders have no torchax path). ``cuda`` / ``cuda:N`` without CUDA, an ``N``
    past the last GPU, or any other value: a HyvInputError naming ``--text_device``."""
    value = "auto" if text_device is None else text_device
    if isinstance(value, torch.device):
        value = str(value)
    if not isinstance(value, str):
        raise HyvInputError("--text_device", f"must be one of {', '.join(TEXT_DEVICES)}, got {value!r}")
    name = value.strip().lower()
    if name == "auto":
        return torch.device("cpu") if runtime == "tpu" else local_device()
    if name == "cpu":
        return torch.device("cpu")
    match = _CUDA.fullmatch(name)
    if match is None:
        raise HyvInputError("--text_device", f"must be one of {', '.join(TEXT_DEVICES)} (N: a GPU index), "
                                             f"got {value!r}")
    if not torch.cuda.is_available():
        raise HyvInputError("--text_device", f"is {value!r}, but CUDA is not available here (torch "
                                             f"{torch.__version__}): use auto or cpu")
    if match.group(1) is None:
        return local_device()
    index, count = int(match.group(1)), torch.cuda.device_count()
    if index >= count:
        raise HyvInputError("--text_device", f"is {value!r}, but this machine has {count} CUDA device(s): "
                                             f"cuda:0 to cuda:{count - 1}")
    return torch.device("cuda", index)


def module_device(module: torch.nn.Module) -> torch.device:
    """The device of ``module``'s first parameter (where it runs)."""
    return next(module.parameters()).device


@contextlib.contextmanager
def on_device(module: torch.nn.Module, device: torch.device | None = None,
              release: bool = False) -> Iterator[torch.nn.Module]:
    """``module`` on ``device`` for one encoder call (None, or the device it is on already: left where it is).

    Moved there, it leaves the device after the block, and a GPU's cache of freed blocks is emptied, so the next
    encoder or the transformer has the card: back to where it was (:func:`hyv_lib.runtimes.placement.placed`), or
    with ``release=True`` (an encoder loaded for this one call, as :func:`hyv_lib.pipeline.stages.stage1` does) its
    weights are dropped instead (moved to the ``meta`` device: no copy back to the host; the module is unusable
    after)."""
    if device is None or module_device(module) == device:
        yield module
        return
    if not release:
        with placed(module, device):
            yield module
        return
    torch.nn.Module.to(module, device=device)
    try:
        yield module
    finally:
        torch.nn.Module.to(module, device="meta")
        if device.type == "cuda":
            torch.cuda.empty_cache()


def keep_on_device(modules: list[torch.nn.Module], device: torch.device) -> None:
    """Move ``modules`` to ``device`` to stay (the in-memory pipeline's encoders when nothing is offloaded: each
    :func:`on_device` call then finds them there and moves nothing)."""
    for module in modules:
        if module_device(module) != device:
            torch.nn.Module.to(module, device=device)

"""Where a module runs for one piece of work: moved to a device for a block and back, or kept there."""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch


@contextlib.contextmanager
def placed(module: torch.nn.Module, device: torch.device | None = None,
           dtype: torch.dtype | None = None) -> Iterator[torch.nn.Module]:
    """``module`` on ``device`` in ``dtype`` (None: as it is) inside the block, back where it was and in its own dtype
    after, so work on one device never changes a model that other work shares (a VAE that the next prompt's image
    conditioning uses, a transformer that leaves the GPU to the decode). Leaving a GPU also empties torch's cache of
    freed blocks, so the memory is free for other processes too."""
    param = next(module.parameters())
    home_device, home_dtype = param.device, param.dtype
    target_device, target_dtype = device or home_device, dtype or home_dtype
    moved = (target_device, target_dtype) != (home_device, home_dtype)
    if moved:  # torch.nn.Module.to: diffusers' to() warns about fp32-pinned modules, which these models do not have
        torch.nn.Module.to(module, device=target_device, dtype=target_dtype)
    try:
        yield module
    finally:
        if moved:
            torch.nn.Module.to(module, device=home_device, dtype=home_dtype)
            if torch.device(target_device).type == "cuda":
                torch.cuda.empty_cache()


def module_device(module: torch.nn.Module) -> torch.device:
    """The device of ``module``'s first parameter (where it runs)."""
    return next(module.parameters()).device


@contextlib.contextmanager
def on_device(module: torch.nn.Module, device: torch.device | None = None,
              release: bool = False) -> Iterator[torch.nn.Module]:
    """``module`` on ``device`` for one encoder call (None, or the device it is on already: left where it is).

    Moved there, it leaves the device after the block, and a GPU's cache of freed blocks is emptied, so the next
    encoder or the transformer has the card: back to where it was (:func:`placed`), or
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

"""Where a model's weights live while it runs: resident on the device, moved there for one block of work, or streamed."""

from __future__ import annotations

import contextlib
import logging
import weakref

import torch

from ..base.errors import HyvInputError
from ..models.devices import placed
from ..parallel.distributed import local_device

logger = logging.getLogger(__name__)

#: ``--offload`` values (torch runtime). ``block`` keeps the transformer's weights on the host and streams one block at
#: a time to the device (diffusers' group offloading, block level, on a CUDA stream that overlaps the next block's copy
#: with this block's compute). Measured on one H200 at 480p/121f: 5.6 GiB peak instead of 20.3 GiB, 6.27 s instead of
#: 6.06 s per step (benchmarks/results/gpu_check_2026-11-26_H200_run2.json). ``model`` moves the whole transformer to
#: the device for the denoising loop and back to the host after it, so the VAE decode that follows in the same process
#: (the in-memory pipeline, ``--prompts_file``) has the card to itself: what diffusers' ``enable_model_cpu_offload``
#: does for a pipeline's components, for the one model hyv_lib moves.
OFFLOAD_MODES = ("block", "model")
#: Device types ``--offload`` moves weights to. Elsewhere (the host CPU: no GPU here) there is nowhere to offload to:
#: the request is kept in the record, warned about once, and nothing is moved or hooked (:func:`offload_applies`).
OFFLOAD_DEVICE_TYPES = ("cuda",)
#: Transformers :func:`place_transformer` has warned about (an ``--offload`` with no GPU): a model kept across prompts
#: (``--prompts_file``) is warned about once.
NOT_OFFLOADED: "weakref.WeakSet[torch.nn.Module]" = weakref.WeakSet()

#: Transformers :func:`offload_blocks` has hooked, and the device each streams to.
OFFLOADED: "weakref.WeakKeyDictionary[torch.nn.Module, torch.device]" = weakref.WeakKeyDictionary()


def offload_blocks(transformer, device: torch.device) -> None:
    """Keep ``transformer``'s weights on the host and stream them block by block to ``device`` as the forward
    reaches them (in place; diffusers' ``enable_group_offload``, one block per group, a CUDA stream on GPUs). On the
    CPU the copies are no-ops and the outputs are the resident model's, bit for bit. Idempotent: a model kept across
    prompts (``--prompts_file``) is hooked once."""
    if OFFLOADED.get(transformer) == device:
        return
    if transformer in OFFLOADED:
        raise HyvInputError("offload", f"this transformer already streams its blocks to {OFFLOADED[transformer]}, "
                                       f"not {device}: load it again for another device")
    torch.nn.Module.to(transformer, "cpu")
    transformer.enable_group_offload(onload_device=device, offload_device=torch.device("cpu"),
                                     offload_type="block_level", num_blocks_per_group=1,
                                     use_stream=device.type == "cuda")
    OFFLOADED[transformer] = device


def offload_applies(offload: str | None, device: torch.device | None = None) -> bool:
    """Whether ``offload`` (a mode of :data:`OFFLOAD_MODES`, or None) does anything on ``device`` (None: this
    process's, :func:`hyv_lib.parallel.distributed.local_device`): only on a GPU (:data:`OFFLOAD_DEVICE_TYPES`); on
    the host CPU the weights already are where offloading would put them."""
    device = local_device() if device is None else torch.device(device)
    return offload is not None and device.type in OFFLOAD_DEVICE_TYPES


def place_transformer(transformer, device: torch.device, offload: str | None = None) -> None:
    """Where ``transformer`` waits between denoising loops: on ``device`` when it is a GPU and nothing is offloaded
    (a no-op for a model already there), streamed block by block with ``offload="block"``
    (:func:`offload_blocks`), on the host with ``offload="model"`` (:func:`while_denoising` brings it over). An
    ``offload`` with no GPU to offload to (:func:`offload_applies`) is one warning line (once per model), and the model
    stays as it is."""
    if offload not in (None, *OFFLOAD_MODES):
        raise HyvInputError("offload", f"must be one of {', '.join(OFFLOAD_MODES)}, got {offload!r}")
    if offload is not None and not offload_applies(offload, device):
        if transformer not in NOT_OFFLOADED:
            logger.warning("--offload %s: no GPU here, so nothing is offloaded (the weights stay on the host CPU)",
                           offload)
            NOT_OFFLOADED.add(transformer)
    elif offload == "block":
        offload_blocks(transformer, device)
    elif offload is None and device.type == "cuda":
        transformer.to(device)


def while_denoising(transformer, device: torch.device, offload: str | None = None):
    """The context a denoising loop runs in: with ``offload="model"`` the transformer is on ``device`` inside and back
    on the host after (:func:`placed`); otherwise (and with no GPU to offload to) it stays where
    :func:`place_transformer` put it."""
    if offload == "model" and offload_applies(offload, device):
        return placed(transformer, device)
    return contextlib.nullcontext(transformer)

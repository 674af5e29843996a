"""The DiT's weights split over the torchrun ranks with PyTorch FSDP2: each block gathered just in time, freed after."""

from __future__ import annotations

import os
import weakref
from typing import Any, NamedTuple

import torch
import torch.distributed as dist

from ..base.errors import HyvInputError
from ..models.adapter import ModelAdapter
from ..models.registry import adapter_for
from ..parallel.distributed import init_distributed, local_device

#: ``--shard_weights`` values. ``fsdp``: PyTorch FSDP2 (``torch.distributed.fsdp.fully_shard``) on each transformer
#: block and then on the root, over all ranks (a 1-D DeviceMesh; nccl on GPUs, gloo on CPUs). Each rank keeps 1/N of
#: every parameter (dim 0, padded to a multiple of N); a block's full weights are all-gathered just before it runs and
#: freed after it (``reshard_after_forward=True``); the root's own parameters (embedders, token refiner, output head:
#: everything outside the blocks) are gathered for the whole step. Inference only (no gradients). FSDP2 runs on gloo
#: CPU processes in torch 2.12.1 (its all-gather is ``all_gather_into_tensor``): tests/test_fsdp.py. HunyuanVideo-1.5
#: 720p_t2v in bf16 is 15.51 GiB of parameters; a rank holds 7.75 / 3.88 / 1.94 GiB of it between steps on 2 / 4 / 8
#: ranks, plus 0.32 GiB (outside the blocks) and 0.28 GiB (one block) gathered inside a block (the parameter layout
#: from a meta-device build: tests/test_fsdp.py::test_per_rank_bytes_of_the_real_model; not measured on GPUs, where
#: FSDP may gather the next block while one runs).
SHARD_WEIGHTS = ("fsdp",)
#: The runtimes whose steps run on sharded weights: ``ulysses`` (each rank its part of the sequence: the weights and
#: the work are split) and ``torch`` (diffusers' forward on every rank, the full sequence each: only the weights are
#: split, each rank computes the same step).
SHARD_RUNTIMES = ("ulysses", "torch")

#: Transformers :func:`shard_weights` has sharded: the mode and the world size.
SHARDED: "weakref.WeakKeyDictionary[torch.nn.Module, tuple[str, int]]" = weakref.WeakKeyDictionary()

#: The method name :func:`shard_weights` adds to a sharded root: a call through it is one FSDP forward of the root.
STEP_METHOD = "hyv_sharded_call"

_LAUNCH = "torchrun --nproc_per_node=N -m hyv_lib stage2 --runtime ulysses --shard_weights fsdp ..."


def under_torchrun() -> bool:
    """Whether this process is one rank of a torchrun launch (``RANK`` set) or a process group is already up."""
    return "RANK" in os.environ or (dist.is_available() and dist.is_initialized())


def check_shard_weights(shard_weights: str | None, runtime: str, offload: str | None = None,
                        distributed: bool | None = None) -> None:
    """``--shard_weights`` against the other settings (HyvInputError naming ``shard_weights``): a mode of
    :data:`SHARD_WEIGHTS`, a runtime of :data:`SHARD_RUNTIMES`, no ``--offload`` (both decide where the weights live),
    and ranks to split over (``distributed``, default: :func:`under_torchrun`). None (no sharding) always passes.
    The step cache (``--enable_cache``) combines with it: a cached step's last blocks gather their weights through
    FSDP's hooks as a full step's do (:func:`hyv_lib.runtimes.step.cached_step`; tests/test_cache_parallel.py)."""
    if shard_weights is None:
        return
    if shard_weights not in SHARD_WEIGHTS:
        raise HyvInputError("shard_weights", f"must be one of {', '.join(SHARD_WEIGHTS)}, got {shard_weights!r}")
    if runtime not in SHARD_RUNTIMES:
        raise HyvInputError("shard_weights", f"splits torch weights over torchrun ranks: `runtime` "
                                             f"{' or '.join(SHARD_RUNTIMES)}, not {runtime!r}")
    if offload is not None:
        raise HyvInputError("shard_weights", f"is not combined with `offload` {offload} (both decide where the "
                                             "weights live): choose one")
    if not (under_torchrun() if distributed is None else distributed):
        raise HyvInputError("shard_weights", f"splits the weights over one process per device: {_LAUNCH}")


def mesh_device() -> torch.device:
    """Where this rank's shards live: its GPU (:func:`hyv_lib.parallel.distributed.local_device`) under nccl, the CPU
    under gloo."""
    return local_device() if dist.get_backend() == "nccl" else torch.device("cpu")


def shard_weights(model: torch.nn.Module, mode: str = "fsdp", adapter: ModelAdapter | None = None) -> torch.nn.Module:
    """Split ``model``'s parameters over all ranks (in place; returns ``model``): ``fully_shard`` on each block of
    ``adapter.blocks(model)`` (default: the registered adapter of the model's class), then on the root, with
    ``reshard_after_forward=True``, over a 1-D DeviceMesh of the world on :func:`mesh_device`. Starts the process
    group from torchrun's environment if it is not up. Idempotent for the same mode and world size; any other
    sharding of a sharded model (or one sharded by FSDP elsewhere) is a HyvInputError naming ``shard_weights``.

    The model's own forward then gathers each block as it reaches it. A step that runs the model piece by piece
    (:class:`hyv_lib.runtimes.ulysses.UlyssesTransformer`) is wrapped with :func:`sharded_step`, which runs it as
    one forward of the root."""
    # torch.distributed.fsdp and .tensor take about a second to import: only a run that shards pays for them (the
    # settings check below is imported by every stage-2 run)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule, fully_shard, register_fsdp_forward_method

    check_shard_weights(mode, "torch")  # the mode, and a launch with ranks
    init_distributed()
    world = dist.get_world_size()
    if model in SHARDED:
        if SHARDED[model] == (mode, world):
            return model
        raise HyvInputError("shard_weights", f"this transformer is already sharded ({SHARDED[model][0]} over "
                                             f"{SHARDED[model][1]} ranks), not {mode} over {world}: load it again")
    if isinstance(model, FSDPModule):
        raise HyvInputError("shard_weights", "this transformer was already sharded by FSDP outside hyv_lib: "
                                             "load it again")
    device = mesh_device()
    mesh = init_device_mesh(device.type, (world,))
    for block in adapter_for(model, adapter).blocks(model):
        fully_shard(block, mesh=mesh, reshard_after_forward=True)
    fully_shard(model, mesh=mesh, reshard_after_forward=True)
    setattr(model, STEP_METHOD, _call)  # a plain attribute: nn.Module keeps non-tensor values in __dict__
    register_fsdp_forward_method(model, STEP_METHOD)
    SHARDED[model] = (mode, world)
    return model


def _call(step, **kwargs):
    """What a sharded root runs in its FSDP forward (:data:`STEP_METHOD`): ``step(**kwargs)``."""
    return step(**kwargs)


class ShardedStep:
    """A transformer step over a model sharded by :func:`shard_weights`, each call run as one FSDP forward of the
    root: its own parameters gathered for the call (freed after), the blocks by their own hooks as the step reaches
    them. Inputs go to the shards' device (FSDP moves them on GPUs); the output comes back to the device of
    ``hidden_states``. Other attributes are the wrapped step's."""

    def __init__(self, step, model: torch.nn.Module):
        if model not in SHARDED:
            raise HyvInputError("shard_weights", "the step's model is not sharded: call shard_weights(model) first")
        self.step, self.model = step, model

    @torch.no_grad()
    def __call__(self, **kwargs: Any) -> torch.Tensor:
        where = kwargs["hidden_states"].device
        return getattr(self.model, STEP_METHOD)(self.step, **kwargs).to(where)

    def __getattr__(self, name: str):
        if name in ("step", "model"):  # not set yet (a copy being built): no recursion through self.step
            raise AttributeError(name)
        return getattr(self.step, name)


def sharded_step(step, model: torch.nn.Module) -> ShardedStep:
    """``step`` (a torch or ulysses step of :func:`hyv_lib.runtimes.step.make_step`) run over ``model``'s sharded
    weights: :class:`ShardedStep`. A step already wrapped is returned as it is."""
    return step if isinstance(step, ShardedStep) else ShardedStep(step, model)


# ------------------------------------------------------------------------------------------------- memory
class ParameterBytes(NamedTuple):
    """This rank's parameter bytes of a model as registered at one moment (each storage counted once)."""

    shards: int  #: local shards of sharded (DTensor) parameters, FSDP's padding included
    whole: int  #: parameters held whole: gathered by FSDP for the module running now, or never sharded

    @property
    def total(self) -> int:
        return self.shards + self.whole


def resident_parameter_bytes(model: torch.nn.Module) -> ParameterBytes:
    """The bytes of ``model``'s parameters this rank holds now (:class:`ParameterBytes`). Between steps a model
    sharded over N ranks holds about 1/N of the total (``whole == 0``); inside a block's forward, the block's and
    the root's gathered parameters count whole (their own shards are hidden while gathered, and still held)."""
    from torch.distributed.tensor import DTensor  # (already imported once a model is sharded)

    seen: set[int] = set()
    shards = whole = 0
    for param in model.parameters():
        local = param.to_local() if isinstance(param, DTensor) else param
        storage = local.untyped_storage()
        if storage.data_ptr() in seen or storage.nbytes() == 0:
            continue
        seen.add(storage.data_ptr())
        if isinstance(param, DTensor):
            shards += storage.nbytes()
        else:
            whole += storage.nbytes()
    return ParameterBytes(shards, whole)

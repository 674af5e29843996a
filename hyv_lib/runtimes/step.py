"""The transformer-step protocol and its factory: one callable per runtime (torch, jax, ulysses), optionally cached."""

from __future__ import annotations

import os
from typing import Any, Protocol

import torch

from ..base.errors import HyvInputError
from ..kernels.dispatch import available_backends, jax_backends
from ..kernels.registry import BACKENDS
from ..models.adapter import ModelAdapter
from ..models.registry import adapter_for
from ..parallel.distributed import init_distributed
from ..parallel.jax_env import jax_devices
from ..parallel.mesh import ONE_DEVICE, make_mesh, parse_mesh
from ..parallel.sharding import DEFAULT_STRATEGY
from .compiled import check_compile, compile_blocks
from .deepcache import DeepCacheSchedule, DeepCacheStep, TorchDeepCache
from .fsdp import ShardedStep, sharded_step
from .jax_step import DefaultMeshTransformer, JaxTransformer
from .magcache import MagCacheSchedule
from .names import runtime_choices, runtime_name
from .ulysses import UlyssesTransformer


class TransformerStep(Protocol):
    """A transformer step: called with the keyword arguments of the model's forward (hidden_states, timestep,
    encoder_hidden_states, ...: the diffusers class's, whichever model adapter runs it), returns the prediction
    tensor. Every runtime (eager
    torch, JAX jit, sharded, cached) implements this one interface; the loop never branches on platform.

    Optional, looked up with ``hasattr``: ``reset()``, which :func:`denoise` calls before the first step (after any
    warmup calls), and ``full_calls`` / ``cached_calls``, counts that :func:`stage2` records in
    generation_config.json when the cache is on (:class:`hyv_lib.runtimes.deepcache.DeepCacheStep` has all three).
    """

    def __call__(self, **forward_kwargs: Any) -> torch.Tensor: ...


def torch_step(transformer) -> TransformerStep:
    """The eager-torch transformer step: diffusers' own forward (the oracle)."""

    def step(**kwargs) -> torch.Tensor:
        return transformer(**kwargs, return_dict=False)[0]

    return step


#: ``--attention`` values besides hyv_lib's backends (:data:`hyv_lib.kernels.registry.BACKENDS`): ``auto`` (the best exact
#: backend for the runtime's tensors) and ``diffusers`` (diffusers' stock processor, which builds a dense
#: [B, 1, S, S] mask: the oracle, torch runtime only).
ATTENTION_CHOICES = ("auto", "diffusers")
def make_step(transformer, runtime: str = "torch", mesh: str | None = None,
              sharding: str = DEFAULT_STRATEGY, cache=None, no_cache_blocks: int = 1,
              attention: str = "auto", adapter: ModelAdapter | None = None,
              attention_options: dict[str, Any] | None = None, compile: bool = False) -> TransformerStep:
    """The transformer step of a runtime: ``torch`` (eager diffusers), ``jax`` (torchax/JAX jit on
    whatever JAX backend is present: the TPU on a TPU VM, the CPU here; JAX's persistent compile cache is the
    caller's choice, :func:`hyv_lib.parallel.jax_env.enable_compile_cache`, which the CLI turns on) or
    ``ulysses`` (sequence parallel over the torchrun processes: nccl on GPUs, gloo on CPU).

    ``attention``: every runtime installs hyv_lib's exact masked attention on ``transformer`` (in place): ``auto``
    picks the exact CUDA kernel by GPU generation (:data:`hyv_lib.kernels.dispatch.GPU_ORDERS`: SDPA first on Hopper),
    SDPA on each sample's valid tokens on the CPU (Splash or XLA under the jax
    runtime); a name of :data:`hyv_lib.kernels.registry.BACKENDS` forces one. ``diffusers`` keeps diffusers' own processor
    on the torch runtime (the oracle: it builds a dense [B, 1, S, S] mask, 24 GiB at 720p/121f for the CFG batch).
    ``attention_options``: the backend's options (``{"ssta": hyv_lib.SstaConfig(...)}`` for ``ssta``, Splash's block
    sizes for ``splash``, ...), given to every runtime's attention; None: the backend's defaults.
    The step reads the model's device and dtype when it runs, not when it is built. ``adapter``: the model's glue
    (:class:`hyv_lib.models.adapter.ModelAdapter`; default: the registered one for the model's class).
    ``mesh`` ('tensor=8', 'data=2,tensor=4', ...) shards the jax step with the rule set ``sharding``; None lays every
    JAX device out as ``python -m hyv_lib compile`` does (:class:`hyv_lib.runtimes.jax_step.DefaultMeshTransformer`: the CFG
    pair on ``data``, the rest on ``tensor`` as far as the heads split, chosen at the first call and logged);
    ``"1"`` runs on one device.
    ``cache`` (a :class:`hyv_lib.runtimes.deepcache.DeepCacheSchedule`, or the adaptive
    :class:`hyv_lib.runtimes.magcache.MagCacheSchedule`) wraps the torch, jax or ulysses step in DeepCache,
    recomputing the last ``no_cache_blocks`` blocks on cached steps (:func:`cached_step`).
    ``compile`` (torch and ulysses runtimes, and both under DeepCache or over FSDP-sharded weights): compile the
    model's repeated transformer blocks in place with torch.compile (:func:`hyv_lib.runtimes.compiled.compile_blocks`;
    one program shared by identical blocks, attention as one opaque op). The first call compiles; a call with another
    latent shape or batch compiles again. The jax runtime is always compiled (XLA): ``compile=True`` is refused there.
    """
    runtime = runtime_name(runtime)
    check_compile(compile, runtime)
    if attention == "diffusers" and runtime != "torch":
        raise HyvInputError("attention", f"diffusers' own processor runs on `runtime` torch only, not {runtime!r}")
    if attention_options is not None and not isinstance(attention_options, dict):
        raise HyvInputError("attention_options", f"must be None or a dict of the backend's options, got "
                                                 f"{type(attention_options).__name__}")
    if attention == "diffusers" and attention_options:
        raise HyvInputError("attention_options", "diffusers' own processor (`attention` diffusers) takes no options, "
                                                 f"got {', '.join(attention_options)}")
    options = dict(attention_options or {})
    if cache is not None:
        return cached_step(make_step(transformer, runtime, mesh, sharding, attention=attention, adapter=adapter,
                                     attention_options=options, compile=compile), transformer, cache,
                           no_cache_blocks, adapter)
    if runtime == "torch":
        if attention != "diffusers":  # else diffusers' own processor stays
            adapter_for(transformer, adapter).use_attention(transformer, attention, **options)
        if compile:
            compile_blocks(transformer, adapter)
        return torch_step(transformer)
    if runtime == "jax":
        if mesh in (None, "") and len(jax_devices()) > 1:  # every device, laid out at the first call (its batch known)
            return DefaultMeshTransformer(transformer, sharding=sharding, attention=attention,
                                          attention_options=options, adapter=adapter)
        axes = None if mesh == ONE_DEVICE else parse_mesh(mesh)
        if axes is None:
            return JaxTransformer(transformer, attention=attention, attention_options=options, adapter=adapter)
        try:
            device_mesh = make_mesh(**axes)
            return JaxTransformer(transformer, mesh=device_mesh, sharding=sharding, attention=attention,
                                  attention_options=options, adapter=adapter)
        except ValueError as err:  # device count, head or batch splits
            raise HyvInputError("mesh", str(err)) from None
    if runtime == "ulysses":
        if "RANK" not in os.environ and not torch.distributed.is_initialized():
            raise HyvInputError("runtime", "ulysses runs one process per device under torchrun: "
                                           "torchrun --nproc_per_node=N -m hyv_lib stage2 --runtime ulysses ...")
        init_distributed()
        try:
            ulysses = UlyssesTransformer(transformer, attention_backend=attention, adapter=adapter,
                                         attention_options=options)
        except HyvInputError:  # names its own argument
            raise
        except ValueError as err:  # heads that do not split over the ranks
            raise HyvInputError("nproc_per_node", str(err)) from None
        if compile:
            compile_blocks(transformer, adapter)
        return ulysses
    raise HyvInputError("runtime", f"must be one of {runtime_choices()}, got {runtime!r}")


def cached_step(step: TransformerStep, transformer, cache, no_cache_blocks: int = 1,
                adapter: ModelAdapter | None = None) -> DeepCacheStep | ShardedStep:
    """DeepCache around an uncached step of :func:`make_step` for ``transformer``: a jax or ulysses step is the cache's
    runtime itself (the jax programs are shared; under Ulysses each rank caches its own sequence shard and every rank
    runs rank 0's schedule, :meth:`UlyssesTransformer.agreed_schedule`), a torch step's model runs through
    :class:`TorchDeepCache`. A step over FSDP-sharded weights (:class:`hyv_lib.runtimes.fsdp.ShardedStep`) stays one:
    each cached or full call is one forward of the sharded root, whose blocks gather their weights as they run.
    ``cache``: a :class:`hyv_lib.runtimes.deepcache.DeepCacheSchedule` or an adaptive
    :class:`hyv_lib.runtimes.magcache.MagCacheSchedule`; the last ``no_cache_blocks`` blocks run on cached steps."""
    if not isinstance(cache, (DeepCacheSchedule, MagCacheSchedule)):
        raise HyvInputError("cache", "must be None, a hyv_lib.DeepCacheSchedule or a hyv_lib.MagCacheSchedule, got "
                                     f"{cache!r}")
    if isinstance(step, ShardedStep):
        return sharded_step(cached_step(step.step, transformer, cache, no_cache_blocks, adapter), step.model)
    if isinstance(step, UlyssesTransformer):
        cache = step.agreed_schedule(cache)
    runtime = step if isinstance(step, (JaxTransformer, UlyssesTransformer)) else TorchDeepCache(transformer, adapter)
    try:
        return DeepCacheStep(runtime, cache, no_cache_blocks)
    except ValueError as err:
        raise HyvInputError("no_cache_blocks", str(err)) from None


def check_attention(attention: str, runtime: str) -> None:
    """``--attention`` against what this machine can run, for ``runtime`` (HyvInputError naming the parameter)."""
    valid = (*ATTENTION_CHOICES, *BACKENDS)
    if attention not in valid:
        raise HyvInputError("attention", f"must be one of {', '.join(valid)}, got {attention!r}")
    if attention == "diffusers" and runtime != "torch":
        raise HyvInputError("attention", f"diffusers' own processor runs on `runtime` torch only, not {runtime!r}")
    if runtime == "jax" and attention not in ("auto", *jax_backends()):
        raise HyvInputError("attention", f"`runtime` jax runs JAX kernels: auto, {', '.join(jax_backends())}; "
                                         f"got {attention!r}")
    reason = available_backends().get(attention) if attention not in ATTENTION_CHOICES else None
    if reason is not None:
        raise HyvInputError("attention", f"{attention!r} cannot run here: {reason}")

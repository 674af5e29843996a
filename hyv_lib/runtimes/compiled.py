"""Regional torch.compile of a model's repeated transformer blocks: one compiled program shared by identical blocks.

torch's "regional compilation" recipe: compile the block that repeats (HunyuanVideo-1.5's 54 dual-stream blocks,
CogVideoX's 42) instead of the whole model. Each block's ``forward`` is wrapped by ``torch.compile``; the blocks of
one class run the same code object, and dynamo guards on what the code reads (tensor shapes and dtypes, the
processor's backend and bound options), not on which block it is, so the first block compiles and every identical
block reuses that graph (tests/test_compile.py counts the compilations). Inductor fuses the small kernels around
the matmuls and the attention (layer norms, modulation, RoPE, concatenations, residuals): measured outside this
repository on one H200 (torch 2.11, random bf16 weights), ``block.compile()`` on each block took a 480x848/121f CFG
step from 5.95 s to 4.91 s, with graph breaks still at the attention's per-sample Python.

The attention call inside a block is hyv_lib's opaque custom op (:mod:`hyv_lib.kernels.custom_op`), so a block is
one graph without breaks. The model's own forward outside the blocks (embedders, token refiner, output head) stays
eager.

Compilation happens at the first call of each new shape: a step with another latent size, frame count or batch (or
SSTA's token grid, or dtype, or device) compiles once more; same shapes reuse the program (``dynamic=False``: no
symbolic shapes, one specialised program per shape; past ``torch._dynamo.config.recompile_limit`` programs, 8 by
default, dynamo warns and runs further shapes eagerly). Only ``forward`` is compiled, so module hooks stay eager:
DeepCache's recording hooks (:class:`hyv_lib.runtimes.deepcache.TorchDeepCache`) and FSDP2's per-block gathers
(:func:`hyv_lib.runtimes.fsdp.shard_weights`; compile after sharding, the order torch documents) still fire.
"""

from __future__ import annotations

import functools
import logging
import weakref
from typing import Any

import torch

from ..base.errors import HyvInputError
from ..kernels.ssta_torch import host_compile
from ..models.adapter import ModelAdapter
from ..models.registry import adapter_for
from .names import runtime_name
from .placement import OFFLOADED

#: Models whose blocks :func:`compile_blocks` has compiled, and the step inputs they have been warmed up for
#: (:func:`warmup_calls`).
COMPILED: "weakref.WeakKeyDictionary[torch.nn.Module, set]" = weakref.WeakKeyDictionary()


def check_compile(compile: Any, runtime: str, offload: str | None = None) -> None:
    """``--compile`` against the other settings (HyvInputError naming ``compile``): a bool, the torch or ulysses
    runtime (the jax runtime is always compiled, by XLA), and no ``--offload block`` (diffusers' group offloading moves
    each block's weights inside the forward that would be compiled)."""
    if not isinstance(compile, bool):
        raise HyvInputError("compile", f"must be True or False, got {compile!r}")
    if not compile:
        return
    if runtime_name(runtime) == "jax":
        raise HyvInputError("compile", "is for `runtime` torch or ulysses: the jax runtime is always compiled (XLA)")
    if offload == "block":
        raise HyvInputError("compile", "is not combined with `offload` block: diffusers' group offloading moves "
                                       "each block's weights inside its forward, which the compiled block would "
                                       "trace; use `offload` model or no offload")


def compile_blocks(model: torch.nn.Module, adapter: ModelAdapter | None = None) -> int:
    """Compile the repeated transformer blocks of ``model`` in place (``adapter.blocks(model)``; adapter: the
    registered one for the model's class) and return how many. Each block's ``forward`` becomes
    ``torch.compile(forward, dynamic=False)`` run inside :func:`hyv_lib.kernels.ssta_torch.host_compile` (CPU
    compiles in a process where torchax registered its "jax" device). Idempotent. Nothing compiles until the first
    call; see the module docstring for when a call recompiles.

    A model whose blocks stream from the host (``offload="block"``: diffusers' group offloading wraps each block's
    forward to move its weights) is refused with a HyvInputError naming ``compile``."""
    blocks = adapter_for(model, adapter).blocks(model)
    if model in COMPILED:
        return len(blocks)
    if model in OFFLOADED:
        check_compile(True, "torch", "block")
    if not torch.cuda.is_available():  # inductor's C++ build logs "No CUDA runtime is found", about CUDA it won't use
        logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)
    for block in blocks:
        block.forward = _compiled(block.forward)  # an instance attribute: nn.Module.__call__ still runs the hooks
    COMPILED[model] = set()
    return len(blocks)


def is_compiled(model: torch.nn.Module) -> bool:
    """Whether :func:`compile_blocks` has compiled ``model``'s blocks."""
    return model in COMPILED


def warmup_calls(model: torch.nn.Module, warmup_steps: int, inputs: tuple) -> int:
    """The untimed calls a denoising loop makes before its first step: ``warmup_steps`` when given (> 0); else 1 the
    first time a model with compiled blocks runs a loop on ``inputs`` (a hashable description of its step inputs:
    latent shape, CFG batch, dtype, device), so that the compilation is not inside a timed step; else 0. Every rank
    of a Ulysses run has the same history, so all of them warm up together (their blocks exchange tokens)."""
    if warmup_steps:
        return warmup_steps
    seen = COMPILED.get(model)
    if seen is None or inputs in seen:
        return 0
    seen.add(inputs)
    return 1


def _compiled(forward):
    """``torch.compile(forward)`` called inside :func:`host_compile` for the device of its first tensor argument, on
    contiguous tensors: dynamo guards on strides, and a first block handed a slice (CogVideoX's video tokens are a
    view of the joint embedding) would otherwise compile a second program for the blocks after it."""
    program = torch.compile(forward, dynamic=False)

    def dense(x):
        return x.contiguous() if isinstance(x, torch.Tensor) else x

    @functools.wraps(forward)
    def run(*args, **kwargs):
        args, kwargs = tuple(dense(x) for x in args), {name: dense(x) for name, x in kwargs.items()}
        first = next((x for x in (*args, *kwargs.values()) if isinstance(x, torch.Tensor)), None)
        with host_compile(first.device if first is not None else torch.device("cpu")):
            return program(*args, **kwargs)

    return run

"""The runtimes by name: the transformer's, the VAE's, and the old names still accepted for them."""

from __future__ import annotations

from typing import Any

#: The transformer runtimes (``--runtime``): eager diffusers (``torch``), torchax/JAX jit on the present JAX backend
#: (``jax``: the TPU on a TPU VM, the CPU in the tests), Ulysses sequence parallel over torchrun ranks (``ulysses``).
RUNTIMES = ("torch", "jax", "ulysses")
#: The runtimes whose transformer runs on this process's torch device (the GPU when there is one); the JAX runtime
#: keeps the torch module on the host and runs its own copy.
TORCH_RUNTIMES = ("torch", "ulysses")
#: Where stage 3's VAE decodes: eager diffusers, or its decoder jitted through torchax on JAX's device.
VAE_RUNTIMES = ("torch", "jax")
#: Names still accepted for a runtime: ``tpu`` was the JAX runtime's name (it runs on any JAX backend), and old
#: configs and scripts say it.
RUNTIME_ALIASES = {"tpu": "jax"}


def runtime_name(runtime: Any) -> Any:
    """``runtime`` under its current name (``tpu`` -> ``jax``); any other value as it is, for the caller to check."""
    return RUNTIME_ALIASES.get(runtime, runtime) if isinstance(runtime, str) else runtime


def vae_runtime_for(runtime: str) -> str:
    """Where stage 3 decodes by default after stage 2 ran on ``runtime``: on JAX after the jax runtime (its device
    holds the accelerator), else eager torch."""
    return "jax" if runtime_name(runtime) == "jax" else "torch"


def runtime_choices(names: tuple[str, ...] = RUNTIMES) -> str:
    """``names`` for an error message, with the aliases: ``torch, jax (alias tpu), ulysses``."""
    aliases = {new: old for old, new in RUNTIME_ALIASES.items()}
    return ", ".join(f"{n} (alias {aliases[n]})" if n in aliases else n for n in names)

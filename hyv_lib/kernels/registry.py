"""The attention backend registry: name -> kernel, what it needs to run (device, dtypes, packages, torch and GPU
generation) and the options it takes; one decorated function adds a backend."""

from __future__ import annotations

import functools
import importlib
import importlib.util
from dataclasses import dataclass
from typing import Callable

import torch

#: Short names of the dtypes a backend takes, for its messages.
_DTYPE_NAMES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32", torch.float64: "fp64"}


@dataclass(frozen=True)
class Backend:
    """One attention backend. ``kernel(q, k, v, kv_mask, **options)`` takes and returns torch tensors [B, H, S, D]
    with a bool [B, S] key mask (the semantics of :func:`hyv_lib.kernels.dispatch.attention`); ``jax_kernel``, if
    any, is the same on JAX arrays, what a jitted torchax step calls (device ``jax``)."""

    name: str
    kernel: Callable
    devices: tuple[str, ...]  #: tensor devices it takes: "cpu", "cuda", "jax"
    dtypes: tuple[torch.dtype, ...] | None = None  #: None: any floating dtype
    packages: tuple[str, ...] = ()  #: import names that must be installed
    install: str = ""  #: how to get the packages
    min_torch: tuple[int, int] | None = None  #: (major, minor) of torch at least
    min_cuda_capability: tuple[int, int] | None = None  #: the GPU generation at least (8, 0) = Ampere
    options: tuple[str, ...] = ()  #: keyword options the kernel takes
    exact: bool = True  #: False: an approximation (Sage's 8-bit QK^T, the K/V-zeroing teaching scheme)
    jax_kernel: Callable | None = None
    check: Callable[[], str | None] | None = None  #: one more condition: None if met, else why not

    def unavailable(self) -> str | None:
        """None if the backend can run on this machine, else why it cannot (and how to get it)."""
        for package in self.packages:
            if importlib.util.find_spec(package) is None:
                return f"package {package!r} is not installed ({self.install})"
            if "cuda" in self.devices:  # a GPU build can be present and broken (built for another torch or CUDA)
                failure = import_failure(package)
                if failure is not None:
                    return f"package {package!r} is installed but does not import: {failure} ({self.install})"
        if self.min_torch is not None:
            have = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
            if have < self.min_torch:
                return f"needs torch >= {'.'.join(map(str, self.min_torch))}, this is {torch.__version__}"
        if self.devices == ("cuda",) and not torch.cuda.is_available():
            return "needs an NVIDIA GPU (torch.cuda.is_available() is False)"
        if self.min_cuda_capability is not None and torch.cuda.is_available():
            capability = torch.cuda.get_device_capability()
            if capability < self.min_cuda_capability:
                return (f"needs a GPU of compute capability >= {'.'.join(map(str, self.min_cuda_capability))}, this "
                        f"one is {'.'.join(map(str, capability))}")
        return self.check() if self.check is not None else None

    def takes(self, device: torch.device, dtype: torch.dtype | None = None) -> str | None:
        """None if the kernel takes tensors of ``device`` and ``dtype`` (None: not known yet), else why not. A JAX
        backend also takes a ``meta`` model's (compiled for a TPU, never run)."""
        dtype_ok = self.dtypes is None or dtype is None or dtype in self.dtypes
        # A meta-device model is compiled, never run: its tensors become abstract JAX arrays (the compile-only path).
        device_ok = device.type in self.devices or (device.type == "meta" and "jax" in self.devices)
        if device_ok and dtype_ok:
            return None
        wanted = " or ".join(_DTYPE_NAMES.get(d, str(d)) for d in self.dtypes) + " " if self.dtypes else ""
        places = " or ".join("torchax (device 'jax')" if d == "jax" else d.upper() if d == "cuda" else d
                             for d in self.devices)
        got = "" if dtype is None else str(dtype).removeprefix("torch.") + " "
        return f"takes {wanted}{places} tensors, got {got}tensors on {device.type}"


@functools.lru_cache(maxsize=None)
def import_failure(package: str) -> str | None:
    """None if ``package`` imports, else the error (once per process): flash-attn and SageAttention are compiled
    against one torch and CUDA, and a mismatched build fails only when imported, not when looked up."""
    try:
        importlib.import_module(package)
    except Exception as err:  # noqa: BLE001 - an ImportError, or an OSError / RuntimeError from a compiled library
        return f"{type(err).__name__}: {err}"[:300]
    return None


#: Every registered backend by name, in registration order (``hyv_lib.kernels.dispatch`` imports the built-in ones).
BACKENDS: dict[str, Backend] = {}


def register_backend(name: str, *, devices: tuple[str, ...], dtypes: tuple[torch.dtype, ...] | None = None,
                     packages: tuple[str, ...] = (), install: str = "", min_torch: tuple[int, int] | None = None,
                     min_cuda_capability: tuple[int, int] | None = None, options: tuple[str, ...] = (),
                     exact: bool = True, jax_kernel: Callable | None = None,
                     check: Callable[[], str | None] | None = None) -> Callable[[Callable], Callable]:
    """Decorator: register ``kernel(q, k, v, kv_mask, **options)`` as the attention backend ``name`` (see
    :class:`Backend` for the requirements). Registering a name again replaces it."""

    def register(kernel: Callable) -> Callable:
        BACKENDS[name] = Backend(name, kernel, devices, dtypes, packages, install, min_torch, min_cuda_capability,
                                 options, exact, jax_kernel, check)
        return kernel

    return register

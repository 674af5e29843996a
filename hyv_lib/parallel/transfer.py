"""Arrays between torch, numpy and JAX: bf16 bit-exactly (numpy has no bf16), multi-host gathers, mesh placement."""

from __future__ import annotations

import numpy as np
import torch


def torch_to_numpy(tensor: torch.Tensor) -> np.ndarray:
    """A torch tensor -> a numpy array on the host; bf16 becomes ``ml_dtypes.bfloat16`` (JAX's) bit for bit."""
    tensor = tensor.detach().to("cpu").contiguous()
    if tensor.dtype == torch.bfloat16:
        import ml_dtypes  # JAX's numpy dtypes (installed with jax)

        return tensor.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return tensor.numpy()


def numpy_to_torch(array: np.ndarray) -> torch.Tensor:
    """A numpy array (``ml_dtypes.bfloat16`` included) -> a CPU torch tensor that owns a writable copy."""
    array = np.array(array)  # a copy: XLA's buffers are read-only
    if array.dtype.name == "bfloat16":  # reinterpret the bits for torch
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(array)


def jax_to_torch(array) -> torch.Tensor:
    """A JAX array -> a CPU torch tensor. An array that this process does not hold whole (multi-host: other processes
    own some shards) is first gathered from every process, so each process gets the full result."""
    if not array.is_fully_addressable:
        from jax.experimental import multihost_utils

        array = multihost_utils.process_allgather(array, tiled=True)
    return numpy_to_torch(array)


def place(tensor: torch.Tensor, mesh=None, spec: tuple = (), dtype: torch.dtype | None = None, abstract: bool = False):
    """A torch tensor (CPU or meta) -> a JAX array, in ``dtype`` if given; on a mesh laid out as
    ``PartitionSpec(*spec)``, each process building only its own devices' shards from the (identical) host copy.
    ``abstract`` (a meta tensor, compile only) gives a ``jax.ShapeDtypeStruct`` with that sharding instead."""
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P
    from torchax.ops.mappings import t2j_dtype

    dtype = tensor.dtype if dtype is None else dtype
    sharding = None if mesh is None else NamedSharding(mesh, P(*spec))
    if abstract:
        return jax.ShapeDtypeStruct(tuple(tensor.shape), t2j_dtype(dtype), sharding=sharding)
    host = torch_to_numpy(tensor.detach().to(dtype))
    if sharding is None:
        return jax.numpy.asarray(host)
    return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])

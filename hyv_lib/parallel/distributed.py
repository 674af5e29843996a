"""torch.distributed helpers: process-group start-up, barriers, this rank's device, and running a function on N local ranks."""

from __future__ import annotations

import os
import socket
import time
from typing import Any, Callable

import torch
import torch.distributed as dist


# --------------------------------------------------------------------------------------------- launch
def init_distributed(backend: str | None = None) -> tuple[int, int]:
    """Initialise the default process group from the environment torchrun sets (RANK, WORLD_SIZE,
    MASTER_ADDR, MASTER_PORT, LOCAL_RANK). ``backend`` defaults to nccl when CUDA is available (and
    selects GPU LOCAL_RANK), else gloo. Already initialised: nothing changes. Returns (rank, world_size)."""
    if not dist.is_initialized():
        backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
        if backend == "nccl":
            torch.cuda.set_device(local_device())
        dist.init_process_group(backend)
    return dist.get_rank(), dist.get_world_size()


def local_device() -> torch.device:
    """This process's device for torch work: its own GPU when CUDA is available (``LOCAL_RANK`` under torchrun, so
    each rank of a node gets a different one; otherwise torch's current device), else the CPU. Every runtime and stage
    that places a model asks here, so they agree."""
    if not torch.cuda.is_available():
        return torch.device("cpu")
    if "LOCAL_RANK" in os.environ:
        return torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    return torch.device("cuda", torch.cuda.current_device())


def launched_ranks() -> int:
    """How many processes this one belongs to: the process group's size once it is up, else torchrun's
    ``WORLD_SIZE`` (1 outside torchrun)."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    return int(os.environ.get("WORLD_SIZE", "1"))


def rank() -> int:
    """This process's rank under torch.distributed (0 when not distributed): only rank 0 writes files."""
    return dist.get_rank() if dist.is_initialized() else 0


def barrier() -> None:
    """Wait for every rank: a one-element all-reduce on the backend's device. (torch.distributed.barrier picks its
    device from the registered accelerator, and fails once torchax has registered the "jax" device in-process.)"""
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    dist.all_reduce(torch.zeros(1, device=device))


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (for MASTER_PORT)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_entry(rank, world_size, port, backend, fn, args, results, received):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(world_size))
    if backend == "gloo":  # share the cores instead of oversubscribing them
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))
    else:
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, rank=rank, world_size=world_size)
    try:
        result = fn(*args)
    finally:
        dist.destroy_process_group()
    if rank == 0:
        results.put(result)
        received.wait()  # tensors travel as shared memory: stay alive until the parent has them


#: Imported once by the fork server, so each rank starts with them loaded (diffusers alone takes seconds).
PRELOAD = ("torch", "hyv_lib.runtimes.ulysses", "diffusers.models.transformers.transformer_hunyuan_video15")


def run_distributed(fn: Callable[..., Any], world_size: int, *args: Any, backend: str = "gloo",
                    timeout: float = 600.0, start_method: str = "forkserver") -> Any:
    """Run ``fn(*args)`` on ``world_size`` new processes joined in a process group; return rank 0's result.

    Processes are started with torch.multiprocessing (so ``fn`` must be importable: a module-level
    function), rendezvous on 127.0.0.1 at a free port, and use ``backend`` (gloo: CPU processes;
    nccl: rank i on GPU i). ``fn`` finds its rank with ``torch.distributed.get_rank()``. An exception
    on any rank is re-raised here with that rank's traceback; past ``timeout`` seconds all processes
    are terminated and TimeoutError is raised.

    ``start_method``: ``forkserver`` (default) forks the ranks from one clean server process that has
    imported :data:`PRELOAD` once (the first call starts it and pays for the imports; later calls
    reuse it); ``spawn`` starts fresh interpreters that import everything again in every rank.
    Neither forks the caller itself, so a caller with threads or CUDA initialised is safe.
    """
    import torch.multiprocessing as mp

    if start_method not in ("forkserver", "spawn"):
        raise ValueError(f"start_method must be 'forkserver' or 'spawn', got {start_method!r}")
    ctx = mp.get_context(start_method)
    if start_method == "forkserver":
        ctx.set_forkserver_preload(list(PRELOAD))  # used when the server starts (first call only)
    results, received = ctx.SimpleQueue(), ctx.Event()
    procs = mp.start_processes(_rank_entry, args=(world_size, free_port(), backend, fn, args, results, received),
                               nprocs=world_size, join=False, start_method=start_method)
    deadline = time.monotonic() + timeout
    result, have_result = None, False
    try:
        while not procs.join(timeout=0.05):  # raises ProcessRaisedException if a rank failed
            if not have_result and not results.empty():
                result, have_result = results.get(), True
                received.set()
            if time.monotonic() > deadline:
                raise TimeoutError(f"run_distributed: {world_size} processes did not finish in {timeout} s")
    finally:
        received.set()
        for process in procs.processes:
            if process.is_alive():
                process.terminate()
                process.join(5)
    if not have_result and not results.empty():
        result, have_result = results.get(), True
    if not have_result:
        raise RuntimeError("run_distributed: rank 0 finished without a result")
    return result

"""Memory of a block of code: peak resident memory (RSS, sampled by a background thread), the GPU's allocated and
reserved peaks, and the largest tensor created."""

from __future__ import annotations

import os
import threading
import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

# Considered: resource.getrusage's ru_maxrss (a lifetime peak: it cannot isolate one stage inside a process that
# already peaked) and tracemalloc (Python objects only, blind to torch's allocator). Sampling the RSS from /proc
# catches every allocator; a 2 ms period resolves allocations that live at least a few milliseconds.


def current_rss_bytes() -> int:
    """Resident set size of this process in bytes: Linux /proc (cheap), else psutil (macOS, Windows; a dependency
    of accelerate, which requirements.txt installs)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        import psutil

        return psutil.Process().memory_info().rss


def uses_gpu() -> bool:
    """True if this process has started CUDA (a GPU stage ran or is running); never starts it."""
    return torch.cuda.is_available() and torch.cuda.is_initialized()


class PeakMemory:
    """``with PeakMemory() as m: ...`` then ``m.peak_bytes`` (highest RSS seen) and ``m.growth_bytes`` (peak minus
    the RSS at entry): the memory a stage needed on top of what the process already held. Where the process uses a
    GPU (CUDA initialised), also ``gpu_peak_allocated_bytes`` and ``gpu_peak_reserved_bytes``: torch's allocator peaks
    over the block (None without a GPU). One object can measure several blocks in turn; each ``with`` starts afresh."""

    def __init__(self, interval_s: float = 0.002):
        self.interval_s = interval_s
        self.start_bytes = self.peak_bytes = 0
        self.samples = 0  # background samples taken in the current block (a test can wait for one)
        self.gpu_peak_allocated_bytes: int | None = None
        self.gpu_peak_reserved_bytes: int | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak_bytes = max(self.peak_bytes, current_rss_bytes())
            self.samples += 1
            time.sleep(self.interval_s)

    def __enter__(self) -> "PeakMemory":
        self._stop = threading.Event()  # a fresh flag: the last block's stop must not end this one's sampling
        self.start_bytes = self.peak_bytes = current_rss_bytes()
        self.samples = 0
        self.gpu_peak_allocated_bytes = self.gpu_peak_reserved_bytes = None
        if uses_gpu():
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.peak_bytes = max(self.peak_bytes, current_rss_bytes())
        if uses_gpu():
            torch.cuda.synchronize()
            self.gpu_peak_allocated_bytes = torch.cuda.max_memory_allocated()
            self.gpu_peak_reserved_bytes = torch.cuda.max_memory_reserved()

    @property
    def growth_bytes(self) -> int:
        return max(0, self.peak_bytes - self.start_bytes)


class LargestTensor(TorchDispatchMode):
    """``with LargestTensor() as probe: model(...)`` then ``probe.elements`` (most elements of any new tensor a torch
    operation created inside the block), ``probe.bytes`` and ``probe.op`` (the largest such tensor in bytes, and the
    operation that made it). Views, which share their input's storage, are skipped. It shows whether a forward
    ever builds an S x S tensor, independent of the allocator and of the RSS noise of :class:`PeakMemory`."""

    def __init__(self):
        super().__init__()
        self.elements = self.bytes = 0
        self.op: str | None = None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not func.is_view:
            for t in tree_leaves(out):
                if isinstance(t, torch.Tensor):
                    self.elements = max(self.elements, t.numel())
                    if t.numel() * t.element_size() > self.bytes:
                        self.bytes, self.op = t.numel() * t.element_size(), str(func)
        return out

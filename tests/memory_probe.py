"""A test helper: the peak bytes of CPU tensors a call holds alive at once, from torch's profiler or from the
tensors its operators return."""

import warnings
import weakref

import torch
from torch.profiler import ProfilerActivity, profile
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


def live_peak_bytes(fn) -> int:
    """Peak bytes of the tensors ``fn`` allocates and has alive at once on the CPU: the allocation and free events of
    torch's profiler, in time order (what was allocated before the call is not counted)."""
    with warnings.catch_warnings():  # "Profiler clears events at the end of each cycle": one cycle here
        warnings.simplefilter("ignore", UserWarning)
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            fn()
    events = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events() if e.name() == "[memory]")
    live = peak = 0
    for _, nbytes in events:
        live += nbytes
        peak = max(peak, live)
    return peak


class OutputBytes(TorchDispatchMode):
    """Counts the storages that operators return while active, each until it is freed (a view adds nothing)."""

    def __init__(self):
        super().__init__()
        self.live = self.peak = 0
        self.alive: set[int] = set()

    def freed(self, key: int, nbytes: int) -> None:
        self.alive.discard(key)
        self.live -= nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for tensor in tree_leaves(out):
            if not isinstance(tensor, torch.Tensor):
                continue
            storage = tensor.untyped_storage()
            if id(storage) in self.alive or not storage.nbytes():
                continue
            self.alive.add(id(storage))
            self.live += storage.nbytes()
            self.peak = max(self.peak, self.live)
            weakref.finalize(storage, self.freed, id(storage), storage.nbytes())
        return out


def output_peak_bytes(fn) -> int:
    """Peak bytes of the tensors ``fn``'s operators return and hold alive at once: what the model's "copies" count,
    without the scratch a CPU kernel allocates inside itself (torch's im2col convolution, taken where the CPU has no
    oneDNN bf16 kernel, holds a 27-fold column buffer that a GPU's cuDNN does not)."""
    mode = OutputBytes()
    with mode:
        fn()
    return mode.peak

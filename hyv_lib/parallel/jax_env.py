"""The JAX environment: libtpu without its warnings on machines with no TPU, multi-host start-up, the persistent compile cache."""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
from typing import Iterator

# What libtpu prints on stderr when it loads on a machine without a TPU: harmless, so hidden.
_LIBTPU_NOISE = re.compile(
    r"TPU_ACCELERATOR_TYPE|TPU_WORKER_HOSTNAMES|Failed to find host bounds|Logging before InitGoogle|"
    r"=== Source Location Trace|libtpu_init_utils\.cc|^\s*$")


def tpu_attached() -> bool:
    """Whether this machine has TPU chips (JAX's own PCI scan; False where it cannot tell)."""
    try:
        from jax._src import hardware_utils

        return hardware_utils.num_available_tpu_chips_and_device_id()[0] > 0
    except Exception:  # noqa: BLE001 - a private JAX helper: no answer means no TPU to protect
        return False


def share_libtpu_without_tpu() -> None:
    """Let several processes load libtpu when no TPU is attached.

    libtpu takes /tmp/libtpu_lockfile so that one process owns the TPU; a second process then fails to load it
    ("Internal error when accessing libtpu multi-process lockfile"). Without a TPU there is nothing to own, and the
    lock would only stop a second compile (a notebook kernel and the CLI, or two benchmark runs), so this sets
    libtpu's ALLOW_MULTIPLE_LIBTPU_LOAD=1 for this process, unless the variable is set or a TPU is attached.
    """
    if "ALLOW_MULTIPLE_LIBTPU_LOAD" not in os.environ and not tpu_attached():
        os.environ["ALLOW_MULTIPLE_LIBTPU_LOAD"] = "1"


@contextlib.contextmanager
def quiet_libtpu() -> Iterator[None]:
    """Hide libtpu's "no TPU here" warnings (about TPU_ACCELERATOR_TYPE / TPU_WORKER_HOSTNAMES), which it writes to
    the process's stderr file descriptor from C++ when it loads without a TPU. Every other stderr line written
    meanwhile is passed on when the block ends. Also :func:`share_libtpu_without_tpu`: every libtpu load of
    hyv_lib goes through here."""
    share_libtpu_without_tpu()
    with _keep_sigterm():
        sys.stderr.flush()
        try:
            saved = os.dup(2)
        except OSError:  # no real stderr (embedded interpreters): nothing to filter
            yield
            return
        with _filtered_stderr(saved):
            yield


@contextlib.contextmanager
def _keep_sigterm() -> Iterator[None]:
    """Undo libtpu's crash handler for SIGTERM when no TPU is attached: it prints a stack trace when the process is
    asked to stop (a Jupyter kernel being shut down, for one). Only the main thread can set signal handlers."""
    import signal
    import threading

    main = threading.current_thread() is threading.main_thread()
    before = signal.getsignal(signal.SIGTERM) if main else None
    try:
        yield
    finally:
        if main and before is not None and not tpu_attached():
            signal.signal(signal.SIGTERM, before)


@contextlib.contextmanager
def _filtered_stderr(saved: int) -> Iterator[None]:
    """Send fd 2 to a temporary file while the block runs; afterwards pass on every line but libtpu's noise."""
    with tempfile.TemporaryFile(mode="w+b") as capture:
        os.dup2(capture.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            capture.seek(0)
            kept = [line for line in capture.read().decode(errors="replace").splitlines(keepends=True)
                    if not _LIBTPU_NOISE.search(line)]
            if kept:
                sys.stderr.write("".join(kept))
                sys.stderr.flush()


_loaded = False


def jax_devices() -> list:
    """``jax.devices()``; the first call, which loads the backends (libtpu's TPU plugin among them), is quiet."""
    global _loaded
    import jax

    if _loaded:
        return jax.devices()
    with quiet_libtpu():
        devices = jax.devices()
    _loaded = True
    return devices


def default_backend() -> str:
    """``jax.default_backend()`` after a quiet backend load (see :func:`jax_devices`)."""
    import jax

    jax_devices()
    return jax.default_backend()


DEFAULT_CACHE_DIR = os.path.join("~", ".cache", "hyv_lib", "jax")


def enable_compile_cache(path: str | None = None) -> str:
    """Turn on JAX's persistent compilation cache (default ~/.cache/hyv_lib/jax); returns the folder.

    Every compiled executable is stored (no minimum size or compile time), so a second process that
    jits the same step with the same shapes, JAX version and devices loads it instead of compiling.
    """
    import jax

    path = os.path.abspath(os.path.expanduser(path or DEFAULT_CACHE_DIR))
    os.makedirs(path, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    return path


def init_multi_host() -> int:
    """Join this process to a multi-host JAX run: ``jax.distributed.initialize()``, once; returns the process count.

    On a multi-host TPU slice every host runs the same command (``gcloud compute tpus tpu-vm ssh ... --worker=all``)
    and each sees only its own chips until this call; on Cloud TPU the hosts are found automatically. Elsewhere
    (e.g. CPU processes on one machine) set ``JAX_COORDINATOR_ADDRESS`` (host:port of process 0),
    ``JAX_NUM_PROCESSES`` and ``JAX_PROCESS_ID``.
    """
    import jax

    if not jax.distributed.is_initialized():
        kwargs = {}
        if "JAX_NUM_PROCESSES" in os.environ:
            kwargs = dict(num_processes=int(os.environ["JAX_NUM_PROCESSES"]),
                          process_id=int(os.environ["JAX_PROCESS_ID"]))
        with quiet_libtpu():
            jax.distributed.initialize(**kwargs)
    return jax.process_count()

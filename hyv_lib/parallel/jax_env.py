"""The JAX environment: libtpu without its warnings on machines with no TPU, multi-host start-up, the persistent compile cache."""

from __future__ import annotations

import contextlib
import functools
import importlib.abc
import importlib.util
import os
import re
import sys
import tempfile
import threading
from typing import Iterator

# What libtpu prints on stderr when it loads on a machine without a TPU: harmless, so hidden (when JAX starts its
# backends, see _quiet_backend_start, and around hyv_lib's own libtpu loads, see quiet_libtpu).
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


_BACKENDS_MODULE = "jax._src.xla_bridge"
_backend_lock = threading.RLock()


def _quiet_backend_start(xla_bridge) -> None:
    """Make JAX's backend start-up quiet, whoever starts it: wrap ``xla_bridge.backends`` (which every JAX call that
    needs a device goes through, ``jax.devices()``, ``jnp`` and ``jax.jit`` alike) so that its first call, which loads
    libtpu's TPU plugin when JAX_PLATFORMS is unset, runs inside :func:`quiet_libtpu`. Later calls go straight
    through. A private JAX function: if it is missing, nothing is wrapped (hyv_lib's own calls stay quiet)."""
    original = getattr(xla_bridge, "backends", None)
    if original is None or getattr(original, "_hyv_quiet", False):
        return

    @functools.wraps(original)
    def backends():
        if getattr(xla_bridge, "_backends", None):  # started already
            return original()
        with _backend_lock:  # one fd-2 redirection at a time (two threads starting JAX at once)
            if getattr(xla_bridge, "_backends", None):
                return original()
            with quiet_libtpu():
                return original()

    backends._hyv_quiet = True
    xla_bridge.backends = backends


class _AfterImport(importlib.abc.MetaPathFinder):
    """Run ``hook(module)`` right after the module ``name`` is first imported, without importing it now (importing
    hyv_lib.parallel must not import JAX). Removes itself from ``sys.meta_path`` when it fires."""

    def __init__(self, name: str, hook):
        self.name, self.hook = name, hook

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.name:
            return None
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(fullname)
        except (ImportError, ValueError):
            return None  # let the other finders say what is wrong
        loader = getattr(spec, "loader", None)
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        exec_module, hook = loader.exec_module, self.hook

        def exec_and_hook(module):
            exec_module(module)
            with contextlib.suppress(Exception):  # never break JAX's import: at worst its start is not quiet
                hook(module)

        loader.exec_module = exec_and_hook
        return spec


def _install_quiet_backend_start() -> None:
    """Wrap JAX's backend start-up (:func:`_quiet_backend_start`) now if JAX is imported, else when it is; nothing
    to do where libtpu is not installed."""
    if importlib.util.find_spec("libtpu") is None and not os.environ.get("TPU_LIBRARY_PATH"):
        return
    if _BACKENDS_MODULE in sys.modules:
        _quiet_backend_start(sys.modules[_BACKENDS_MODULE])
    elif not any(isinstance(f, _AfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport(_BACKENDS_MODULE, _quiet_backend_start))


# Importing any hyv_lib module that runs JAX imports this one, so JAX's start is quiet from then on, also when a
# notebook calls jax.devices() or jnp itself before hyv_lib does.
_install_quiet_backend_start()


_loaded = False


def jax_devices() -> list:
    """``jax.devices()``; the first call, which loads the backends (libtpu's TPU plugin among them), is quiet (also
    where a JAX version lacks the function :func:`_quiet_backend_start` wraps)."""
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


def multi_host_joined() -> bool:
    """Whether this process has joined a multi-host JAX run (:func:`init_multi_host`)."""
    import jax

    return jax.distributed.is_initialized()


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

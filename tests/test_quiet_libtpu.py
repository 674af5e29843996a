"""libtpu's "no TPU here" warnings ("Failed to find host bounds ...", "unexpected worker hostname ...") stay out of
stderr when JAX starts its backends on a machine without a TPU, whoever calls JAX first: a chapter calls
``jax.default_backend()`` or ``jnp`` directly, not only hyv_lib's own ``jax_devices()``.

Each case runs in a fresh interpreter with JAX_PLATFORMS unset (as for a reader running a chapter in Jupyter), so that
JAX loads libtpu's TPU plugin at start-up."""

import importlib.util
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("libtpu") is None, reason="libtpu is not installed")

#: Lines libtpu writes from C++ when it starts without a TPU (the two the book showed, and their companions).
NOISE = ("Failed to find host bounds", "unexpected worker hostname", "TPU_WORKER_HOSTNAMES", "TPU_ACCELERATOR_TYPE",
         "Logging before InitGoogle", "libtpu_init_utils")


def run(code: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("JAX_PLATFORMS", "XLA_FLAGS")}
    # Another process (a test worker, a notebook kernel) may hold libtpu's lock file; without this libtpu would print
    # a lock-file error instead of the warnings under test. hyv_lib sets it too when no TPU is attached.
    env["ALLOW_MULTIPLE_LIBTPU_LOAD"] = "1"
    return subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, env=env,
                          timeout=120)


def assert_quiet(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 0, proc.stderr
    noise = [line for line in proc.stderr.splitlines() if any(n in line for n in NOISE)]
    assert noise == [], "libtpu's warnings reached stderr:\n" + proc.stderr


def test_jax_called_directly_after_hyv_lib_is_quiet():
    """The chapters' order: JAX imported, then a hyv_lib module that runs JAX, then JAX's own calls."""
    proc = run("import jax, jax.numpy as jnp\n"
               "import hyv_lib.parallel.mesh\n"
               "print(jax.default_backend(), float(jnp.ones(3).sum()))\n")
    assert_quiet(proc)
    assert proc.stdout.split() == ["cpu", "3.0"]


def test_hyv_lib_before_jax_is_quiet_and_light():
    """hyv_lib imported before JAX: it does not import JAX itself, and JAX's later start is still quiet."""
    proc = run("import sys\n"
               "import hyv_lib.parallel.jax_env\n"
               "assert 'jax' not in sys.modules, 'hyv_lib.parallel.jax_env imported JAX'\n"
               "import jax\n"
               "print(jax.devices()[0].platform)\n"
               "print('other stderr lines pass', file=sys.stderr)\n")
    assert_quiet(proc)
    assert proc.stdout.split() == ["cpu"]
    assert "other stderr lines pass" in proc.stderr


def test_a_stopped_process_prints_no_libtpu_stack_trace_after_jax_started_it():
    """libtpu's crash handler dumps a stack trace on SIGTERM (how Jupyter stops a kernel); the quiet start puts the
    default handler back, also when the chapter's own JAX call loaded libtpu."""
    proc = run("import os, signal, time\n"
               "import jax\n"
               "import hyv_lib.parallel.jax_env\n"
               "jax.devices()\n"
               "os.kill(os.getpid(), signal.SIGTERM)\n"
               "time.sleep(5)\n")
    assert proc.returncode == -15 and proc.stderr == "", proc.stderr[-2000:]


def test_without_hyv_lib_the_warnings_appear():
    """The reproducer is real: plain JAX on this machine prints them (else the tests above prove nothing)."""
    proc = run("import jax\nprint(jax.default_backend())\n")
    if proc.stdout.split() != ["cpu"]:
        pytest.skip(f"JAX found an accelerator here ({proc.stdout.strip()}): libtpu has nothing to warn about")
    assert "Failed to find host bounds" in proc.stderr

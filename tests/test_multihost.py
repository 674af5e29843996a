"""Multi-host JAX on this CPU: two processes joined by jax.distributed on 127.0.0.1 (CPU collectives over gloo),
4 emulated devices in all or per process, so a mesh spans both processes and neither addresses every device."""

import json
import os
import shutil
import socket
import subprocess
import sys

import pytest
from safetensors.torch import load_file

HERE = os.path.dirname(__file__)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(devices: int, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_COORDINATOR_ADDRESS")}
    env.update(JAX_PLATFORMS="cpu", XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}", **extra)
    return env


@pytest.mark.slow  # its own processes
def test_sharded_step_in_two_processes_equals_the_oracle():
    """jax.distributed on 127.0.0.1 with CPU collectives: 2 processes x 4 devices; a mesh of all 8 spans both, so
    weights are placed shard by shard from the host copy and outputs are gathered across processes."""
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env["JAX_PLATFORMS"] = "cpu"
    procs = [subprocess.Popen([sys.executable, os.path.join(HERE, "multihost_probe.py"), str(i), str(port)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) for i in (0, 1)]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, err[-3000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    for r in results:
        assert r["processes"] == 2 and r["devices"] == 8 and r["local_devices"] == 4
        for case in r["cases"]:
            assert not case["weights_fully_addressable"]  # each process really holds only its own shards
            assert case["output_shape"] == [2, 8, 2, 4, 6]
            for err_key in ("max_err", "deepcache_full_err", "deepcache_cached_err"):
                assert case[err_key] <= 1e-5, (r["process"], case)


@pytest.mark.slow  # its own processes
def test_stage2_multi_host_on_two_processes_equals_one_process(tiny_run, tmp_path):
    """`stage2 --runtime jax --mesh data=2,tensor=2 --multi_host` run by two processes (2 devices each) writes, on
    each "host", the latents that one process with all 4 devices writes."""
    common = ["-m", "hyv_lib", "stage2", "--video_length", "5", "--num_inference_steps", "2", "--seed", "3",
              "--runtime", "jax", "--mesh", "data=2,tensor=2", "--quiet"]
    inputs = tmp_path / "in"
    inputs.mkdir()
    for name in ("stage1_embeddings.safetensors", "generation_config.json"):
        shutil.copy(tiny_run / name, inputs / name)
    one = subprocess.run([sys.executable, *common, "--input_dir", str(inputs), "--output_dir", str(tmp_path / "one")],
                         capture_output=True, text=True, timeout=600, env=_env(4))
    assert one.returncode == 0, one.stderr[-3000:]
    port = _free_port()
    procs = [subprocess.Popen([sys.executable, *common, "--multi_host", "--input_dir", str(inputs),
                               "--output_dir", str(tmp_path / f"host{i}")], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True,
                              env=_env(2, JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}", JAX_NUM_PROCESSES="2",
                                       JAX_PROCESS_ID=str(i))) for i in (0, 1)]
    for p in procs:
        _, err = p.communicate(timeout=600)
        assert p.returncode == 0, err[-3000:]
    expected = load_file(tmp_path / "one" / "stage2_latents.safetensors")["latents"]
    for i in (0, 1):
        latents = load_file(tmp_path / f"host{i}" / "stage2_latents.safetensors")["latents"]
        assert (latents - expected).abs().max() <= 1e-5, i
    config = json.loads((tmp_path / "host1" / "generation_config.json").read_text())
    assert config["multi_host"] is True and config["mesh"] == "data=2,tensor=2"


def test_multi_host_needs_the_tpu_runtime():
    from hyv_lib.base.errors import HyvInputError
    from hyv_lib.models.families import get_preset
    from hyv_lib.pipeline.settings import resolve_settings

    with pytest.raises(HyvInputError) as err:
        resolve_settings(get_preset("tiny"), runtime="torch", multi_host=True)
    assert err.value.argument == "multi_host"

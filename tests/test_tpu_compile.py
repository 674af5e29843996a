"""The TPU compiler on this CPU (libtpu, no TPU): the compile CLI, Splash compiled natively, per-chip block sizes at
the real 720p length, multi-host slices."""

import contextlib
import dataclasses
import io
import json
import os
import re
import subprocess
import sys

import pytest

pytest.importorskip("libtpu", reason="the TPU compiler comes with libtpu (requirements.txt, Linux only)")

from hyv_lib.base.errors import HyvInputError  # noqa: E402
from hyv_lib.models.families import get_preset  # noqa: E402
from hyv_lib.cli import commands as cli  # noqa: E402
from hyv_lib.planning.tpu_compile import compile_step, parse_hbm_oom  # noqa: E402

TINY = get_preset("tiny")
HERE = os.path.dirname(__file__)
KEYS = {"topology", "device_kind", "devices", "processes", "mesh", "sharding", "per_device_bytes",
        "hbm_bytes_per_device", "fits", "collectives", "flops_per_device", "compiler_estimate_seconds",
        "compile_seconds"}


def small(heads=8, head_dim=128, layers=2, **transformer):
    """The tiny classes with real-width heads (128, TPU lanes) and enough of them for an 8-device mesh."""
    rope = [16, 56, 56] if head_dim == 128 else TINY.transformer["rope_axes_dim"]
    config = dict(TINY.transformer, num_attention_heads=heads, attention_head_dim=head_dim, num_layers=layers,
                  **{"rope_axes_dim": rope, **transformer})
    return dataclasses.replace(TINY, name="small", transformer=config)


def run_cli(*args):
    """``python -m hyv_lib`` in this process: (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.run(list(args))
    return code, out.getvalue(), err.getvalue()


@pytest.mark.slow  # its own processes
def test_cli_compile_prints_the_report_quietly_with_splash_native_for_a_tiny_head_dim():
    """The tiny preset (head dim 16) on a v6e slice: Splash pads the head dim to 128 and compiles natively; the JSON
    has every documented key; libtpu's no-TPU warnings reach neither stream (JAX_PLATFORMS unset, as for a user)."""
    env = {k: v for k, v in os.environ.items() if k not in ("JAX_PLATFORMS", "XLA_FLAGS")}
    out = subprocess.run([sys.executable, "-m", "hyv_lib", "compile", "--preset", "tiny", "--topology", "v6e:2x2",
                          "--json"], capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "TPU_ACCELERATOR_TYPE" not in out.stderr + out.stdout and "TPU_WORKER" not in out.stderr + out.stdout
    assert out.stderr.strip() == ""
    report = json.loads(out.stdout)
    assert KEYS <= set(report)
    assert set(report["per_device_bytes"]) == {"arguments", "temporaries", "outputs", "code", "total"}
    assert report["device_kind"] == "TPU v6 lite" and report["devices"] == 4 and report["processes"] == 1
    assert report["mesh"] == {"data": 2, "tensor": 2, "sequence": 1} and report["fits"] is True
    assert report["attention"]["native"] and report["attention"]["compute_dtype"] == "bfloat16"
    bytes_ = report["per_device_bytes"]
    assert bytes_["total"] == sum(v for k, v in bytes_.items() if k != "total") > 0
    assert all(c["count"] > 0 and c["bytes"] > 0 for c in report["collectives"])


@pytest.mark.slow  # its own processes
def test_a_stopped_process_prints_no_libtpu_stack_trace():
    """libtpu installs a crash handler that dumps a stack trace on SIGTERM (how Jupyter stops a kernel); without a
    TPU attached hyv_lib puts the default back once libtpu has loaded."""
    code = ("import os, signal, time; from hyv_lib.planning.tpu_compile import topology_devices; topology_devices('v6e:2x2'); "
            "os.kill(os.getpid(), signal.SIGTERM); time.sleep(5)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == -15 and out.stderr == "", out.stderr[-2000:]


def test_small_step_compiles_for_v6e_8_with_the_mosaic_kernel_in_the_hlo(compile_once):
    # the planner test (test_perf) compiles this very program: shared, not compiled twice
    report = compile_once(small(heads=16), "v6e:2x4", mesh={"data": 2, "tensor": 4}, sharding="tp_replicated_out",
                          height=256, width=256, video_length=13)
    assert report["devices"] == 8 and report["processes"] == 1  # a v6e-8 is one host
    assert report["mesh"] == {"data": 2, "tensor": 4, "sequence": 1}
    # 2 joint blocks + 1 refiner layer, each one tpu_custom_call (Splash lowered by Mosaic), no interpret-mode loop
    assert report["splash_kernels"] == 3 and report["attention"]["native"]
    assert report["fits"] and report["flops_per_device"] > 0


def test_deepcache_pair_compiles_as_two_programs():
    report = compile_step(small(), "v6e:2x4", height=256, width=256, video_length=13, enable_cache=True)
    assert report["mesh"] == {"data": 2, "tensor": 4, "sequence": 1}  # the default mesh of a v6e-8
    assert report["sharding"] == "tp_replicated_out"
    full, cached = report["programs"]["full"], report["programs"]["cached"]
    assert full["splash_kernels"] == 3 and cached["splash_kernels"] == 1  # the cached step runs 1 block
    assert cached["flops_per_device"] < full["flops_per_device"] / 2
    assert report["per_device_bytes"]["code"] == full["per_device_bytes"]["code"] + cached["per_device_bytes"]["code"]


def test_multi_host_topology_compiles_across_processes():
    report = compile_step(small(heads=16), "v6e:4x4", height=256, width=256, video_length=13)
    assert report["devices"] == 16 and report["processes"] == 4 and report["chips"] == 16
    assert report["mesh"] == {"data": 2, "tensor": 8, "sequence": 1} and report["attention"]["native"]


@pytest.mark.parametrize("argv, flag", [
    (["--topology", "v9:2x2"], "--topology"),
    (["--topology", "v6e:2x4", "--mesh", "data=2,tensor=2"], "--mesh"),
    (["--topology", "v6e:2x2", "--mesh", "tensor=4"], "--mesh"),  # 2 heads cannot split 4 ways
    (["--topology", "v6e:2x2", "--height", "100", "--width", "160"], "--height"),
    (["--topology", "v6e:2x2", "--video_length", "10"], "--video_length"),
    (["--topology", "v6e:2x2", "--sharding", "zero3"], "--sharding"),
    (["--preset", "huge", "--topology", "v6e:2x2"], "--preset"),
])
def test_bad_input_is_one_error_line_naming_the_flag(argv, flag):
    args = ["compile", "--preset", "tiny", *argv] if "--preset" not in argv else ["compile", *argv]
    code, out, err = run_cli(*args)
    assert code == 2 and out == ""
    assert err.startswith(f"error: {flag}: ") and err.count("\n") == 1, err


def test_a_rule_that_does_not_divide_a_dimension_names_the_sharding():
    odd = small(heads=8, head_dim=8, mlp_ratio=1.0625, rope_axes_dim=[2, 2, 4])  # MLP width 68: not a multiple of 8
    with pytest.raises(Exception) as err:
        compile_step(odd, "v6e:2x4", mesh="tensor=8", sharding="tp", height=256, width=256, video_length=13)
    assert getattr(err.value, "argument", None) == "sharding" and "cannot be split" in str(err.value)


def test_out_of_hbm_messages_are_parsed():
    """The two forms libtpu uses (whole-program and per-allocation); sizes in GiB as the compiler prints them."""
    assert parse_hbm_oom("Ran out of memory on HBM, the total memory required for HLO temporaries (600.00G) exceeds "
                         "available HBM (15.75G).") == (600 * 2**30, round(15.75 * 2**30))
    assert parse_hbm_oom("Ran out of memory in memory space hbm. Used 20.50G of 31.25G hbm.") == (
        round(20.5 * 2**30), round(31.25 * 2**30))
    assert parse_hbm_oom("something else") is None


def _splash_program(topology, dtype, **options):
    """Splash alone at the real 720p/121f joint length (111,600 video + 1,985 context tokens), heads on 4 devices."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    from hyv_lib.kernels.splash import splash_attention_jax
    from hyv_lib.parallel.mesh import active_mesh
    from hyv_lib.parallel.sharding import per_shard
    from hyv_lib.planning.tpu_compile import topology_devices

    devices = topology_devices(topology)[:4]
    mesh = Mesh(np.array(devices).reshape(1, 4, 1), ("data", "tensor", "sequence"))
    seq = 111_600 + 1_985
    q = jax.ShapeDtypeStruct((1, 16, seq, 128), dtype, sharding=NamedSharding(mesh, P("data", "tensor")))
    mask = jax.ShapeDtypeStruct((1, seq), jnp.bool_, sharding=NamedSharding(mesh, P("data")))

    def attend(q, k, v, m):
        with active_mesh(mesh):
            return per_shard(lambda *a: splash_attention_jax(*a, **options))(q, k, v, m)

    return jax.jit(attend).lower(q, q, q, mask)


@pytest.mark.parametrize("topology", ["v4:2x2x1", "v5e:2x4", "v5p:2x2x1", "v6e:2x4", "tpu7x:2x2x1"])
def test_default_splash_blocks_compile_at_the_real_length_on_every_chip_in_both_dtypes(topology):
    import jax.numpy as jnp

    from hyv_lib.parallel.jax_env import quiet_libtpu

    for dtype in (jnp.bfloat16, jnp.float32):
        with quiet_libtpu():
            hlo = _splash_program(topology, dtype).compile().as_text()
        calls = [line for line in hlo.splitlines() if 'custom_call_target="tpu_custom_call"' in line]
        assert len(calls) == 1
        # q, k, v ([4 heads, padded length, 128]) reach the kernel as bf16 when given bf16 on a TPU (the fast
        # default), as f32 when given f32
        operands = re.findall(r"(bf16|f32)\[4,\d+,128\]", calls[0].split("operand_layout_constraints=")[1])
        assert operands and set(operands) == {"bf16" if dtype == jnp.bfloat16 else "f32"}, operands


def test_the_stock_block_sizes_do_not_fit_v5e_scoped_vmem():
    """Why the blocks are per chip: 2048/2048/1024 (fine on v6e) exceeds v5e's scoped VMEM at the real length."""
    import jax
    import jax.numpy as jnp

    from hyv_lib.parallel.jax_env import quiet_libtpu

    with quiet_libtpu(), pytest.raises(jax.errors.JaxRuntimeError, match="vmem"):
        _splash_program("v5e:2x4", jnp.bfloat16, block_q=2048, block_kv=2048, block_kv_compute=1024).compile()


def test_cfg_off_meanflow_step_compiles_one_sample_on_the_tensor_axis():
    """The step-distilled recipe (CFG 1, MeanFlow): the compiled step takes one sample and timestep_r, so the
    default mesh puts every device on tensor, and a data axis is refused (it would have nothing to split)."""
    preset = dataclasses.replace(small(use_meanflow=True), guidance_scale=1.0)
    report = compile_step(preset, "v6e:2x4", height=256, width=256, video_length=13)
    assert report["batch"] == 1 and report["mesh"] == {"data": 1, "tensor": 8, "sequence": 1} and report["fits"]
    with pytest.raises(HyvInputError) as err:
        compile_step(preset, "v6e:2x4", mesh="data=2,tensor=4", height=256, width=256, video_length=13)
    assert err.value.argument == "mesh" and "of no use with CFG off" in err.value.message
    assert "(tensor=8)" in err.value.message  # where the devices should go instead


@pytest.mark.parametrize("name", ["480p_t2v_distilled", "480p_i2v_distilled", "720p_i2v_distilled"])
def test_cfg_distilled_presets_compile_as_one_sample_and_refuse_a_data_axis(name):
    """The CFG-distilled presets take the same batch-1 path as the step-distilled one (guidance 1): a data axis is
    refused before anything is built, with the message that says it is of no use."""
    with pytest.raises(HyvInputError) as err:
        compile_step(name, "v6e:2x4", mesh="data=2,tensor=4")
    assert err.value.argument == "mesh" and "of no use with CFG off" in err.value.message


@pytest.mark.slow  # the real width (2048): about half a minute on 2 cores
def test_a_cfg_distilled_preset_compiles_one_sample_on_the_tensor_axis():
    """480p_t2v_distilled at its real width (one block, a short clip): the compiled step takes one sample (the inputs'
    batch is the preset's samples_per_step) and the default mesh puts the 8 devices on tensor."""
    report = compile_step("480p_t2v_distilled", "v6e:2x4", height=256, width=256, video_length=5, num_layers=1)
    assert report["batch"] == 1 and report["mesh"] == {"data": 1, "tensor": 8, "sequence": 1} and report["fits"]
    assert report["preset"] == "480p_t2v_distilled" and report["attention"]["native"]

"""The jax runtime without --mesh lays every device out as compile does (data = the CFG pair, tensor = what the heads
take); --mesh 1 asks for one device; generation_config.json records the mesh used and where it came from."""

import os
import textwrap

import pytest

from hyv_lib.base.errors import HyvInputError
from hyv_lib.models.families import get_preset
from hyv_lib.parallel.mesh import default_layout, default_mesh, mesh_text
from hyv_lib.pipeline.settings import resolve_settings

# Hand-worked: (devices, samples per step, heads) -> mesh. The CFG pair (2 samples) goes on data when 2 devices
# are there; tensor takes the largest divisor of the heads that the devices left over hold. With 2 heads, 8 devices
# hold data=2 x tensor=2 = 4 of them (tensor=4 would split 2 heads 4 ways); with CFG off (1 sample) tensor=2 alone.
LAYOUTS = [
    (1, 2, 2, "1"), (1, 1, 2, "1"),
    (2, 2, 2, "data=2"), (2, 1, 2, "tensor=2"),  # a tie (2 devices either way) goes to the data axis
    (4, 2, 2, "data=2,tensor=2"), (4, 1, 2, "tensor=2"),
    (8, 2, 2, "data=2,tensor=2"), (8, 1, 2, "tensor=2"),
    (8, 2, 16, "data=2,tensor=4"), (8, 1, 16, "tensor=8"),  # HunyuanVideo-1.5's 16 heads on a v6e-8: every chip
]


@pytest.mark.parametrize("devices, batch, heads, expected", LAYOUTS)
def test_the_default_layout_is_the_largest_that_the_heads_allow(devices, batch, heads, expected):
    axes = default_layout(devices, heads, batch=batch)
    assert mesh_text(axes) == expected
    used = axes["data"] * axes["tensor"] * axes["sequence"]
    _, why = default_mesh(heads, batch, devices=devices)
    if devices == 1:
        assert why == "the one device present"
    elif used == devices:
        assert why == f"all {devices} devices; --mesh 1 for one"
    else:  # says how many are used and why
        assert why.startswith(f"{used} of {devices} devices: tensor must divide the model's {heads} attention heads")


def test_fsdp_puts_the_rest_on_sequence_and_the_planner_shares_the_rule():
    """The planner plans a whole slice: the default layout where it uses every device, and where the heads do not
    split so, an error that names the layout the runtime would run instead."""
    from hyv_lib.planning import planner
    from hyv_lib.planning.planner import bounds

    assert default_layout(8, 16, "fsdp", batch=2) == {"data": 2, "tensor": 1, "sequence": 4}
    assert planner.default_layout is default_layout
    assert bounds("720p_t2v", 720, 1280, 121, "v6e", 8)["mesh"] == {"data": 2, "tensor": 4, "sequence": 1}
    assert bounds("tiny", 64, 64, 5, "v6e", 4)["mesh"] == {"data": 2, "tensor": 2, "sequence": 1}
    with pytest.raises(HyvInputError) as err:
        bounds("tiny", 64, 64, 5, "v6e", 8)
    assert err.value.argument == "n_chips" and "data=2,tensor=2 (what `runtime` jax runs" in err.value.message
    assert "uses 4" in err.value.message


def test_compile_shares_the_rule_and_asks_for_a_mesh_where_it_leaves_devices_out():
    pytest.importorskip("libtpu", reason="the TPU compiler comes with libtpu (requirements.txt, Linux only)")
    from hyv_lib.planning import tpu_compile

    assert tpu_compile.default_layout is default_layout
    with pytest.raises(HyvInputError) as err:  # refused before anything is built or compiled
        tpu_compile.compile_step("tiny", "v6e:2x4")
    assert err.value.argument == "mesh" and "data=2,tensor=2 (what `runtime` jax runs" in err.value.message


def test_settings_record_the_mesh_used_and_its_source():
    """Here JAX has one CPU device: the default is that device ("1"); --mesh 1 is the same, asked for."""
    tiny = get_preset("tiny")
    default = resolve_settings(tiny, runtime="jax")
    assert (default.mesh, default.mesh_source, default.sharding) == ("1", "default", None)
    assert default.config()["mesh"] == "1" and default.config()["mesh_source"] == "default"
    one = resolve_settings(tiny, runtime="jax", mesh="1")
    assert (one.mesh, one.mesh_source, one.sharding) == ("1", "--mesh", None)
    torch_run = resolve_settings(tiny)
    assert torch_run.mesh is None and "mesh_source" not in torch_run.config()
    with pytest.raises(HyvInputError) as err:
        resolve_settings(tiny, mesh="1")
    assert err.value.argument == "mesh" and "needs `runtime` jax" in err.value.message


# stage2 on 8 emulated CPU devices (XLA_FLAGS before JAX starts: its own process), through the CLI as a user runs it;
# the mesh line is logged at the first step, after the start of the progress bar on the same stderr line
PROBE = textwrap.dedent("""
    import contextlib, io, json, os, sys
    os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    from safetensors.torch import load_file
    from hyv_lib.cli.commands import run
    source, out = sys.argv[1], sys.argv[2]
    results = {}
    for name, extra in (("default", []), ("one", ["--mesh", "1"]), ("cfg_off", ["--guidance_scale", "1"]),
                        ("cfg_off_one", ["--guidance_scale", "1", "--mesh", "1"])):
        folder = os.path.join(out, name)
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            code = run(["stage2", "--input_dir", source, "--output_dir", folder, "--runtime", "jax",
                        "--video_length", "5", "--num_inference_steps", "2", "--seed", "3", *extra])
        config = json.load(open(os.path.join(folder, "generation_config.json")))
        results[name] = dict(code=code, mesh=config["mesh"], source=config.get("mesh_source"),
                             sharding=config["sharding"],
                             lines=[l[l.index("mesh: "):] for l in err.getvalue().splitlines() if "mesh: " in l])
    latents = {n: load_file(os.path.join(out, n, "stage2_latents.safetensors"))["latents"] for n in results}
    results["error"] = (latents["default"] - latents["one"]).abs().max().item()
    results["cfg_off_error"] = (latents["cfg_off"] - latents["cfg_off_one"]).abs().max().item()
    results["cfg_changes"] = (latents["default"] - latents["cfg_off"]).abs().max().item()
    # the step of an in-memory pipeline: laid out at its first call, again when the batch changes (CFG off)
    import torch
    from hyv_lib.models.components import build_tiny_components
    from hyv_lib.runtimes.step import make_step
    sys.path.insert(0, sys.argv[3])
    from tiny_inputs import TINY, forward_kwargs
    oracle = build_tiny_components(TINY, names=["transformer"])["transformer"]
    step = make_step(build_tiny_components(TINY, names=["transformer"])["transformer"], "jax")
    pair = forward_kwargs(0)
    one = {k: v[1:] if isinstance(v, torch.Tensor) and v.shape[:1] == (2,) else v for k, v in pair.items()}
    errors = []
    for kwargs in (pair, one):
        with torch.no_grad():
            errors.append((step(**kwargs) - oracle(**kwargs).sample).abs().max().item())
        results.setdefault("layouts", []).append(step.layout)
    results["step_errors"], results["compilations"] = errors, step.compilations
    print(json.dumps(results))
""")


@pytest.mark.slow  # its own process with 8 emulated CPU devices; four 2-step tiny stage-2 runs
def test_stage2_without_a_mesh_uses_the_devices_and_matches_one_device(run_probe, tiny_run, tmp_path):
    pytest.importorskip("torchax")
    r = run_probe("-c", PROBE, str(tiny_run), str(tmp_path), os.path.dirname(__file__))
    print({k: r[k] for k in ("error", "cfg_off_error", "cfg_changes", "step_errors", "layouts")})
    assert all(r[n]["code"] == 0 for n in ("default", "one", "cfg_off", "cfg_off_one")), r
    # the tiny model's 2 heads: the CFG pair on data, tensor=2 (4 of the 8 devices); CFG off: tensor=2
    assert (r["default"]["mesh"], r["default"]["source"], r["default"]["sharding"]) == (
        "data=2,tensor=2", "default", "tp_replicated_out")
    assert r["default"]["lines"] == ["mesh: data=2,tensor=2 (4 of 8 devices: tensor must divide the model's 2 "
                                     "attention heads; --mesh 1 for one)"]
    assert (r["cfg_off"]["mesh"], r["cfg_off"]["source"]) == ("tensor=2", "default")
    assert r["cfg_off"]["lines"][0].startswith("mesh: tensor=2 (2 of 8 devices: ")
    for name in ("one", "cfg_off_one"):  # --mesh 1: one device, said so, nothing logged
        assert (r[name]["mesh"], r[name]["source"], r[name]["sharding"], r[name]["lines"]) == ("1", "--mesh", None, [])
    # the sharded runs are the one-device runs (test_tpu.py's tolerance), and the CFG switch did change the result
    assert r["error"] <= 1e-4 and r["cfg_off_error"] <= 1e-4, r
    assert r["cfg_changes"] > 1e-3, r
    # make_step(model, "jax"): the CFG pair's layout, then one sample's, each equal to eager torch (test_tpu.py's 1e-5)
    assert r["layouts"] == ["data=2,tensor=2", "tensor=2"] and r["compilations"] == 2, r
    assert max(r["step_errors"]) <= 1e-5, r

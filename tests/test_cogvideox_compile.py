"""CogVideoX1.5 on the planning side: the analytic FLOP count against XLA's dots, the compile-for-TPU path (libtpu, no
TPU) against the planner, the saved real-size compile (fits on a v6e-8), and Splash at head dim 64."""

import dataclasses
import json
import os

import numpy as np
import pytest
import torch

from hyv_lib.models.families import get_preset
from hyv_lib.planning.costs import step_flops, token_counts
from hyv_lib.planning.planner import device_plan

TINY = get_preset("cogvideox_tiny")
HERE = os.path.dirname(__file__)
RESULTS = os.path.join(HERE, "..", "benchmarks", "results", "cogvideox_compile_2026-11-27_cpu_libtpu.json")
#: The issue's command (with the CLI's default rule set named), as benchmarks/cogvideox_compile.py ran it.
ISSUE_ROW = "768x1360/v6e-8/data=2,tensor=4/tp_replicated_out"


def test_token_counts_follow_the_pipeline_padding():
    """81 frames -> 21 latent frames, padded to 22 as CogVideoXPipeline pads them -> 11 token frames; 2x2 patches."""
    assert token_counts("cogvideox1.5_5b", 768, 1360, 81) == dict(video=11 * 48 * 85, context=226, joint=45106,
                                                                  text=226, byt5=0, image=0)
    assert token_counts("cogvideox1.5_5b", 720, 1280, 81)["video"] == 11 * 45 * 80 == 39600


def test_analytic_flops_equal_the_dots_xla_keeps_in_the_tiny_step():
    """Every matmul of the compiled tiny step (XLA's HLO re-counted, hyv_lib.planning.hlo.xla_flops: an independent
    count of the program) is in step_flops and nothing else is: equal, dot for dot (measured: 813,518,848 both).
    cost_analysis adds the elementwise work on top (norms, GELU, RoPE, softmax): a few percent."""
    pytest.importorskip("torchax")
    from hyv_lib.kernels.xla import DEFAULT_BLOCK_KV
    from hyv_lib.models.registry import get_adapter
    from hyv_lib.planning.hlo import xla_flops
    from hyv_lib.runtimes.jax_step import JaxTransformer

    adapter = get_adapter(TINY.model)
    torch.manual_seed(0)
    tpu = JaxTransformer(adapter.build(TINY.transformer).eval(), attention="xla")
    # 96x160x9: 120 video + 226 text = 346 tokens, one key block of the XLA kernel (its scan has one trip)
    x = xla_flops(tpu.lower(**adapter.example_inputs(TINY, 96, 160, 9, dtype=torch.float32)).compile())
    f = step_flops(TINY, 96, 160, 9, kv_block=DEFAULT_BLOCK_KV)
    assert x["unknown_trip_counts"] == 0
    assert x["matmul"] == f["total"]
    assert 0 < x["cost_analysis"] / f["total"] - 1 < 0.08


def test_real_size_flops():
    """One CFG step at 768x1360x81: 2.96 PFLOP, 71% of it attention (4 B H S^2 D over 45,106 joint tokens)."""
    f = step_flops("cogvideox1.5_5b", 768, 1360, 81)
    assert f["tokens"]["batch"] == 2
    assert f["parts"]["blocks_attention"] == 42 * 4 * 2 * 48 * 45106 ** 2 * 64
    assert f["parts"]["blocks_linear"] == 42 * 2 * 2 * 45106 * (4 * 3072 ** 2 + 2 * 3072 * 4 * 3072)
    assert f["total"] == pytest.approx(2.958e15, rel=1e-3) and f["attention_share"] == pytest.approx(0.71, abs=0.01)


def small():
    """cogvideox_tiny with CogVideoX's head dim (64) and 8 heads (an 8-device mesh splits them), 2 blocks."""
    return dataclasses.replace(TINY, name="cogvideox_small", transformer=dict(
        TINY.transformer, num_attention_heads=8, attention_head_dim=64))


@pytest.mark.parametrize("mesh, rules", [({"data": 2, "tensor": 4}, "tp"), ({"tensor": 8}, "tp")])
def test_compiles_for_v6e_8_and_the_planner_agrees_on_collectives_and_matmuls(compile_once, mesh, rules):
    """The model through the compile path (its adapter builds it and its inputs) for a v6e-8, against the planner:
    collective bytes per kind within 1% (measured: equal) and per-device matmul FLOPs within 0.1% (measured: 0.03%
    and 0.00%) of the compiled HLO's. Splash compiles natively, one kernel per block. (``tp_replicated_out`` is
    checked at the real size, on the saved compile below.)"""
    pytest.importorskip("libtpu", reason="the TPU compiler comes with libtpu (requirements.txt, Linux only)")
    preset = small()
    compiled = compile_once(preset, "v6e:2x4", mesh=mesh, sharding=rules, height=192, width=320, video_length=17)
    assert compiled["fits"] and compiled["splash_kernels"] == 2 and compiled["attention"]["native"]
    assert compiled["tokens"] == token_counts(preset, 192, 320, 17)
    plan = device_plan(preset, 192, 320, 17, mesh, rules)
    kinds = {c["kind"]: c["bytes"] for c in compiled["collectives"]}
    assert set(kinds) <= {k for k, v in plan["collectives"].items() if v}
    for kind, value in plan["collectives"].items():
        assert value == pytest.approx(kinds.get(kind, 0), rel=0.01), kind
    assert plan["flops"]["linear"] == pytest.approx(compiled["matmul_flops_per_device"], rel=1e-3)
    groups = {op["group"] for op in compiled["collective_ops"] if op["kind"] == "all-reduce"}
    assert groups == {mesh["tensor"]}  # the row-parallel all-reduces run over the tensor axis only


def test_the_saved_real_size_compile_fits_on_a_v6e_8_and_matches_the_planner():
    """The issue's Done-when, from benchmarks/cogvideox_compile.py's saved run (a real-size compile takes 7 minutes
    on this machine's 2 shared cores, too long for a test): 768x1360x81 on data=2 x tensor=4 fits a v6e-8, Splash
    native in every block; the planner's per-device memory within 3% of the compiler's total less its generated
    code (which the planner does not model), its collectives within 1%."""
    with open(RESULTS) as f:
        row = json.load(f)["runs"][ISSUE_ROW]
    assert row["fits"] is True and row["device_kind"] == "TPU v6 lite" and row["devices"] == 8
    assert row["command"].startswith("python -m hyv_lib compile --preset cogvideox1.5_5b --topology v6e:2x4 "
                                     "--mesh data=2,tensor=4 --sharding tp_replicated_out --height 768 --width 1360 "
                                     "--video_length 81 --json")
    assert row["splash_kernels"] == 42 and row["tokens"]["joint"] == 45106
    assert row["per_device_bytes"]["total"] <= row["hbm_available_per_device"]
    plan = device_plan("cogvideox1.5_5b", 768, 1360, 81, row["mesh"], row["sharding"])
    bytes_ = row["per_device_bytes"]
    assert plan["per_device_bytes"]["total"] == pytest.approx(bytes_["total"] - bytes_["code"], rel=0.03)
    kinds = {c["kind"]: c["bytes"] for c in row["collectives"]}
    for kind, value in plan["collectives"].items():
        assert value == pytest.approx(kinds.get(kind, 0), rel=0.01), kind


@pytest.mark.parametrize("pad_head_dim", [True, False])
def test_splash_at_head_dim_64_padded_or_not_equals_dense_attention(pad_head_dim):
    """Splash in interpret mode at CogVideoX's head dim, zero-padded to 128 (the library's default,
    hyv_lib.kernels.splash.PAD_HEAD_DIM) and as is, against float64 softmax attention: within 1e-5 (fp32)."""
    from hyv_lib.kernels.splash import PAD_HEAD_DIM, splash_attention_jax

    assert PAD_HEAD_DIM is True
    gen = torch.Generator().manual_seed(64)
    q, k, v = (torch.randn(2, 2, 300, 64, generator=gen) for _ in range(3))
    mask = torch.ones(2, 300, dtype=torch.bool)
    out = splash_attention_jax(q.numpy(), k.numpy(), v.numpy(), mask.numpy(), block_q=128, block_kv=256,
                               block_kv_compute=128, interpret=True, compute_dtype="float32",
                               pad_head_dim=pad_head_dim)
    expected = torch.softmax(q.double() @ k.double().transpose(-1, -2) / 8.0, dim=-1) @ v.double()
    assert torch.from_numpy(np.array(out)).double().sub(expected).abs().max() < 1e-5


def test_plan_command_covers_cogvideox_and_names_bad_flags(capsys):
    """``python -m hyv_lib plan`` (in process): the 768x1360x81 step on a v6e-8 at data=2 x tensor=4 fits, its FLOPs
    are step_flops', a device does more than an eighth of them (tp_replicated_out runs to_out whole), its memory is
    between 6 and 10 GiB (the compiler: 8.80 GiB); a bad mesh is one error line naming --mesh."""
    from hyv_lib.cli.commands import run

    assert run(["plan", "--preset", "cogvideox1.5_5b", "--mesh", "data=2,tensor=4", "--height", "768", "--width",
                "1360", "--video_length", "81", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    flops = step_flops("cogvideox1.5_5b", 768, 1360, 81)
    assert report["model"] == "cogvideox" and report["fits"] and report["mesh"] == dict(data=2, tensor=4, sequence=1)
    assert report["flops"] == flops["total"] and report["flops_per_device"] > flops["total"] / 8
    assert 6 * 2**30 < report["per_device_bytes"]["total"] < 10 * 2**30
    assert run(["plan", "--preset", "cogvideox1.5_5b", "--mesh", "tensor=5"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --mesh: ") and err.count("\n") == 1

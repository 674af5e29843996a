"""The planner's fsdp layout on a tensor axis against the TPU compiler at a size other than the saved 720p rows: the
tiny HunyuanVideo (2 dual- + 2 single-stream blocks) compiled for a v6e-8 (libtpu, no TPU)."""

from __future__ import annotations

import pytest

from hyv_lib.planning.planner import device_plan


def test_tiny_fsdp_on_a_tensor_axis_matches_the_compiler(compile_once):
    """fsdp on tensor=8: XLA runs the Q/K/V (and the single blocks' proj_mlp) on their shards, gathers the other block
    matrices, all-gathers the dual blocks' attention output and all-reduces the single blocks' proj_out: the planner's
    collectives within 1% per kind (measured: equal), its matmuls within 2% (measured: +0.5%, the small embedders;
    the whole-matmul model it replaced counted +110%)."""
    pytest.importorskip("libtpu", reason="the TPU compiler comes with libtpu (requirements.txt, Linux only)")
    compiled = compile_once("hunyuanvideo_tiny", "v6e:2x4", mesh="tensor=8", sharding="fsdp", height=192, width=320,
                            video_length=17)
    plan = device_plan("hunyuanvideo_tiny", 192, 320, 17, "tensor=8", "fsdp")
    kinds = {c["kind"]: c["bytes"] for c in compiled["collectives"]}
    assert set(kinds) == {k for k, v in plan["collectives"].items() if v}
    for kind, value in plan["collectives"].items():
        assert value == pytest.approx(kinds.get(kind, 0), rel=0.01), kind
    assert plan["sent_bytes"] == pytest.approx(sum(op["sent_bytes"] for op in compiled["collective_ops"]), rel=0.01)
    assert plan["flops"]["linear"] == pytest.approx(compiled["matmul_flops_per_device"], rel=0.02)

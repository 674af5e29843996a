"""Run by tests/test_sharding.py in a fresh process with 8 emulated CPU devices (XLA_FLAGS set first).

For each (rule set, mesh, attention backend) case: the sharded JaxTransformer's output vs diffusers'
eager forward, the local shard shape of a few weights, and the placement report. Prints one JSON line.
"""

import copy
import json
import os
import sys

os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"

import torch  # noqa: E402
from diffusers import HunyuanVideo15Transformer3DModel  # noqa: E402

from hyv_lib.models.families import get_preset  # noqa: E402
from hyv_lib.models.hunyuan_video15.components import example_forward_kwargs  # noqa: E402
from hyv_lib.parallel.mesh import make_mesh  # noqa: E402
from hyv_lib.planning.hlo import hlo_collectives  # noqa: E402
from hyv_lib.runtimes.jax_step import JaxTransformer  # noqa: E402

WEIGHTS = ("transformer_blocks.0.attn.to_q.weight", "transformer_blocks.0.attn.to_out.0.weight",
           "transformer_blocks.1.ff.net.2.weight", "transformer_blocks.1.ff_context.net.0.proj.weight")


def main(cases):
    tiny = get_preset("tiny")
    torch.manual_seed(0)
    # tiny with 8 heads of 16, so every mesh below can split the heads
    oracle = HunyuanVideo15Transformer3DModel(**dict(tiny.transformer, num_attention_heads=8,
                                                     attention_head_dim=16)).eval().requires_grad_(False)
    kwargs = example_forward_kwargs(tiny, seed=1, latent=(2, 4, 6), text_lengths=(14, 50), byt5_lengths=(0, 7),
                                    timestep=600.0)
    with torch.no_grad():
        expected = oracle(**kwargs).sample
    results = []
    for rules, mesh_kwargs, attention in cases:
        mesh = make_mesh(**mesh_kwargs)
        tpu = JaxTransformer(copy.deepcopy(oracle), mesh=mesh, sharding=rules, attention=attention)
        out = tpu(**kwargs)
        params = {k.removeprefix("model."): v for k, v in {**tpu.jitted.params, **tpu.jitted.buffers}.items()}
        from torchax.interop import jax_view

        shards = {w: list(jax_view(params[w]).addressable_shards[0].data.shape) for w in WEIGHTS}
        full = {w: list(params[w].shape) for w in WEIGHTS}
        results.append({"rules": rules, "mesh": mesh_kwargs, "attention": attention,
                        "max_err": (out - expected).abs().max().item(), "shards": shards, "full": full,
                        "placement": tpu.placement, "compilations": tpu.compilations,
                        "collectives": hlo_collectives(tpu.lower(**kwargs).compile().as_text())})
    try:  # the real tiny preset has 2 heads: 8-way tensor parallelism cannot split them
        JaxTransformer(HunyuanVideo15Transformer3DModel(**tiny.transformer), mesh=make_mesh(tensor=8))
        head_error = None
    except ValueError as err:
        head_error = str(err)
    print(json.dumps({"cases": results, "head_error": head_error}))


def flops(meshes):
    """Per-device FLOPs (XLA cost_analysis) of the whole compiled step on each mesh, for a model whose video tokens
    outnumber its context tokens (as at real size) and dense XLA attention (no loop, so every FLOP is counted)."""
    import dataclasses

    tiny = get_preset("tiny")
    small = dataclasses.replace(tiny, text_len=16, byt5_len=8, image_tokens=4)
    torch.manual_seed(0)
    model = HunyuanVideo15Transformer3DModel(**dict(tiny.transformer, num_attention_heads=8,
                                                    attention_head_dim=16)).eval().requires_grad_(False)
    kwargs = example_forward_kwargs(small, seed=1, latent=(4, 16, 16), text_lengths=(9, 16), byt5_lengths=(0, 5))
    with torch.no_grad():
        expected = model(**kwargs).sample
    rows = []
    for axes in meshes:
        step = JaxTransformer(copy.deepcopy(model), mesh=make_mesh(**axes), sharding="tp", attention="xla",
                              attention_options={"block_kv": None})
        cost = step.lower(**kwargs).compile().cost_analysis()
        rows.append({"mesh": axes, "flops": float(cost["flops"]), "max_err": (step(**kwargs) - expected).abs().max().item()})
    print(json.dumps(rows))


if __name__ == "__main__":
    if sys.argv[1] == "flops":
        flops(json.loads(sys.argv[2]))
    else:
        main(json.loads(sys.argv[1]))

"""Run by tests/test_multihost.py: one of two JAX processes (jax.distributed on 127.0.0.1, CPU collectives over
gloo), each with 4 emulated CPU devices, so a mesh of all 8 devices spans both processes and neither process can
address every device. Prints one JSON line: the sharded step (and DeepCache's pair) against diffusers' eager forward.
"""

import copy
import json
import os
import sys

os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"


def main(process_id: int, port: int) -> None:
    import jax

    jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=process_id,
                               initialization_timeout=120)
    import torch
    from diffusers import HunyuanVideo15Transformer3DModel
    from torchax.interop import jax_view

    from hyv_lib.models.families import get_preset
    from hyv_lib.models.hunyuan_video15.components import example_forward_kwargs
    from hyv_lib.parallel.mesh import make_mesh
    from hyv_lib.runtimes.jax_step import JaxTransformer

    tiny = get_preset("tiny")
    torch.manual_seed(0)  # the same weights and inputs in both processes, as a real multi-host launch loads them
    oracle = HunyuanVideo15Transformer3DModel(**dict(tiny.transformer, num_attention_heads=8,
                                                     attention_head_dim=16)).eval().requires_grad_(False)
    kwargs = example_forward_kwargs(tiny, seed=1, latent=(2, 4, 6), text_lengths=(14, 50), byt5_lengths=(0, 7),
                                    timestep=600.0)
    with torch.no_grad():
        expected = oracle(**kwargs).sample
    cases = []
    for axes in ({"data": 2, "tensor": 4}, {"tensor": 4, "sequence": 2}):
        step = JaxTransformer(copy.deepcopy(oracle), mesh=make_mesh(**axes), sharding="tp", attention="xla")
        out = step(**kwargs)
        full, cache = step.run_and_cache(1, **kwargs)
        cached = step.run_from_cache(cache, 1, **kwargs)
        weight = jax_view(step.jitted.buffers["model.transformer_blocks.0.attn.to_q.weight"])
        cases.append(dict(mesh=axes, max_err=(out - expected).abs().max().item(),
                          deepcache_full_err=(full - expected).abs().max().item(),
                          deepcache_cached_err=(cached - expected).abs().max().item(),
                          weights_fully_addressable=weight.is_fully_addressable,
                          output_shape=list(out.shape)))
    print(json.dumps(dict(process=jax.process_index(), processes=jax.process_count(), devices=jax.device_count(),
                          local_devices=jax.local_device_count(), cases=cases)), flush=True)
    jax.distributed.shutdown()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))

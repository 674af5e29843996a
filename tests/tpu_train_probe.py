"""Run by tests/test_tpu_train.py in a fresh process with 4 emulated CPU devices (XLA_FLAGS set first).

The tiny DiT's JAX train step on a mesh (FSDP over data=2 x sequence=2) against the same step on one device: the losses
and trained parameters of a few steps, and the per-device shapes of a weight and of its optimizer state. Prints one
JSON line.
"""

import copy
import json
import os
import sys

os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"

import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
from tiny_inputs import forward_kwargs  # noqa: E402

from hyv_lib.base.presets import get_preset  # noqa: E402
from hyv_lib.models.components import build_tiny_components  # noqa: E402
from hyv_lib.models.lora import add_lora  # noqa: E402
from hyv_lib.runtimes.tpu_train import TpuTrainStep  # noqa: E402


def main(trainable: str, steps: int):
    torch.manual_seed(0)
    model = build_tiny_components(get_preset("tiny"), names=["transformer"])["transformer"].float()
    if trainable == "lora":
        add_lora(model, 4, 8.0)
        with torch.no_grad():  # random B factors, so the A factors train from the first step
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    p.normal_(0, 0.05)
    kwargs = forward_kwargs(0)
    kwargs.pop("return_dict", None)
    batch = dict(kwargs, target=torch.randn(2, 8, *kwargs["hidden_states"].shape[2:],
                                            generator=torch.Generator().manual_seed(1)))
    runs = {}
    # the mesh runs the blocks as a scan (the default), one device unrolled: the two programs check each other
    for name, mesh in (("one", None), ("mesh", "data=2,sequence=2")):
        step = TpuTrainStep(copy.deepcopy(model), mesh=mesh, trainable=trainable, learning_rate=1e-3,
                            compiler_options={"xla_backend_optimization_level": 0}, scan_blocks=mesh is not None)
        losses = [step.step(batch) for _ in range(steps)]
        runs[name] = dict(step=step, losses=losses, params=dict(step.trained_transformer().named_parameters()))
    weight = "transformer_blocks.*.ff.net.0.proj.weight"  # stacked over the 2 blocks
    lora = "transformer_blocks.*.attn.to_q.lora_B.default.weight"
    sharded = runs["mesh"]["step"]
    adam = sharded.opt_state[1][0]  # clip_by_global_norm's state, then adamw's chain: scale_by_adam's first
    mu = adam.mu[lora if trainable == "lora" else weight]

    print(json.dumps({
        "losses": {k: r["losses"] for k, r in runs.items()},
        "max_param_err": max((runs["mesh"]["params"][n] - p).abs().max().item()
                             for n, p in runs["one"]["params"].items()),
        "max_param_change": max((p - dict(model.named_parameters())[n]).abs().max().item()
                                for n, p in runs["one"]["params"].items()),
        "scan": [runs["one"]["step"].scan, sharded.scan],
        "weight": {"full": list(sharded.frozen[weight].shape if weight in sharded.frozen else
                                sharded.params[weight].shape),
                   "shard": list((sharded.frozen.get(weight) if weight in sharded.frozen else
                                  sharded.params[weight]).addressable_shards[0].data.shape)},
        "mu": {"name": lora if trainable == "lora" else weight, "full": list(mu.shape),
               "shard": list(mu.addressable_shards[0].data.shape)},
        "devices": len(sharded.mesh.devices.flat),
        "placement": sharded.placement,
        "compilations": sharded.compilations,
    }))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))

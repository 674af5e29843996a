"""The tiny LoRA model and batch of tests/test_tpu_train.py; run as a script (in a fresh process with 4 emulated CPU
devices), the same three JAX LoRA steps on a mesh (FSDP over data=2 x sequence=2): prints one JSON line with the
losses, the trained LoRA factors and the per-device shapes of a block weight and of a LoRA factor's AdamW moment."""

import copy
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
from tiny_inputs import forward_kwargs  # noqa: E402

from hyv_lib.models.families import get_preset  # noqa: E402
from hyv_lib.models.components import build_tiny_components  # noqa: E402
from hyv_lib.models.lora import add_lora  # noqa: E402
from hyv_lib.runtimes.jax_train import JaxTrainStep  # noqa: E402

TINY = get_preset("tiny")
LR, WD, STEPS = 1e-3, 0.01, 3
FAST = {"xla_backend_optimization_level": 0}  # compiles the CPU programs about twice as fast here


def lora_model() -> torch.nn.Module:
    """The tiny DiT in fp32 with a rank-4 LoRA, its factors drawn from a seeded generator (peft draws A from the
    global RNG) and B random too (at B = 0 the A factors get no gradient)."""
    model = build_tiny_components(TINY, names=["transformer"])["transformer"].float()
    add_lora(model, 4, 8.0)
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=generator) * (0.05 if "lora_B" in name else 0.3))
    return model


def train_batch() -> dict[str, torch.Tensor]:
    """A t2v batch of 2 with real padding (different text and ByT5 lengths) and a velocity target."""
    kwargs = forward_kwargs(0)
    kwargs.pop("return_dict", None)
    target = torch.randn(2, TINY.latent_channels, *kwargs["hidden_states"].shape[2:],
                         generator=torch.Generator().manual_seed(1))
    return dict(kwargs, target=target)


def lora_steps(model, batch, **options) -> tuple[JaxTrainStep, list[float], dict]:
    """STEPS LoRA updates: (the step, the losses, its state after the first)."""
    step = JaxTrainStep(copy.deepcopy(model), trainable="lora", learning_rate=LR, weight_decay=WD,
                        compiler_options=FAST, **options)
    losses = [step.step(batch)]
    state = step.state_dict()
    losses += [step.step(batch) for _ in range(STEPS - 1)]
    return step, losses, state


def main():
    step, losses, _ = lora_steps(lora_model(), train_batch(), mesh="data=2,sequence=2")
    weight = "transformer_blocks.*.ff.net.0.proj.weight"  # stacked over the 2 blocks for the scan
    lora = "transformer_blocks.*.attn.to_q.lora_B.default.weight"
    mu = step.opt_state[1][0].mu[lora]  # clip_by_global_norm's state, then adamw's chain: scale_by_adam's first
    trained = {n: p.tolist() for n, p in step.trained_transformer().named_parameters() if "lora_" in n}
    print(json.dumps({
        "losses": losses, "trained": trained, "scan": step.scan, "devices": len(step.mesh.devices.flat),
        "compilations": step.compilations, "placement": step.placement,
        "weight": {"full": list(step.frozen[weight].shape),
                   "shard": list(step.frozen[weight].addressable_shards[0].data.shape)},
        "mu": {"full": list(mu.shape), "shard": list(mu.addressable_shards[0].data.shape)},
    }))


if __name__ == "__main__":
    os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
    main()  # jax is first imported here, after the flag

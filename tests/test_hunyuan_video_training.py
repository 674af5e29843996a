"""MindSpeed-MM's recipe on HunyuanVideo (13B) at tiny size: features from a data.json, the train step's batch and loss
against diffusers' eager forward, a LoRA over the attention, MLP and single-stream layers that diffusers' own
HunyuanVideo LoRA loader reads, and ``generate --lora``."""

import copy
import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from tiny_inputs import replay_draws

from hyv_lib.cli.commands import run
from hyv_lib.models.families import get_preset
from hyv_lib.models.hunyuan_video.components import build_tiny
from hyv_lib.models.lora import merge_lora
from hyv_lib.training.feature_set import FeatureSet
from hyv_lib.training.loop import build_batch, pick_clips, train

PRESET = get_preset("hunyuanvideo_tiny")
CAPTIONS = ["a red circle", "a blue square moving left", "a green ball", "a gray box"]


@pytest.fixture(scope="module")
def features_dir(tmp_path_factory):
    """Four one-frame clips (PNG images) of two shapes, text-to-video features of hunyuanvideo_tiny."""
    from PIL import Image

    from hyv_lib.training.features import extract_features

    folder = tmp_path_factory.mktemp("hv_train")
    rng = np.random.default_rng(0)
    entries = []
    for i, (h, w) in enumerate([(64, 112), (64, 112), (112, 64), (64, 112)]):
        Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)).save(folder / f"img{i}.png")
        entries.append({"path": f"img{i}.png", "cap": CAPTIONS[i]})
    (folder / "data.json").write_text(json.dumps(entries))
    report = extract_features(str(folder / "data.json"), preset=PRESET.name, output_dir=str(folder / "features"),
                              task="t2v", progress=False)
    assert report.ok, report.failed
    return str(folder / "features")


def test_the_batch_and_the_loss_are_the_objective(features_dir):
    """build_batch against its draws replayed by hand (coins, noise, noise levels): the noisy latents alone, the
    velocity target, timestep sigma x 1000, the embedded guidance 6.0 x 1000, the empty prompt where a caption
    dropped; then one full-weight TorchTrainStep's loss against diffusers' eager fp32 forward on that batch."""
    from hyv_lib.runtimes.torch_train import TorchTrainStep

    features = FeatureSet(features_dir)
    assert features.text_names == ("prompt_embeds", "prompt_embeds_mask", "pooled_prompt_embeds")
    g = torch.Generator().manual_seed(5)
    picks = pick_clips(features.shapes(), 2, g)
    state = g.get_state()
    batch = build_batch(features, picks, preset=PRESET, model_config=PRESET.transformer, task="t2v",
                        caption_dropout=0.5, shift=3.0, sampling="logit_normal", generator=g)
    g.set_state(state)
    clips, drop, x0, noise, sigma = replay_draws(features, picks, g, 3.0)
    s = sigma.view(2, 1, 1, 1, 1)
    assert torch.equal(batch["hidden_states"], (1 - s) * x0 + s * noise)
    assert torch.equal(batch["target"], noise - x0)
    assert torch.allclose(batch["timestep"], sigma * 1000)
    assert torch.equal(batch["guidance"], torch.tensor([6000.0, 6000.0]))
    for i, c in enumerate(clips):
        source = features.negative if drop[i] else c
        assert torch.equal(batch["encoder_hidden_states"][i], source["prompt_embeds"])
        assert torch.equal(batch["encoder_attention_mask"][i], source["prompt_embeds_mask"])
        assert torch.equal(batch["pooled_projections"][i], source["pooled_prompt_embeds"])

    model = build_tiny(PRESET, seed=1, names=["transformer"])["transformer"]
    oracle = copy.deepcopy(model).train().requires_grad_(True)
    step = TorchTrainStep(model, trainable="full", learning_rate=1e-3, remat=False)
    loss = step.step(batch)
    inputs = {k: v for k, v in batch.items() if k != "target"}
    expected = (oracle(**inputs).sample - batch["target"]).pow(2).mean().item()
    print(f"loss {loss:.6f} vs eager {expected:.6f}")
    assert loss == pytest.approx(expected, rel=1e-6)


def test_a_lora_from_data_json_to_generate(features_dir, tmp_path, capsys):
    """train (LoRA rank 4 on attention, MLP and the single-stream blocks' linear layers, as MindSpeed-MM's
    HunyuanVideo LoRA) writes a file that diffusers' HunyuanVideoPipeline.load_lora_weights reads and fuses into the
    same weights hyv_lib's merge gives; ``generate --lora`` runs it and moves the latents."""
    from diffusers import HunyuanVideoPipeline

    out = tmp_path / "lora"
    result = train(features_dir, preset=PRESET.name, output_dir=str(out), lora_rank=4, steps=3, batch_size=2,
                   learning_rate=1e-2, warmup_steps=0, lora_targets="attn,mlp,single", progress=False)
    assert result.output.endswith("pytorch_lora_weights.safetensors")
    keys = load_file(result.output)
    assert any(".single_transformer_blocks." in k and "proj_mlp" in k for k in keys)
    assert any(".transformer_blocks." in k and ".ff." in k for k in keys)

    components = build_tiny(PRESET, seed=0)
    pipe = HunyuanVideoPipeline(**components)
    ours = copy.deepcopy(components["transformer"])
    merge_lora(ours, result.output)
    pipe.load_lora_weights(str(out))
    pipe.fuse_lora()
    theirs = {n.replace(".base_layer.", "."): p for n, p in pipe.transformer.named_parameters() if "lora_" not in n}
    assert theirs.keys() == dict(ours.named_parameters()).keys()
    worst = max((p - theirs[n]).abs().max().item() for n, p in ours.named_parameters())
    moved = max((p - q).abs().max().item() for p, q in zip(ours.parameters(),
                                                            build_tiny(PRESET, seed=0)["transformer"].parameters()))
    print(f"hyv_lib's merge vs diffusers' fuse_lora: {worst:.1e}; the LoRA moved a weight by up to {moved:.1e}")
    assert moved > 1e-4 and worst <= 1e-6

    common = ["--preset", PRESET.name, "--prompt", "a red circle", "--num_inference_steps", "2", "--video_length",
              "5", "--seed", "3", "--quiet"]
    assert run(["generate", *common, "--output_dir", str(tmp_path / "base")]) == 0
    assert run(["generate", *common, "--lora", str(out), "--output_dir", str(tmp_path / "tuned")]) == 0
    base, tuned = (load_file(str(tmp_path / d / "stage2_latents.safetensors"))["latents"] for d in ("base", "tuned"))
    assert (base - tuned).abs().max() > 1e-4


def test_the_jax_train_step_is_the_objective(features_dir):
    """JaxTrainStep (torchax, one device) on a HunyuanVideo batch with a LoRA on the attention, MLP and single-stream
    layers (B factors random, so every factor has a gradient): the dual- and the single-stream blocks run as two
    ``lax.scan`` loops over their stacked weights, and the loss and every LoRA factor's gradient equal torch autograd
    through diffusers' eager fp32 forward (the guidance and pooled text in every block's modulation:
    ModelAdapter.condition_embedding). Measured: loss within 1e-7 relative; gradients within 9.8e-6 of the largest
    (the unrolled blocks' the same: scan and unrolled differ by 2e-7 of the largest)."""
    pytest.importorskip("optax")
    from hyv_lib.models.lora import add_lora
    from hyv_lib.runtimes.jax_train import JaxTrainStep

    features = FeatureSet(features_dir)
    g = torch.Generator().manual_seed(7)
    batch = build_batch(features, pick_clips(features.shapes(), 2, g), preset=PRESET, model_config=PRESET.transformer,
                        task="t2v", caption_dropout=0.0, shift=3.0, sampling="logit_normal", generator=g)
    model = build_tiny(PRESET, seed=2, names=["transformer"])["transformer"]
    add_lora(model, 4, 8.0, targets="attn,mlp,single")
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=g) * (0.05 if "lora_B" in name else 0.3))
    oracle = copy.deepcopy(model)
    for name, p in oracle.named_parameters():
        p.requires_grad_("lora_" in name)
    inputs = {k: v for k, v in batch.items() if k != "target"}
    expected = (oracle(**inputs).sample - batch["target"]).pow(2).mean()
    expected.backward()

    step = JaxTrainStep(copy.deepcopy(model), trainable="lora", compiler_options={"xla_backend_optimization_level": 0})
    assert step.scan == ("transformer_blocks.", "single_transformer_blocks.")  # two loops, one per block kind
    assert "single_transformer_blocks.*.proj_out.lora_A.default.weight" in step.params  # [2, r, in]: stacked
    loss, grads = step.gradients(batch)
    reference = {n: torch.zeros_like(p) if p.grad is None else p.grad for n, p in oracle.named_parameters()
                 if "lora_" in n}
    assert set(grads) == set(reference)
    scale = max(r.abs().max().item() for r in reference.values())
    error = max((grads[n] - r).abs().max().item() for n, r in reference.items())
    print(f"JAX train step loss {loss:.6f} vs eager {expected.item():.6f}; gradients within {error / scale:.1e} of "
          f"the largest ({len(grads)} LoRA factors)")
    assert loss == pytest.approx(expected.item(), rel=1e-5)
    assert error <= 3e-5 * scale

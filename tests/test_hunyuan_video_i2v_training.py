"""HunyuanVideo-I2V (the 33-channel latent-concat checkpoint) fine-tuned at tiny size: features of 5-frame clips
against HunyuanVideoImageToVideoPipeline's own methods (LLaVA reading each clip's first frame with its caption, the
frame's latents), the train step's 33-channel input and loss against the pipeline's ``latent_model_input`` and
diffusers' eager forward, and ``train`` then ``generate --lora --image_path`` through the CLI."""

import copy
import json
import os

import numpy as np
import pytest
import torch
from diffusers import HunyuanVideoImageToVideoPipeline
from PIL import Image
from safetensors.torch import load_file

from tiny_inputs import replay_draws

from hyv_lib.cli.commands import run
from hyv_lib.models.hunyuan_video import first_frame
from hyv_lib.models.hunyuan_video.components import I2V_COMPONENTS, build_tiny
from hyv_lib.models.hunyuan_video.presets import HUNYUANVIDEO_I2V_TINY, i2v_text_tokens
from hyv_lib.pipeline.video_io import read_mp4, write_mp4
from hyv_lib.training.feature_set import FeatureSet
from hyv_lib.training.loop import build_batch, pick_clips

PRESET = HUNYUANVIDEO_I2V_TINY
CAPTIONS = ["a red circle", "a blue square moving left", "a red circle"]  # clip 0 and 2: one caption, two frames
SIZES = [(96, 160), (96, 160), (144, 96)]  # sizes extraction keeps as they are (no crop)


def clip_frames(index: int, height: int, width: int) -> np.ndarray:
    """Five frames of a bright disc drifting over a coloured ramp (each clip its own colours)."""
    ys, xs = np.mgrid[0:height, 0:width]
    frames = []
    for t in range(5):
        cx, cy = width // 3 + 6 * t, height // 2
        disc = (xs - cx) ** 2 + (ys - cy) ** 2 < (min(height, width) // 5) ** 2
        image = np.stack([xs * 255 // width, ys * 255 // height, np.full_like(xs, 60 * index)], -1)
        image[disc] = (230, 40 * index, 30)
        frames.append(image.astype(np.uint8))
    return np.stack(frames)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """Three 5-frame mp4 clips (two bucket shapes), their I2V features, and the first frames as ffmpeg decodes them."""
    from hyv_lib.training.features import extract_features

    folder = tmp_path_factory.mktemp("hv_i2v_train")
    entries, firsts = [], []
    for i, (h, w) in enumerate(SIZES):
        write_mp4(clip_frames(i, h, w), str(folder / f"clip{i}.mp4"), 24.0)
        firsts.append(Image.fromarray(read_mp4(str(folder / f"clip{i}.mp4"))[0][0]))
        entries.append({"path": f"clip{i}.mp4", "cap": CAPTIONS[i]})
    (folder / "data.json").write_text(json.dumps(entries))
    report = extract_features(str(folder / "data.json"), preset=PRESET.name, output_dir=str(folder / "features"),
                              num_frames=5, progress=False)
    assert report.ok, report.failed
    return {"features": str(folder / "features"), "firsts": firsts, "dir": folder}


@pytest.fixture(scope="module")
def pipe():
    pipeline = HunyuanVideoImageToVideoPipeline(**{k: v for k, v in build_tiny(PRESET, seed=0).items()
                                                   if k in I2V_COMPONENTS})
    pipeline.set_progress_bar_config(disable=True)
    return pipeline


def pipeline_text(pipeline) -> dict:
    """The keywords that give the pipeline the tiny tokenizer's template (its crop and the image's place in it)."""
    return dict(prompt_template=first_frame.prompt_template(PRESET, pipeline.tokenizer),
                max_sequence_length=i2v_text_tokens(PRESET))


def pipeline_image_latents(pipeline, image, num_frames=5) -> torch.Tensor:
    """HunyuanVideoImageToVideoPipeline's ``image_latents`` for latent_concat: ``video_processor.preprocess``, then
    ``prepare_latents`` (the frame's latents in every latent frame), then zeros after the first, as ``__call__``."""
    width, height = image.size
    pixels = pipeline.video_processor.preprocess(image, height, width)
    _, image_latents = pipeline.prepare_latents(pixels, 1, 16, height, width, num_frames, torch.float32,
                                                torch.device("cpu"), torch.Generator().manual_seed(0))
    image_latents[:, :, 1:] = 0
    return image_latents


def test_the_features_are_the_pipelines_conditions(data, pipe):
    """Each clip's text is HunyuanVideoImageToVideoPipeline.encode_prompt of its caption with its own first frame
    (clips 0 and 2 share a caption, not a frame: their states differ), the empty prompt's is encode_prompt of "" with
    the black frame the pipeline gives a negative prompt, and cond_latents are prepare_latents' image latents
    (latent frame 0) of that frame. Measured: every difference 0 (the pipeline's own methods on the same pixels)."""
    features = FeatureSet(data["features"])
    assert features.text_names == ("prompt_embeds", "prompt_embeds_mask", "pooled_prompt_embeds")
    assert features.metadata["task"] == "i2v" and len(features) == 3
    worst = 0.0
    for i, first in enumerate(data["firsts"]):
        clip = features[i]
        assert (features.clips[i]["height"], features.clips[i]["width"]) == SIZES[i]
        with torch.no_grad():
            embeds, pooled, mask = pipe.encode_prompt(image=first, prompt=CAPTIONS[i], device=torch.device("cpu"),
                                                      **pipeline_text(pipe))
            image_latents = pipeline_image_latents(pipe, first)
        assert clip["prompt_embeds"].shape == (PRESET.text_len, PRESET.text_dim)
        assert torch.equal(clip["prompt_embeds_mask"], mask[0].long())
        assert clip["cond_latents"].shape == (16, 1, SIZES[i][0] // 8, SIZES[i][1] // 8)
        for ours, theirs in ((clip["prompt_embeds"], embeds[0]), (clip["pooled_prompt_embeds"], pooled[0]),
                             (clip["cond_latents"], image_latents[0, :, :1])):
            worst = max(worst, (ours.float() - theirs).abs().max().item())
    assert (features[0]["prompt_embeds"] - features[2]["prompt_embeds"]).abs().max() > 1e-3  # the frame is read
    with torch.no_grad():
        black = Image.new("RGB", data["firsts"][0].size, 0)
        embeds, pooled, mask = pipe.encode_prompt(image=black, prompt="", device=torch.device("cpu"),
                                                  **pipeline_text(pipe))
    negative = features.negative
    assert torch.equal(negative["prompt_embeds_mask"], mask[0].long())
    worst = max(worst, (negative["prompt_embeds"] - embeds[0]).abs().max().item(),
                (negative["pooled_prompt_embeds"] - pooled[0]).abs().max().item())
    print(f"features vs the pipeline's encode_prompt and prepare_latents: {worst:.1e}")
    assert worst <= 1e-6


def test_the_batch_is_the_pipelines_model_input_and_the_loss_eager(data, pipe):
    """build_batch (task i2v) against its draws replayed by hand: hidden_states is the pipeline's
    ``torch.cat([latents, image_latents, mask], dim=1)`` with latents (1 - sigma) x0 + sigma noise and
    image_latents / mask from prepare_latents and ``__call__`` (first latent frame only), the target the velocity of
    the 16 noisy channels, timestep sigma x 1000, no guidance input; the empty prompt's text where a caption dropped.
    Then one full-weight TorchTrainStep's loss against diffusers' eager fp32 forward's MSE on that batch. Measured:
    the input 0 from the pipeline's, the loss equal to eager's in its 7 printed digits."""
    from hyv_lib.runtimes.torch_train import TorchTrainStep

    features = FeatureSet(data["features"])
    g = torch.Generator().manual_seed(3)
    picks = pick_clips(features.shapes(), 2, g)
    state = g.get_state()
    batch = build_batch(features, picks, preset=PRESET, model_config=PRESET.transformer, task="i2v",
                        caption_dropout=0.5, shift=7.0, sampling="logit_normal", generator=g)
    g.set_state(state)
    clips, drop, x0, noise, sigma = replay_draws(features, picks, g, 7.0)
    s = sigma.view(2, 1, 1, 1, 1)
    latents = (1 - s) * x0 + s * noise
    with torch.no_grad():
        image_latents = torch.cat([pipeline_image_latents(pipe, data["firsts"][i]) for i in picks])
    mask = image_latents.new_ones(image_latents.shape[0], 1, *image_latents.shape[2:])
    mask[:, :, 1:] = 0
    latent_model_input = torch.cat([latents, image_latents, mask], dim=1)
    assert x0.shape[2] == 2 and batch["hidden_states"].shape[1] == 33
    difference = (batch["hidden_states"] - latent_model_input).abs().max().item()
    print(f"hidden_states vs the pipeline's latent_model_input: {difference:.1e}")
    assert difference <= 1e-6
    assert torch.equal(batch["target"], noise - x0)
    assert torch.allclose(batch["timestep"], sigma * 1000) and "guidance" not in batch
    for i, c in enumerate(clips):
        source = features.negative if drop[i] else c
        assert torch.equal(batch["encoder_hidden_states"][i], source["prompt_embeds"])
        assert torch.equal(batch["encoder_attention_mask"][i], source["prompt_embeds_mask"])

    model = build_tiny(PRESET, seed=1, names=["transformer"])["transformer"]
    oracle = copy.deepcopy(model).train().requires_grad_(True)
    step = TorchTrainStep(model, trainable="full", learning_rate=1e-3, remat=False)
    loss = step.step(batch)
    inputs = {k: v for k, v in batch.items() if k != "target"}
    expected = (oracle(**inputs).sample - batch["target"]).pow(2).mean().item()
    print(f"loss {loss:.6f} vs eager {expected:.6f}")
    assert loss == pytest.approx(expected, rel=1e-6)


def test_train_then_generate_with_the_lora(data, tmp_path):
    """``train --task i2v`` (a rank-4 LoRA on the attention, MLP and single-stream layers, 2 steps) writes the
    adapter; ``generate --image_path --lora`` runs with it, and its latents move away from the base model's."""
    out = str(tmp_path / "lora")
    assert run(["train", "--features", data["features"], "--preset", PRESET.name, "--task", "i2v", "--lora_rank", "4",
                "--lora_targets", "attn,mlp,single", "--steps", "2", "--batch_size", "2", "--learning_rate", "1e-2",
                "--warmup_steps", "0", "--output_dir", out, "--quiet"]) == 0
    keys = load_file(os.path.join(out, "pytorch_lora_weights.safetensors"))
    assert any(".single_transformer_blocks." in k and "proj_mlp" in k for k in keys)
    log = [json.loads(line) for line in open(os.path.join(out, "train_log.jsonl"))]
    assert len(log) == 2 and all(np.isfinite(r["loss"]) for r in log)

    image = str(data["dir"] / "first.png")
    data["firsts"][0].save(image)
    common = ["--preset", PRESET.name, "--image_path", image, "--prompt", CAPTIONS[0], "--num_inference_steps", "2",
              "--video_length", "5", "--seed", "3", "--quiet"]
    assert run(["generate", *common, "--output_dir", str(tmp_path / "base")]) == 0
    assert run(["generate", *common, "--lora", out, "--output_dir", str(tmp_path / "tuned")]) == 0
    base, tuned = (load_file(str(tmp_path / d / "stage2_latents.safetensors"))["latents"] for d in ("base", "tuned"))
    assert base.shape == (1, 16, 2, 12, 20) and (base - tuned).abs().max() > 1e-4

"""The guides' recipes: LoRA target groups per model family (train --lora_targets), merge_lora's merged model folder,
and extract_features' frame sampling (--fps resampling, --frames random)."""

import argparse
import copy
import hashlib
import json
import os

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from tiny_inputs import forward_kwargs, write_image_clips

from hyv_lib.base.errors import HyvInputError
from hyv_lib.models.families import get_preset
from hyv_lib.cli.commands import run
from hyv_lib.cli.training import add_merge_lora_arguments, merge_lora_command
from hyv_lib.models import lora
from hyv_lib.models.registry import get_adapter
from hyv_lib.pipeline.video_io import write_mp4
from hyv_lib.training.features import INDEX_FILE, extract_features
from hyv_lib.training.frames import FrameSampling, resample_indices, take_frames, window_start
from hyv_lib.training.merge import MERGE_RECORD, write_merged_model

STEPS = ["--num_inference_steps", "3", "--video_length", "5", "--quiet"]
HYV_ATTN = ("attn.to_q", "attn.to_k", "attn.to_v", "attn.to_out.0", "attn.add_q_proj", "attn.add_k_proj",
            "attn.add_v_proj", "attn.to_add_out")
HYV_MLP = ("ff.net.0.proj", "ff.net.2", "ff_context.net.0.proj", "ff_context.net.2")


def meta_model(preset):
    spec = get_preset(preset)
    with torch.device("meta"):
        return get_adapter(spec.model).build(dict(spec.transformer))


def per_block(layers, blocks):
    return {f"transformer_blocks.{b}.{layer}" for b in range(blocks) for layer in layers}


# ------------------------------------------------------------------------------------------------ target groups
def test_target_groups_per_model_family():
    """Hand-listed names on the two tiny presets (2 blocks each): HunyuanVideo-1.5's attn = the 8 projections of both
    streams per block (what the default always was), mlp = ff and ff_context's two layers, all = every nn.Linear,
    inside the blocks and out (embedders, token refiner, timestep embedding, output head; the Conv3d patch embedding
    is not one); CogVideoX's attn = attn1's 4, mlp = ff's 2."""
    hyv = meta_model("tiny")
    blocks = len(hyv.transformer_blocks)
    assert blocks == 2
    assert set(lora.lora_target_names(hyv, "attn")) == per_block(HYV_ATTN, 2)
    assert lora.target_names(hyv) == lora.lora_target_names(hyv, "attn")  # the default is unchanged
    assert set(lora.lora_target_names(hyv, "attn,mlp")) == per_block(HYV_ATTN + HYV_MLP, 2)
    assert set(lora.lora_target_names(hyv, ["mlp"])) == per_block(HYV_MLP, 2)
    every = lora.lora_target_names(hyv, "all")
    linears = [n for n, m in hyv.named_modules() if isinstance(m, torch.nn.Linear)]
    assert every == linears and len(every) == 49
    # text: the caption's path, listed by hand (token refiner: one block of 7 linear layers)
    refiner = [f"context_embedder.token_refiner.refiner_blocks.0.{layer}" for layer in
               ("attn.to_q", "attn.to_k", "attn.to_v", "attn.to_out.0", "ff.net.0.proj", "ff.net.2", "norm_out.linear")]
    outside = {"context_embedder.proj_in", "context_embedder.time_text_embed.text_embedder.linear_1",
               "context_embedder.time_text_embed.text_embedder.linear_2", "context_embedder_2.linear_1",
               "context_embedder_2.linear_2", "context_embedder_2.linear_3", *refiner}
    text_stream = ("norm1_context.linear", "attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj", "attn.to_add_out",
                   "ff_context.net.0.proj", "ff_context.net.2")
    assert set(lora.lora_target_names(hyv, "text")) == outside | per_block(text_stream, 2)
    assert set(lora.lora_target_names(hyv, "attn,text")) == outside | per_block(HYV_ATTN + text_stream, 2)
    for name in ("proj_out", "norm_out.linear", "context_embedder.proj_in", "time_embed.timestep_embedder.linear_1",
                 "image_embedder.linear_1", "context_embedder_2.linear_3", "transformer_blocks.1.norm1_context.linear",
                 "context_embedder.token_refiner.refiner_blocks.0.attn.to_q"):
        assert name in every
    assert "x_embedder.proj" not in every  # a Conv3d

    cog = meta_model("cogvideox_tiny")
    cog_attn = ("attn1.to_q", "attn1.to_k", "attn1.to_v", "attn1.to_out.0")
    assert set(lora.lora_target_names(cog, "attn")) == per_block(cog_attn, 2)
    assert set(lora.lora_target_names(cog, "mlp,attn")) == per_block(cog_attn + ("ff.net.0.proj", "ff.net.2"), 2)
    cog_all = lora.lora_target_names(cog, "all")
    assert len(cog_all) == 22 and "patch_embed.text_proj" in cog_all and "transformer_blocks.0.norm2.linear" in cog_all

    groups = get_adapter("hunyuanvideo-1.5").lora_targets
    assert lora.parse_lora_targets(" mlp, attn ,mlp", groups) == "attn,mlp"  # canonical: adapter order, once each
    for bad, words in (("attn,all", "give it alone"), ("ffn", "one or more of attn, mlp, text, all"),
                       ("", "one or more")):
        with pytest.raises(HyvInputError, match=words) as err:
            lora.parse_lora_targets(bad, groups)
        assert err.value.argument == "lora_targets"


def test_add_lora_adapts_exactly_the_group():
    """peft wraps exactly the group's layers (no suffix-matched extras) on both families, and the output is unchanged
    at init (B = 0)."""
    from hyv_lib.models.components import build_tiny_components

    model = build_tiny_components(get_preset("tiny"), names=["transformer"])["transformer"]
    adapted = copy.deepcopy(model)
    names = lora.add_lora(adapted, 4, targets="attn,mlp")
    wrapped = {n for n, m in adapted.named_modules() if hasattr(m, "lora_A")}
    assert wrapped == set(names) == per_block(HYV_ATTN + HYV_MLP, 2)
    kwargs = forward_kwargs()
    with torch.no_grad():
        assert torch.equal(adapted(**kwargs).sample, model(**kwargs).sample)
    cog = meta_model("cogvideox_tiny").to_empty(device="cpu")
    assert len(lora.add_lora(cog, 2, targets="all")) == 22
    with pytest.raises(HyvInputError, match="not both"):
        lora.add_lora(copy.deepcopy(model), 4, target_modules=["to_q"], targets="attn")


# ------------------------------------------------------------------------------------------------ train, generate, merge
@pytest.fixture(scope="module")
def features_dir(tmp_path_factory):
    """Two one-frame clips (PNG images) of one shape, i2v features of the tiny preset."""
    folder = tmp_path_factory.mktemp("recipe_data")
    data_json = write_image_clips(folder, ["a red circle", "a blue square"])
    assert extract_features(data_json, preset="tiny", output_dir=str(folder / "features"),
                            task="i2v", progress=False).ok
    return str(folder / "features")


@pytest.fixture(scope="module")
def all_lora(features_dir, tmp_path_factory):
    """``train --lora_targets all``: 3 steps at a high learning rate (the LoRA must move the output), into a folder."""
    out = tmp_path_factory.mktemp("train_all") / "run"
    argv = ["train", "--features", features_dir, "--preset", "tiny", "--lora_rank", "4", "--lora_targets", "all",
            "--steps", "3", "--learning_rate", "1e-2", "--warmup_steps", "0", "--task", "i2v", "--output_dir",
            str(out), "--quiet"]
    assert run(argv) == 0
    return out, argv


def test_train_all_targets_writes_every_linear_and_resumes(all_lora, features_dir, tmp_path, capsys):
    from hyv_lib.training.loop import train

    out, argv = all_lora
    weights = lora.read_lora(str(out))
    every = lora.lora_target_names(meta_model("tiny"), "all")
    assert sorted(weights.layers) == sorted(every)
    assert weights.metadata["targets"] == "all" and weights.metadata["rank"] == 4
    # trained outside the blocks too: the output head, the token refiner's input, the timestep embedding moved
    for name in ("proj_out", "context_embedder.proj_in", "time_embed.timestep_embedder.linear_2"):
        assert weights.layers[name].up.abs().max() > 1e-3, name
    # the same command again: the finished run is kept (resumed at step 3); other targets in its folder: refused
    again = train(features_dir, preset="tiny", lora_rank=4, lora_targets="all", steps=3, learning_rate=1e-2,
                  warmup_steps=0, task="i2v", output_dir=str(out), progress=False)
    assert again.resumed_from == 3
    with pytest.raises(HyvInputError, match="lora_targets 'all' there, 'attn' now") as err:
        train(features_dir, preset="tiny", lora_rank=4, steps=3, learning_rate=1e-2, warmup_steps=0, task="i2v",
              output_dir=str(out), progress=False)
    assert err.value.argument == "output_dir"
    # the guide's rank-64 I2V LoRA on attention and MLP is one command
    assert run(["train", "--features", features_dir, "--preset", "tiny", "--lora_rank", "64", "--lora_targets",
                "attn,mlp", "--task", "i2v", "--steps", "1", "--output_dir", str(tmp_path / "r64"), "--quiet"]) == 0
    r64 = lora.read_lora(str(tmp_path / "r64"))
    assert r64.rank == 64 and r64.metadata["targets"] == "attn,mlp" and set(r64.layers) == per_block(
        HYV_ATTN + HYV_MLP, 2)
    for extra, message in ((["--full", "--lora_targets", "attn"], "--lora_targets: chooses a LoRA"),
                           (["--lora_rank", "4", "--lora_targets", "ffn"], "--lora_targets: must be one or more")):
        code = run(["train", "--features", features_dir, "--preset", "tiny", "--steps", "1", "--output_dir",
                    str(tmp_path / "bad"), "--quiet", *extra])
        assert code == 2 and message in capsys.readouterr().err


@pytest.fixture(scope="module")
def generated(all_lora, tmp_path_factory):
    """generate --preset tiny with the all-targets LoRA and without it: their stage-2 latents."""
    out, _ = all_lora
    root = tmp_path_factory.mktemp("gen")
    latents = {}
    for name, flags in (("lora", ["--lora", str(out)]), ("plain", [])):
        assert run(["generate", "--preset", "tiny", "--prompt", "a red circle", "--output_dir", str(root / name),
                    *flags, *STEPS]) == 0
        latents[name] = load_file(str(root / name / "stage2_latents.safetensors"))["latents"]
    return latents


def test_generate_merges_an_all_targets_lora(generated):
    change = (generated["lora"] - generated["plain"]).abs().max().item()
    print(f"max |latents with the LoRA - without| = {change:.3f}")
    assert change > 0.05


def test_merge_lora_folder_reproduces_generate_lora(all_lora, generated, tiny_folder, tmp_path, capsys):
    """merge_lora into the tiny preset's built weights: a whole model folder that generate --model_path runs to the
    latents generate --lora gave (same seed); from a model folder, the other components' weights are hardlinks and
    the merged transformer is the same; refusals come before anything is written."""
    out, _ = all_lora
    merged_dir = tmp_path / "merged"
    parser = argparse.ArgumentParser()
    add_merge_lora_arguments(parser)
    if True:
        assert merge_lora_command(parser.parse_args(["--lora", str(out), "--preset", "tiny", "--output_dir",
                                                     str(merged_dir)])) == 0
    assert "merge_lora:" in capsys.readouterr().err
    assert {"model_index.json", "transformer", "vae", "text_encoder", MERGE_RECORD} <= set(os.listdir(merged_dir))
    record = json.loads((merged_dir / MERGE_RECORD).read_text())
    assert (record["targets"], record["lora_scale"], record["lora_rank"], record["model"]) == ("all", 1.0, 4, "built")
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".merged")]  # the temporary folder was renamed
    assert run(["generate", "--model_path", str(merged_dir), "--prompt", "a red circle", "--output_dir",
                str(tmp_path / "gen"), *STEPS]) == 0
    latents = load_file(str(tmp_path / "gen" / "stage2_latents.safetensors"))["latents"]
    diff = (latents - generated["lora"]).abs().max().item()
    print(f"merged folder vs generate --lora: max |latents difference| = {diff:.2e}")
    assert diff <= 1e-5

    from_folder = write_merged_model(str(out), str(tmp_path / "from_folder"), model_path=str(tiny_folder))
    assert from_folder.preset == "tiny" and from_folder.linked > 0
    for component in ("vae", "text_encoder"):
        name = next(f for f in os.listdir(tiny_folder / component) if f.endswith(".safetensors"))
        assert os.path.samefile(tiny_folder / component / name, tmp_path / "from_folder" / component / name)
    a = load_file(str(merged_dir / "transformer" / "diffusion_pytorch_model.safetensors"))
    b = load_file(str(tmp_path / "from_folder" / "transformer" / "diffusion_pytorch_model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)

    refusals = [(dict(output_dir=str(merged_dir), preset="tiny"), "output_dir", "is not empty"),
                (dict(output_dir=str(tmp_path / "cog"), preset="cogvideox_tiny"), "lora", "trained for"),
                (dict(output_dir=str(tmp_path / "scale"), preset="tiny", lora_scale=float("nan")), "lora_scale",
                 "finite"),
                (dict(output_dir=str(tmp_path / "hub"), model_path="someone/some-model", preset="tiny"),
                 "model_path", "not a local folder")]
    for kwargs, argument, words in refusals:
        with pytest.raises(HyvInputError, match=words) as err:
            write_merged_model(str(out), **kwargs)
        assert err.value.argument == argument
    assert sorted(os.listdir(tmp_path)) == ["from_folder", "gen", "merged"]


# ------------------------------------------------------------------------------------------------ frame sampling
BITS = 6


def index_clip(count, height=64, width=112):
    """uint8 frames [count, H, W, 3] whose frame i shows i in binary: bar b (16 pixels wide) white when bit b is set."""
    frames = np.zeros((count, height, width, 3), np.uint8)
    for i in range(count):
        for b in range(BITS):
            if i >> b & 1:
                frames[i, :, b * 16:(b + 1) * 16] = 255
    return frames


def frame_indices(frames):
    """The index each frame of :func:`index_clip` shows (read in each bar's middle, robust to H.264's losses)."""
    return [sum(int(f[:, b * 16 + 4:b * 16 + 12].mean() > 128) << b for b in range(BITS)) for f in frames]


def test_resampling_is_the_frame_on_screen():
    """Hand-worked: 48 -> 24 fps takes every second frame; 30 -> 24 the frame shown at k/24 s (frame floor(1.25 k));
    12 -> 24 each frame twice; 23.97 -> 24 none (within 0.1 fps)."""
    assert resample_indices(10, 48, 24) == [0, 2, 4, 6, 8]
    assert resample_indices(10, 30, 24) == [0, 1, 2, 3, 5, 6, 7, 8]
    assert resample_indices(3, 12, 24) == [0, 0, 1, 1, 2, 2]
    assert resample_indices(4, 23.97, 24) == [0, 1, 2, 3] == resample_indices(4, 30, None)
    expected = int.from_bytes(hashlib.sha256(b"7:abc").digest()[:8], "big") % 12
    assert window_start(20, 9, "random", 7, "abc") == expected and window_start(20, 9, "first", 7, "abc") == 0


def test_fps_and_random_window_in_extract_features(tmp_path, capsys):
    """A 40-frame 48 fps clip whose frames show their index: --fps 24 takes frames 0, 2, ..., 16 (decoded back);
    --frames random a window of the 20 resampled frames picked by the seed and the clip's id, recorded, the same
    again in another folder; the default still takes frames 0-8."""
    path = tmp_path / "clip48.mp4"
    write_mp4(index_clip(40), str(path), fps=48)
    assert frame_indices(take_frames(str(path), FrameSampling(9)).frames) == list(range(9))
    taken = take_frames(str(path), FrameSampling(9, fps=24))
    assert frame_indices(taken.frames) == list(range(0, 18, 2)) and taken.fps == 48
    (tmp_path / "data.json").write_text(json.dumps([{"path": "clip48.mp4", "cap": "bars"}]))

    def extract(name, *flags):
        assert run(["extract_features", "--data_json", str(tmp_path / "data.json"), "--preset", "tiny", "--task",
                    "t2v", "--num_frames", "9", "--output_dir", str(tmp_path / name), "--quiet", *flags]) == 0
        index = json.loads((tmp_path / name / INDEX_FILE).read_text())
        return index["metadata"], index["clips"][0]

    meta, clip = extract("resampled", "--fps", "24")
    assert (meta["fps"], meta["frames"], clip["source_frames"], clip["frame_start"]) == (24.0, "first", [0, 16], 0)
    meta, clip = extract("random", "--fps", "24", "--frames", "random", "--frame_seed", "5")
    start = int.from_bytes(hashlib.sha256(f"5:{clip['id']}".encode()).digest()[:8], "big") % (20 - 9 + 1)
    print(f"--frames random, seed 5: window start {start} of 0..11")
    assert (meta["frames"], meta["frame_seed"], clip["frame_start"]) == ("random", 5, start)
    assert clip["source_frames"] == [2 * start, 2 * (start + 8)]
    window = take_frames(str(path), FrameSampling(9, fps=24, window="random", seed=5), clip_id=clip["id"])
    assert frame_indices(window.frames) == list(range(2 * start, 2 * start + 18, 2))
    _, same = extract("random_again", "--fps", "24", "--frames", "random", "--frame_seed", "5")
    assert same["frame_start"] == start
    a = load_file(str(tmp_path / "random" / "features-00000.safetensors"))
    b = load_file(str(tmp_path / "random_again" / "features-00000.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert len({window_start(20, 9, "random", seed, clip["id"]) for seed in range(10)}) > 1  # the seed moves it
    meta, clip = extract("default")
    assert (meta["fps"], meta["frames"], clip["source_frames"]) == (None, "first", [0, 8])
    code = run(["extract_features", "--data_json", str(tmp_path / "data.json"), "--preset", "tiny", "--output_dir",
                str(tmp_path / "resampled"), "--quiet", "--num_frames", "9"])  # that folder was made with --fps 24
    assert code == 2 and "other settings" in capsys.readouterr().err
    for flags, words in ((["--frames", "middle"], "--frames: must be one of first, random"),
                         (["--fps", "0"], "--fps: must be > 0"), (["--frame_seed", "-1"], "--frame_seed")):
        assert run(["extract_features", "--data_json", str(tmp_path / "data.json"), "--preset", "tiny",
                    "--output_dir", str(tmp_path / "bad"), "--quiet", *flags]) == 2
        assert words in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()

"""Presets: the real configs, the tiny one, buckets and the info command."""

import json

import pytest

from hyv_lib import HyvInputError
from hyv_lib.base.presets import bucket_size
from hyv_lib.models.families import PRESETS, get_preset

INFO_KEYS = {"text_len", "text_dim", "byt5_len", "byt5_dim", "latent_channels", "spatial_compression",
             "temporal_compression", "default_height", "default_width", "default_video_length", "default_steps",
             "flow_shift", "guidance_scale", "transformer"}


def test_info_json_cli_has_required_keys(capsys):
    from hyv_lib.cli.commands import run

    assert run(["info", "--preset", "720p_t2v", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert INFO_KEYS <= set(data)
    assert data["default_height"] == 720 and data["default_width"] == 1280
    assert data["transformer"]["num_layers"] == 54


@pytest.mark.parametrize("name,shift,size", [("480p_t2v", 5.0, (480, 848)), ("720p_t2v", 9.0, (720, 1280))])
def test_real_presets_match_the_published_configs(name, shift, size):
    p = get_preset(name)
    t = p.transformer
    assert (t["num_layers"], t["num_attention_heads"], t["attention_head_dim"]) == (54, 16, 128)
    assert t["num_attention_heads"] * t["attention_head_dim"] == 2048
    assert (p.text_len, p.text_dim, p.byt5_len, p.byt5_dim) == (1000, 3584, 256, 1472)
    assert (p.latent_channels, p.spatial_compression, p.temporal_compression) == (32, 16, 4)
    assert p.vae["scaling_factor"] == pytest.approx(1.03682)
    assert (p.flow_shift, p.guidance_scale, p.default_video_length, p.fps) == (shift, 6.0, 121, 24)
    assert (p.default_height, p.default_width) == size
    assert t["in_channels"] == 2 * p.latent_channels + 1


def test_real_transformer_config_has_8_3b_parameters():
    """Instantiating the real config on the meta device gives the published parameter count."""
    import torch
    from diffusers import HunyuanVideo15Transformer3DModel

    with torch.device("meta"):
        model = HunyuanVideo15Transformer3DModel(**get_preset("720p_t2v").transformer)
    assert sum(p.numel() for p in model.parameters()) == 8_326_608_160


def test_720p_121_frame_latent_shape():
    assert get_preset("720p_t2v").latent_shape(720, 1280, 121) == (1, 32, 31, 45, 80)


def test_buckets_follow_diffusers():
    p = get_preset("720p_t2v")
    assert bucket_size(p, "1:1") == (960, 960)
    assert bucket_size(p, "4:3") == (832, 1104)
    assert bucket_size(p, "9:16") == (1264, 720)  # diffusers' one-sided match; the official repo gives 1280x720
    assert bucket_size(get_preset("480p_t2v"), "9:16") == (848, 480)


@pytest.mark.parametrize("target_size, stride", [(720, 16), (480, 16), (64, 16), (32, 8)])
def test_bucket_rule_picks_what_diffusers_picks(target_size, stride):
    """hyv_lib's bucket list and nearest-ratio pick (written without a model's processor, so every family shares it)
    against diffusers' HunyuanVideo15ImageProcessor.calculate_default_height_width, over every ratio of sides up to
    24 and some photo sizes (ties included: 1:1, 2:1, 4:1)."""
    from diffusers.pipelines.hunyuan_video1_5.image_processor import HunyuanVideo15ImageProcessor

    from hyv_lib.base.sizes import bucket_for

    processor = HunyuanVideo15ImageProcessor(vae_scale_factor=stride)
    sides = [(w, h) for w in range(1, 25) for h in range(1, 25) if max(w, h) <= 4 * min(w, h)]
    sides += [(4032, 3024), (3024, 4032), (1920, 1080), (1080, 1920), (2000, 500), (777, 1333)]
    for w, h in sides:
        expected = tuple(int(x) for x in processor.calculate_default_height_width(h, w, target_size))
        assert bucket_for(target_size, stride, w, h) == expected, (w, h)


@pytest.mark.parametrize("bad", ["16x9", "0:9", "-1:2", "a:b", "9:1"])
def test_bad_aspect_ratio(bad):
    with pytest.raises(HyvInputError) as err:
        bucket_size(get_preset("tiny"), bad)
    assert err.value.argument == "aspect_ratio"


def test_unknown_preset_lists_valid_names():
    with pytest.raises(HyvInputError) as err:
        get_preset("1080p")
    assert err.value.argument == "preset" and all(n in err.value.message for n in PRESETS)


def test_tiny_stage1_shapes_follow_the_real_layout():
    tiny, real = get_preset("tiny"), get_preset("720p_t2v")
    assert set(tiny.stage1_shapes()) == set(real.stage1_shapes())
    assert real.stage1_shapes()["prompt_embeds"] == (1, 1000, 3584)
    assert all(len(tiny.stage1_shapes()[k]) == len(v) for k, v in real.stage1_shapes().items())


def test_first_blocks_copy_keeps_the_first_blocks_in_fp32_and_leaves_the_model_alone():
    """A bf16 model cut to 1 of its blocks: fp32, the first block's weights, the original untouched; cut to all
    blocks it computes what the fp32 model computes."""
    import torch

    from hyv_lib.models.families import get_preset
    from hyv_lib.models.components import build_tiny_components, first_blocks_copy
    from hyv_lib.models.hunyuan_video15.components import example_forward_kwargs

    tiny = get_preset("tiny")
    model = build_tiny_components(tiny, names=["transformer"])["transformer"]
    blocks = len(model.transformer_blocks)
    assert blocks >= 2
    half = model.to(torch.bfloat16)
    cut = first_blocks_copy(half, 1)
    assert len(cut.transformer_blocks) == 1 and len(half.transformer_blocks) == blocks
    assert all(p.dtype == torch.float32 for p in cut.parameters())
    assert all(p.dtype == torch.bfloat16 for p in half.parameters())
    first = dict(half.transformer_blocks[0].named_parameters())
    for name, p in cut.transformer_blocks[0].named_parameters():
        assert torch.equal(p, first[name].float()) and p.data_ptr() != first[name].data_ptr()
    whole = first_blocks_copy(half)
    kwargs = example_forward_kwargs(tiny)
    with torch.no_grad():
        assert torch.equal(whole(**kwargs).sample, half.float()(**kwargs).sample)


#: The official README's "Optimal Inference Configurations" table, hand-copied (an independent source): CFG-distilled
#: checkpoints run CFG 1 at their base model's flow shift and "must use 50 steps".
CFG_DISTILLED = {"480p_t2v_distilled": ("480p_t2v", "t2v", 5.0, 640),
                 "480p_i2v_distilled": ("480p_i2v", "i2v", 5.0, 640),
                 "720p_i2v_distilled": ("720p_i2v", "i2v", 7.0, 960)}


@pytest.mark.parametrize("name", sorted(CFG_DISTILLED))
def test_cfg_distilled_presets_run_one_sample_per_step_on_their_base_architecture(name):
    base, task, shift, target = CFG_DISTILLED[name]
    p, b = get_preset(name), get_preset(base)
    assert (p.guidance_scale, p.flow_shift, p.default_steps, p.target_size) == (1.0, shift, 50, target)
    assert p.tasks == (task,) and p.transformer["task_type"] == task
    assert p.samples_per_step == 1 and b.samples_per_step == 2 and not p.use_meanflow
    assert p.transformer == b.transformer  # the same 8.3B DiT, weights distilled to run without the negative pass
    assert (p.default_height, p.default_width) == (b.default_height, b.default_width)
    assert p.hub_id == f"hunyuanvideo-community/HunyuanVideo-1.5-Diffusers-{name}"


def test_info_prints_a_cfg_distilled_preset(capsys):
    from hyv_lib.cli.commands import run

    assert run(["info", "--preset", "480p_t2v_distilled", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert (data["guidance_scale"], data["samples_per_step"], data["default_steps"]) == (1.0, 1, 50)
    assert (data["default_height"], data["default_width"]) == (480, 848)


def test_a_data_axis_is_refused_as_of_no_use_with_cfg_off():
    """With guidance 1 each step runs one sample: data=2 has nothing to split. The stage-2 settings say so (naming
    --mesh and where the devices should go), for a distilled preset's own guidance and for --guidance_scale 1."""
    from hyv_lib.base.presets import check_data_axis
    from hyv_lib.pipeline.settings import resolve_settings

    for preset, kwargs in (("480p_t2v_distilled", {}), ("720p_i2v_distilled", {}), ("720p_t2v", {"guidance_scale": 1})):
        with pytest.raises(HyvInputError) as err:
            resolve_settings(get_preset(preset), runtime="jax", mesh="data=2,tensor=4", **kwargs)
        assert err.value.argument == "mesh" and "of no use with CFG off" in err.value.message, preset
        assert "(tensor=8)" in err.value.message
    with pytest.raises(HyvInputError, match=r"of no use.*\(tensor=2,sequence=4\)"):
        check_data_axis({"data": 2, "tensor": 1, "sequence": 4}, 1)
    with pytest.raises(HyvInputError, match="does not divide the batch of 2"):
        check_data_axis({"data": 4, "tensor": 2}, 2)
    check_data_axis({"data": 2, "tensor": 4}, 2)  # the CFG pair: one sample per data shard
    check_data_axis({"tensor": 8}, 1)


def test_info_names_every_preset_with_its_model(capsys):
    """``python -m hyv_lib info`` ends with every preset and the model that runs it (both CogVideoX presets too)."""
    from hyv_lib.cli.commands import run

    assert run(["info"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("presets: ")
    for name in ("tiny_trained", "720p_t2v", "cogvideox1.5_5b", "cogvideox_tiny"):
        assert name in last
    assert "cogvideox_tiny [cogvideox]" in last and "720p_t2v [hunyuanvideo-1.5]" in last

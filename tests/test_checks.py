"""The one number validator (hyv_lib.base.checks.as_number), by hand-worked cases, and the entry points that use it:
numpy and torch scalars are taken the same way everywhere."""

import numpy as np
import pytest
import torch

from hyv_lib.base.checks import as_number
from hyv_lib.base.errors import HyvInputError


@pytest.mark.parametrize("value, kind, expected", [
    (3, int, 3), (np.int64(3), int, 3), (torch.tensor(3), int, 3), (np.array(3), int, 3),
    (2, float, 2.0), (np.float32(0.5), float, 0.5), (torch.tensor(0.25), float, 0.25), (None, int, None),
])
def test_numbers_of_every_library_come_out_as_python_numbers(value, kind, expected):
    out = as_number("x", value, kind)
    assert out == expected and type(out) is type(expected)


@pytest.mark.parametrize("value, kind, words", [
    (True, int, "an integer"), ("720", int, "an integer"), (33.0, int, "an integer"), (np.float64(3), int, "integer"),
    (torch.tensor([1, 2]), int, "an integer"), (float("nan"), float, "finite"), (float("inf"), float, "finite"),
    ("24", float, "a finite number"), (False, float, "a finite number"),
])
def test_what_is_not_such_a_number_is_named(value, kind, words):
    with pytest.raises(HyvInputError) as err:
        as_number("x", value, kind)
    assert err.value.argument == "x" and words in str(err.value)


def test_ranges_are_checked_on_the_converted_value():
    assert as_number("x", np.float32(0.5), low=0, high=1) == 0.5
    assert as_number("x", 0, low=0) == 0.0
    for value, bounds, text in ((0, dict(low=0, low_open=True), "> 0"), (1.0, dict(low=0, high=1), ">= 0 and < 1"),
                                (-1, dict(low=0), ">= 0")):
        with pytest.raises(HyvInputError, match=text):
            as_number("x", value, **bounds)


def test_video_save_and_write_mp4_take_numpy_and_torch_fps(tmp_path):
    """Video.save(fps=np.int64(8)) was refused while stage3(fps=np.float32(12)) passed its check and failed inside
    imageio: both take any number now, and both refuse a string with one error naming fps."""
    from hyv_lib.pipeline.inference import Video
    from hyv_lib.pipeline.video_io import read_mp4, write_mp4

    frames = np.zeros((5, 32, 48, 3), np.uint8)
    video = Video(frames=frames, latents=torch.zeros(1), config={"fps": 8})
    assert read_mp4(video.save(str(tmp_path / "a.mp4"), fps=np.int64(8)))[0].shape == (5, 32, 48, 3)
    write_mp4(frames, str(tmp_path / "b.mp4"), torch.tensor(12.0))
    assert read_mp4(str(tmp_path / "b.mp4"))[1]["fps"] == pytest.approx(12.0)
    for call in (lambda: video.save(str(tmp_path / "c.mp4"), fps="8"),
                 lambda: write_mp4(frames, str(tmp_path / "d.mp4"), np.float32(0))):
        with pytest.raises(HyvInputError) as err:
            call()
        assert err.value.argument == "fps"
    assert not (tmp_path / "c.mp4").exists() and not (tmp_path / "d.mp4").exists()


def test_stage_settings_take_torch_scalars():
    from hyv_lib.models.families import get_preset
    from hyv_lib.pipeline.settings import resolve_settings

    settings = resolve_settings(get_preset("tiny"), seed=torch.tensor(7), guidance_scale=np.float32(4.5),
                                num_inference_steps=np.int32(3))
    assert (settings.seed, settings.guidance_scale, settings.num_inference_steps) == (7, 4.5, 3)
    assert type(settings.seed) is int and type(settings.guidance_scale) is float


def test_a_custom_preset_runs_through_all_three_stages(tmp_path):
    """A Preset object is taken wherever a preset name is: stage 1 records a custom one whole (stage 2 used to
    refuse the folder, knowing only names), and stages 2 and 3 run with it."""
    import dataclasses
    import json

    from hyv_lib.models.families import get_preset
    from hyv_lib.pipeline.stages import stage1, stage2, stage3

    custom = dataclasses.replace(get_preset("tiny"), name="my_tiny", default_steps=2, default_video_length=5, fps=6)
    stage1(preset=custom, prompt="a cat", output_dir=str(tmp_path))
    latents = stage2(str(tmp_path), quiet=True)
    frames = stage3(str(tmp_path))
    config = json.loads((tmp_path / "generation_config.json").read_text())
    assert config["preset"] == "my_tiny" and config["num_inference_steps"] == 2 and config["fps"] == 6
    assert latents.shape[2] == 2 and frames.shape[0] == 5
    stage1(preset="tiny", prompt="a cat", output_dir=str(tmp_path / "named"))
    assert "preset_fields" not in json.loads((tmp_path / "named" / "generation_config.json").read_text())


def test_make_mesh_takes_the_mesh_string_of_every_other_entry_point():
    """make_mesh("data=2,tensor=4") was a TypeError while --mesh, load_pipeline(mesh=...) and the planner take it."""
    jax = pytest.importorskip("jax")
    from hyv_lib.parallel.mesh import make_mesh

    devices = jax.devices()[:1] * 8  # the shape is what is checked; 8 entries stand in for 8 chips
    for text, axes in (("data=2,tensor=4", dict(data=2, tensor=4)), ("tensor=8", dict(tensor=8)),
                       ("sequence=2,tensor=4", dict(sequence=2, tensor=4))):
        assert dict(make_mesh(text, devices=devices).shape) == dict(make_mesh(**axes, devices=devices).shape)
    for bad, argument in (("tensor=3,data=x", "mesh"),):
        with pytest.raises(HyvInputError) as err:
            make_mesh(bad, devices=devices)
        assert err.value.argument == argument
    with pytest.raises(HyvInputError, match="not both"):
        make_mesh("tensor=8", tensor=8, devices=devices)


def test_settings_resolve_to_a_frozen_typed_object_whose_config_is_the_stage2_file_format():
    """resolve_settings returns ResolvedSettings (frozen), not a dict; its config() is what stage 2 records: the cache
    method's own fields only when the cache is on, as the staged scripts' generation_config.json has them."""
    import dataclasses

    from hyv_lib.models.families import get_preset
    from hyv_lib.pipeline.settings import ResolvedSettings, resolve_settings

    tiny = get_preset("tiny")
    plain = resolve_settings(tiny)
    assert isinstance(plain, ResolvedSettings) and (plain.height, plain.width) == (96, 160)  # the 16:9 bucket
    with pytest.raises(dataclasses.FrozenInstanceError):
        plain.seed = 1
    assert list(plain.config()) == ["aspect_ratio", "height", "width", "video_length", "num_inference_steps",
                                    "guidance_scale", "flow_shift", "seed", "warmup_steps", "runtime", "attention",
                                    "mesh", "sharding", "enable_cache"]
    assert plain.config()["sharding"] is None and plain.cache_method is None
    deep = resolve_settings(tiny, enable_cache=True, cache_start_step=1, cache_end_step=6)
    assert {k: v for k, v in deep.config().items() if k.startswith("cache_") or k == "no_cache_blocks"} == dict(
        cache_method="deepcache", cache_start_step=1, cache_end_step=6, cache_step_interval=4, no_cache_blocks=1)
    mag = resolve_settings(tiny, enable_cache=True, cache_method="magcache", cache_max_skip=np.int64(2))
    assert {k: v for k, v in mag.config().items() if k.startswith("cache_")} == dict(
        cache_method="magcache", cache_threshold=0.1, cache_max_skip=2, cache_retention=0.2, cache_calibration=None)
    with pytest.raises(HyvInputError) as err:
        resolve_settings(tiny, enable_cache=True, cache_method="magcache", cache_retention=1.0)
    assert err.value.argument == "cache_retention"

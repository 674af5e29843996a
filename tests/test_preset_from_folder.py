"""The folder says which model it is: a model folder's configs choose the preset, a contradicting --preset is refused
before any work, and the official scripts' checkpoint flags (--resolution, --task, ...) choose one too (issue 45)."""

import json
import os

import pytest

from hyv_lib.base.errors import HyvInputError
from hyv_lib.models.families import PRESETS
from hyv_lib.cli.commands import run
from hyv_lib.models.components import save_tiny_pipeline
from hyv_lib.models.folder import LAYOUT_NOTE, choose_preset, detect_preset, differences, folder_configs

REAL = [name for name, p in PRESETS.items() if not p.is_tiny]
# the checkpoints whose diffusers configs equal another's: the SSTA-trained one and its dense twin
TWINS = {"720p_i2v_distilled_sparse": "720p_i2v_distilled", "cogvideox1.5_5b": "cogvideox_tiny",
         "hunyuanvideo_t2v": "hunyuanvideo_tiny", "hunyuanvideo_i2v": "hunyuanvideo_i2v_tiny"}


@pytest.fixture(scope="module")
def real_folders(tmp_path_factory):
    """save_tiny's folder of every real preset (tiny widths, the real layout), each under the name a hub download
    has (``HunyuanVideo-1.5-Diffusers-<version>``, ``CogVideoX1.5-5B``) and under a neutral one with the layout note
    removed (what configs alone say)."""
    root = tmp_path_factory.mktemp("real_layouts")
    out = {}
    for name in REAL:
        hub = str(root / PRESETS[name].hub_id.rsplit("/", 1)[-1])
        save_tiny_pipeline(hub, preset=name)
        plain = str(root / f"model_{len(out)}")
        os.symlink(hub, plain)
        out[name] = hub, plain
    return out


def _without_note(folder, tmp_path):
    """A copy of the folder's configs (what detection reads) with model_index.json's layout note removed."""
    dest = tmp_path / "bare"
    for key, data in folder_configs(folder).items():
        rel = {"model_index": "model_index.json", "transformer": "transformer/config.json",
               "scheduler": "scheduler/scheduler_config.json", "guider": "guider/guider_config.json",
               "vae": "vae/config.json"}[key]
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        (dest / rel).write_text(json.dumps({k: v for k, v in data.items() if k != LAYOUT_NOTE}))
    return str(dest)


@pytest.mark.parametrize("name", REAL)
def test_every_real_layout_folder_is_detected(real_folders, name, tmp_path):
    hub, plain = real_folders[name]
    assert detect_preset(plain)[0].name == name  # save_tiny's note settles the twins
    assert detect_preset(hub)[0].name == name  # so does the hub name alone
    bare = _without_note(plain, tmp_path)  # configs only: the twins go to the dense / exact-width one
    assert detect_preset(bare)[0].name == TWINS.get(name, name)


@pytest.mark.parametrize("name", REAL)
def test_a_wrong_preset_names_the_differing_fields(real_folders, name):
    plain = real_folders[name][1]
    configs = folder_configs(plain)
    for other in REAL:
        diffs = differences(PRESETS[other], configs)
        if other == name or other == TWINS.get(name) or name == TWINS.get(other):  # twins fit each other's folder
            assert diffs == []
            continue
        assert diffs, (name, other)
        with pytest.raises(HyvInputError) as err:
            choose_preset(other, plain)
        assert err.value.argument == "preset" and diffs[0] in err.value.message


def test_the_differences_are_the_configs_own_values(real_folders):
    """Hand-checked: 480p_t2v on a 720p_t2v folder differs in target size (640 vs 960) and shift (5 vs 9) only;
    the CFG-distilled 480p preset on the base 480p folder in the guider's scale; CogVideoX on HunyuanVideo: the
    class."""
    assert differences(PRESETS["480p_t2v"], folder_configs(real_folders["720p_t2v"][1])) == [
        "transformer target_size: 640 vs the folder's 960", "flow shift: 5 vs the folder's scheduler 9"]
    assert differences(PRESETS["480p_t2v_distilled"], folder_configs(real_folders["480p_t2v"][1])) == [
        "guidance scale: 1 vs the folder's guider 6"]
    only = differences(PRESETS["cogvideox1.5_5b"], folder_configs(real_folders["720p_t2v"][1]))
    assert len(only) == 1 and "HunyuanVideo15Transformer3DModel" in only[0]


def test_the_bundled_folder_and_a_hub_id(tmp_path):
    bundled = PRESETS["tiny_trained"].bundled_path
    assert detect_preset(bundled)[0].name == "tiny_trained"
    assert choose_preset(None, PRESETS["720p_t2v"].hub_id).preset.name == "720p_t2v"
    assert choose_preset(None, None).preset.name == "tiny_trained"  # no folder: the bundled default stays
    with pytest.raises(HyvInputError, match="^preset: is required"):
        choose_preset(None, "someone/some-model")
    (tmp_path / "empty").mkdir()
    with pytest.raises(HyvInputError, match="transformer/config.json"):
        detect_preset(str(tmp_path / "empty"))


def test_generate_without_preset_runs_as_the_folder(real_folders, tmp_path, capsys):
    """The issue's case: a 720p_t2v-layout folder without --preset used to run as tiny_trained (24 tokens, shift 3,
    guidance 4.5, fp32, 8 fps). Now its own settings: shift 9, guidance 6, bf16, 24 fps, 1000-token prompt."""
    out = tmp_path / "run"
    code = run(["generate", "--model_path", real_folders["720p_t2v"][1], "--prompt", "a cat", "--output_dir", str(out),
                "--num_inference_steps", "1", "--video_length", "1", "--height", "32", "--width", "32"])
    assert code == 0, capsys.readouterr().err
    config = json.loads((out / "generation_config.json").read_text())
    assert config["preset"] == "720p_t2v" and config["preset_source"] == "--model_path"
    assert (config["flow_shift"], config["guidance_scale"], config["dtype"], config["fps"]) == (9.0, 6.0, "bf16", 24)
    assert "preset: 720p_t2v, read from --model_path" in capsys.readouterr().err


def test_a_contradicting_preset_is_refused_before_any_work(real_folders, tmp_path, capsys):
    out = tmp_path / "never"
    code = run(["generate", "--preset", "480p_t2v", "--model_path", real_folders["720p_t2v"][1], "--prompt", "a cat",
                "--output_dir", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and not out.exists()
    assert err.strip().splitlines() == [err.strip()]  # one line, no loading report
    assert err.startswith("error: --preset: 480p_t2v does not fit") and "target_size: 640" in err
    code = run(["stage1", "--preset", "cogvideox1.5_5b", "--model_path", real_folders["720p_t2v"][1],
                "--output_dir", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and not out.exists() and "newly initialized" not in err and "transformer class" in err


def test_an_unwritable_output_video_is_refused_before_stage1(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    out = tmp_path / "run"
    code = run(["generate", "--prompt", "a cat", "--output_dir", str(out),
                "--output_video", str(blocker / "sub" / "v.mp4")])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: --output_video:") and not (out / "stage1_embeddings.safetensors").exists()


def test_official_checkpoint_flags_choose_a_preset(real_folders, tmp_path, capsys):
    """The official generate.py's naming: {resolution}_{task}[_distilled|_step_distilled|_distilled_sparse]."""
    from argparse import Namespace

    from hyv_lib.cli.official_flags import preset_from_flags

    def pick(**flags):
        args = Namespace(**{**dict(preset=None, model_path=None, resolution=None, task=None, cfg_distilled=False,
                                   step_distilled=False, sparse_attn=False, image_path=None), **flags})
        got = preset_from_flags(args)
        return got if isinstance(got, str) or got is None else got.preset.name

    assert pick() is None  # none given: --preset's default (the folder's, or tiny_trained)
    assert pick(resolution="480p") == "480p_t2v"
    assert pick(resolution="720p", image_path="x.png") == "720p_i2v"
    assert pick(resolution="480p", task="i2v", step_distilled=True) == "480p_i2v_step_distilled"
    assert pick(resolution="480p", cfg_distilled=True) == "480p_t2v_distilled"
    assert pick(resolution="720p", task="i2v", sparse_attn=True) == "720p_i2v_distilled_sparse"
    assert pick(resolution="720p", sparse_attn=True) == "720p_t2v_distilled_sparse"
    with pytest.raises(HyvInputError, match="--resolution"):  # 720p t2v cfg-distilled is not released
        pick(resolution="720p", cfg_distilled=True)
    with pytest.raises(HyvInputError, match="--resolution"):
        pick(resolution="480p", preset="720p_t2v")
    assert pick(task="t2v", model_path=real_folders["720p_t2v"][1]) == "720p_t2v"  # the folder settles 480p/720p
    with pytest.raises(HyvInputError, match="^resolution: "):
        pick(resolution="480p", model_path=real_folders["720p_t2v"][1])


def test_stage2_reads_a_staged_scripts_stage1_folder(real_folders, tmp_path, capsys):
    """The staged scripts' stage 1 writes the 8 tensors and a config without "preset": stage 2 runs it with --preset
    (or --model_path), records both, and stage 3 follows."""
    out = tmp_path / "staged"
    assert run(["stage1", "--model_path", real_folders["480p_t2v"][1], "--prompt", "a cat", "--output_dir", str(out),
                "--quiet"]) == 0
    config_path = out / "generation_config.json"
    config_path.write_text(json.dumps({"prompt": "a cat"}))  # as the staged scripts leave it
    size = ["--num_inference_steps", "1", "--video_length", "1", "--height", "32", "--width", "32", "--quiet"]
    assert run(["stage2", "--input_dir", str(out), *size]) == 2
    assert "give --preset and --model_path" in capsys.readouterr().err
    assert run(["stage2", "--input_dir", str(out), "--preset", "720p_t2v", "--model_path",
                real_folders["480p_t2v"][1], *size]) == 2  # the folder is 480p
    capsys.readouterr()
    assert run(["stage2", "--input_dir", str(out), "--preset", "480p_t2v", "--model_path",
                real_folders["480p_t2v"][1], *size]) == 0, capsys.readouterr().err
    config = json.loads(config_path.read_text())
    assert config["preset"] == "480p_t2v" and config["flow_shift"] == 5.0
    assert run(["stage3", "--input_dir", str(out), "--quiet"]) == 0 and (out / "output_video.mp4").exists()


def test_abbreviated_flags_are_refused(capsys):
    with pytest.raises(SystemExit) as exit_:
        run(["generate", "--num_inf", "3"])
    assert exit_.value.code == 2 and "--num_inf" in capsys.readouterr().err

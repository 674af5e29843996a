"""Every bad input gives one clear line naming the argument, exit code 2, and no partial output."""

import os
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from hyv_lib.base.errors import HyvInputError
from hyv_lib.cli.commands import run
from hyv_lib.pipeline.stages import generate, stage2, stage3


def fail(capsys, argv, argument):
    code = run(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2, err
    assert len(err) == 1 and err[0].startswith(f"error: {argument}:"), err
    return err[0]


@pytest.fixture()
def run_dir(tiny_run, tmp_path):
    """A private copy of the session's tiny run, safe to corrupt."""
    d = tmp_path / "run"
    shutil.copytree(tiny_run, d)
    return d


@pytest.mark.parametrize("flags,argument", [
    (["--video_length", "10"], "--video_length"),
    (["--video_length", "0"], "--video_length"),
    (["--height", "100", "--width", "160"], "--height"),
    (["--height", "96", "--width", "150"], "--width"),
    (["--height", "96"], "--width"),
    (["--num_inference_steps", "0"], "--num_inference_steps"),
    (["--guidance_scale", "0.5"], "--guidance_scale"),
    (["--aspect_ratio", "wide"], "--aspect_ratio"),
    (["--aspect_ratio", "16:0"], "--aspect_ratio"),
    (["--flow_shift", "0"], "--flow_shift"),
    (["--seed", "-1"], "--seed"),
    (["--warmup_steps", "-2"], "--warmup_steps"),
    (["--fps", "0"], "--fps"),
    (["--preset", "huge"], "--preset"),
    (["--dtype", "fp8"], "--dtype"),
    (["--runtime", "gpu"], "--runtime"),
    (["--mesh", "tensor=1"], "--mesh"),  # a mesh needs the jax runtime
    (["--runtime", "jax", "--mesh", "tensr=8"], "--mesh"),
    (["--runtime", "jax", "--mesh", "tensor=8"], "--mesh"),  # one CPU device here
    (["--runtime", "jax", "--sharding", "zero3"], "--sharding"),
    (["--attention", "fast"], "--attention"),
    (["--attention", "flash"], "--attention"),  # no GPU here: the reason is named before anything runs
    (["--attention", "sdpa", "--runtime", "jax"], "--attention"),  # the jax runtime runs JAX kernels
    (["--attention", "diffusers", "--runtime", "jax"], "--attention"),
    (["--multi_host"], "--multi_host"),  # needs the jax runtime
])
def test_generate_rejects_bad_settings_before_writing_anything(capsys, tmp_path, flags, argument):
    out = tmp_path / "out"
    fail(capsys, ["generate", "--output_dir", str(out), "--quiet", *flags], argument)
    assert not out.exists() or not os.listdir(out)


def test_real_preset_without_model_path(capsys, tmp_path):
    msg = fail(capsys, ["stage1", "--preset", "720p_t2v", "--output_dir", str(tmp_path / "o")], "--model_path")
    assert "hunyuanvideo-community/HunyuanVideo-1.5-Diffusers-720p_t2v" in msg
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("path", ["./no/such/folder", "/no/such/folder"])
def test_model_path_that_does_not_exist(capsys, tmp_path, path):
    fail(capsys, ["stage1", "--model_path", path, "--output_dir", str(tmp_path)], "--model_path")


def test_model_path_that_is_not_a_pipeline_folder(capsys, tmp_path):
    fail(capsys, ["stage1", "--model_path", str(tmp_path), "--output_dir", str(tmp_path / "o")], "--model_path")


def test_unwritable_output_dir(capsys, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    fail(capsys, ["stage1", "--output_dir", str(blocker / "sub")], "--output_dir")


def test_missing_input_dir(capsys, tmp_path):
    fail(capsys, ["stage2", "--input_dir", str(tmp_path / "nope")], "--input_dir")
    fail(capsys, ["stage3", "--input_dir", str(tmp_path / "nope")], "--input_dir")


def test_missing_stage_files(capsys, tmp_path):
    msg = fail(capsys, ["stage2", "--input_dir", str(tmp_path)], "--input_dir")
    assert "stage1_embeddings.safetensors not found" in msg
    fail(capsys, ["stage3", "--input_dir", str(tmp_path)], "--input_dir")


@pytest.mark.parametrize("stage,name", [("stage2", "stage1_embeddings.safetensors"),
                                        ("stage3", "stage2_latents.safetensors")])
def test_corrupt_stage_file(capsys, run_dir, stage, name):
    path = run_dir / name
    path.write_bytes(path.read_bytes()[:100])
    fail(capsys, [stage, "--input_dir", str(run_dir), "--quiet"], "--input_dir")


def test_corrupt_generation_config(capsys, run_dir):
    (run_dir / "generation_config.json").write_text("{not json")
    fail(capsys, ["stage2", "--input_dir", str(run_dir), "--quiet"], "--input_dir")


def _rewrite(path, edit):
    tensors = load_file(path)
    edit(tensors)
    save_file({k: v.contiguous() for k, v in tensors.items()}, path)


@pytest.mark.parametrize("edit,needle", [
    (lambda t: t.pop("negative_prompt_embeds_2"), "missing"),
    (lambda t: t.__setitem__("extra", torch.zeros(1)), "unexpected"),
    (lambda t: t.__setitem__("prompt_embeds", t["prompt_embeds"][0]), "[1, L, D]"),
    (lambda t: t.__setitem__("prompt_embeds", t["prompt_embeds"].to(torch.int32)), "float"),
    (lambda t: t.__setitem__("prompt_embeds_mask", t["prompt_embeds_mask"].float()), "integer or bool"),
    (lambda t: t.__setitem__("prompt_embeds_mask", t["prompt_embeds_mask"][:, :5]), "does not match"),
    (lambda t: t.__setitem__("prompt_embeds", t["prompt_embeds"][..., :7]), "positive counterpart"),
    (lambda t: t.update({k: t[k][..., :7] for k in ("prompt_embeds", "negative_prompt_embeds")}), "width"),
])
def test_stage1_file_with_wrong_names_ranks_or_dtypes(capsys, run_dir, edit, needle):
    _rewrite(run_dir / "stage1_embeddings.safetensors", edit)
    before = load_file(run_dir / "stage2_latents.safetensors")["latents"]
    msg = fail(capsys, ["stage2", "--input_dir", str(run_dir), "--quiet"], "--input_dir")
    assert needle in msg
    assert torch.equal(load_file(run_dir / "stage2_latents.safetensors")["latents"], before)  # untouched


@pytest.mark.parametrize("edit,needle", [
    (lambda t: t.__setitem__("noise", t.pop("latents")), "exactly one tensor"),
    (lambda t: t.__setitem__("latents", t["latents"][0]), "[1, C, T, H, W]"),
    (lambda t: t.__setitem__("latents", t["latents"].to(torch.int64)), "float"),
    (lambda t: t.__setitem__("latents", t["latents"][:, :3]), "channels"),
])
def test_stage2_file_with_wrong_names_ranks_or_dtypes(capsys, run_dir, edit, needle):
    _rewrite(run_dir / "stage2_latents.safetensors", edit)
    (run_dir / "output_video.mp4").unlink()
    msg = fail(capsys, ["stage3", "--input_dir", str(run_dir)], "--input_dir")
    assert needle in msg
    assert not (run_dir / "output_video.mp4").exists()


def test_stage3_bad_fps_and_output(capsys, run_dir):
    fail(capsys, ["stage3", "--input_dir", str(run_dir), "--fps", "-1"], "--fps")
    blocker = run_dir / "blocker"
    blocker.write_text("x")
    fail(capsys, ["stage3", "--input_dir", str(run_dir), "--output_video", str(blocker / "v.mp4")], "--output_video")


def test_no_preset_in_config(capsys, run_dir):
    (run_dir / "generation_config.json").write_text("{}")
    fail(capsys, ["stage2", "--input_dir", str(run_dir), "--quiet"], "--input_dir")


def test_argparse_errors_exit_2(capsys):
    with pytest.raises(SystemExit) as exc:
        run(["stage2", "--video_length", "many"])
    assert exc.value.code == 2


def test_stage2_checks_the_attention_backend_before_writing(capsys, run_dir):
    os.remove(run_dir / "stage2_latents.safetensors")
    msg = fail(capsys, ["stage2", "--input_dir", str(run_dir), "--attention", "flash", "--quiet"], "--attention")
    assert "cannot run here" in msg
    assert not (run_dir / "stage2_latents.safetensors").exists()


def test_stage2_settings_are_one_list_shared_by_the_functions_and_the_cli(tiny_run, tmp_path):
    """Every Stage2Settings field is a flag of stage2 and generate (same name, same default), and a name that is not
    a setting fails before anything is written."""
    from hyv_lib.cli.commands import build_parser
    from hyv_lib.pipeline.settings import STAGE2_SETTINGS, Stage2Settings

    defaults = Stage2Settings()
    for command in ("stage2", "generate"):
        args = build_parser().parse_args([command])
        for name in STAGE2_SETTINGS:
            assert getattr(args, name) == getattr(defaults, name), (command, name)
    out = tmp_path / "out"
    with pytest.raises(HyvInputError, match="is not a stage-2 setting") as err:
        stage2(str(tiny_run), output_dir=str(out), num_steps=4)
    assert err.value.argument == "num_steps" and not out.exists()  # called from Python: the parameter's name


def test_stage_functions_name_parameters_and_the_cli_names_flags(tiny_run, tmp_path, capsys):
    """The same check from both doors: Python gets ``fps``/``width`` (in the text too), the CLI ``--fps``/``--width``."""
    for call, argument in ((lambda: stage3(str(tiny_run), output_video=str(tmp_path / "v.mp4"), fps="24"),
                            "fps"),
                           (lambda: generate("tiny", "a", output_dir=str(tmp_path / "g"), height=64),
                            "width")):
        with pytest.raises(HyvInputError) as err:
            call()
        assert err.value.argument == argument and "--" not in str(err.value), err.value
    assert run(["generate", "--output_dir", str(tmp_path / "g"), "--height", "64"]) == 2
    assert capsys.readouterr().err.startswith("error: --width: give both --height and --width")
    assert run(["stage3", "--input_dir", str(tiny_run), "--output_video", str(tmp_path / "v.mp4"),
                    "--fps", "0"]) == 2
    assert capsys.readouterr().err.startswith("error: --fps:")
    assert not list(tmp_path.iterdir())

"""Faults while running (issue 31): one ``error:`` line naming the file or step, exit code 3 (2 for bad input), no
partial file; settings that used to crash late refused up front; umask modes, ``~`` paths, concurrent calls."""

import errno
import os
import shutil
import subprocess
import threading

import numpy as np
import pytest
import torch
from memory_probe import live_peak_bytes
from safetensors.torch import load_file, save_file

from hyv_lib.base.errors import EXIT_BAD_INPUT, EXIT_FAULT, HyvFaultError, HyvInputError
from hyv_lib.cli.commands import run


def error_line(capsys, argv, code):
    """Run the CLI in-process: exit ``code`` and exactly one stderr line, ``error: ...`` (no traceback)."""
    got = run(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert got == code, err
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


def partial_files(folder):
    return [p.name for p in folder.iterdir() if ".partial" in p.name]


@pytest.fixture()
def run_dir(tiny_run, tmp_path):
    """A private copy of the session's tiny run (stage files, mp4, config), safe to break."""
    d = tmp_path / "run"
    shutil.copytree(tiny_run, d)
    return d


# ------------------------------------------------------------------------------------- writes the OS refuses
@pytest.fixture()
def small_tmpfs(tmp_path):
    """Mount a tmpfs of a given size (a real full disk); skipped where mounting is not allowed (not root)."""
    mounts = []

    def mount(kib):
        point = tmp_path / f"tmpfs{len(mounts)}"
        point.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={kib}k", "tmpfs", str(point)],
                              capture_output=True)
        if done.returncode:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
        mounts.append(point)
        return point

    yield mount
    for point in mounts:
        done = subprocess.run(["umount", "--lazy", str(point)], capture_output=True)  # a failure may still map a file
        assert done.returncode == 0, done.stderr.decode()


@pytest.mark.parametrize("kib,failing,kept", [
    (20, "stage1_embeddings.safetensors", []),  # stage 1's 41 KiB file does not fit
    (72, "output_video.mp4", ["generation_config.json", "stage1_embeddings.safetensors",
                              "stage2_latents.safetensors"]),  # ffmpeg runs out of space (it used to exit unnoticed);
    # 72 KiB: the stages' run lock takes a page while they run (68 and 76 KiB fail at the mp4 as well)
])
def test_a_full_disk_is_one_error_line_naming_the_file_and_leaves_no_partial_file(capsys, small_tmpfs, kib,
                                                                                  failing, kept):
    out = small_tmpfs(kib) / "out"
    line = error_line(capsys, ["generate", "--preset", "tiny", "--output_dir", str(out), "--quiet"], EXIT_FAULT)
    assert line == f"error: {out / failing}: No space left on device"
    assert sorted(os.listdir(out)) == kept  # whole files only: no partial, no truncated mp4


def test_a_folder_that_turns_read_only_is_named(capsys, small_tmpfs, run_dir, tmp_path):
    """A real EROFS after the checks: stage 3's input folder is remounted read-only, so its mp4 (elsewhere) is written
    and its config update is refused: one line naming generation_config.json, exit 3."""
    folder = small_tmpfs(64) / "run"
    folder.mkdir()
    for name in ("stage2_latents.safetensors", "generation_config.json"):
        shutil.copy(run_dir / name, folder / name)
    config = (folder / "generation_config.json").read_bytes()
    assert subprocess.run(["mount", "-o", "remount,ro", str(folder.parent)]).returncode == 0
    video = tmp_path / "elsewhere" / "v.mp4"
    line = error_line(capsys, ["stage3", "--input_dir", str(folder), "--output_video", str(video), "--quiet"],
                      EXIT_FAULT)
    assert line == f"error: {folder / 'generation_config.json'}: Read-only file system"
    assert (folder / "generation_config.json").read_bytes() == config and video.is_file()


@pytest.fixture()
def failing_fsync(monkeypatch):
    """os.fsync fails with ``number`` on the temporary file of the named target: where a full disk, a read-only or
    forbidden folder or an I/O error surfaces for a write (a fault injected where mounting is not possible)."""

    def install(target, number):
        real = os.fsync
        stem = os.path.splitext(target)[0]

        def fsync(fd):
            name = os.path.basename(os.readlink(f"/proc/self/fd/{fd}"))
            if name.startswith(f".{stem}.") and ".partial" in name:
                raise OSError(number, os.strerror(number))
            return real(fd)

        monkeypatch.setattr(os, "fsync", fsync)

    return install


@pytest.mark.parametrize("number", [errno.ENOSPC, errno.EACCES, errno.EROFS, errno.EIO])
@pytest.mark.parametrize("target", ["output_video.mp4", "stage3_frames.safetensors", "generation_config.json"])
def test_each_writer_names_its_file_for_every_write_error(capsys, run_dir, failing_fsync, number, target):
    before = {name: (run_dir / name).read_bytes() for name in os.listdir(run_dir) if name != "output_video.mp4"}
    os.remove(run_dir / "output_video.mp4")
    os.remove(run_dir / "stage3_frames.safetensors")
    failing_fsync(target, number)
    line = error_line(capsys, ["stage3", "--input_dir", str(run_dir), "--save_frames", "--quiet"], EXIT_FAULT)
    assert line == f"error: {run_dir / target}: {os.strerror(number)}"
    assert partial_files(run_dir) == []
    assert target == "generation_config.json" or not (run_dir / target).exists()
    assert (run_dir / "generation_config.json").read_bytes() == before["generation_config.json"]  # old or whole new


def test_ffmpeg_failure_without_an_os_error_is_a_fault_naming_the_file(tmp_path, monkeypatch):
    """An ffmpeg that exits non-zero for another reason: HyvFaultError with the path and ffmpeg's last line."""
    import imageio_ffmpeg

    from hyv_lib.pipeline.video_io import write_mp4

    fake = tmp_path / "ffmpeg"
    fake.write_text("#!/bin/sh\ncat > /dev/null\necho 'first line' >&2\necho 'Unknown encoder libx264' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setattr(imageio_ffmpeg, "get_ffmpeg_exe", lambda: str(fake))
    with pytest.raises(HyvFaultError) as err:
        write_mp4(np.zeros((2, 16, 16, 3), np.uint8), str(tmp_path / "v.mp4"), 8)
    assert err.value.subject == str(tmp_path / "v.mp4") and "exit status 1: Unknown encoder libx264" in str(err.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ffmpeg"]


# ------------------------------------------------------------------------------------------ corrupt inputs
@pytest.fixture(scope="module")
def model_folder(tmp_path_factory):
    from hyv_lib.models.components import save_tiny_pipeline

    path = tmp_path_factory.mktemp("model") / "tiny"
    save_tiny_pipeline(str(path))
    return path


@pytest.mark.parametrize("component", ["transformer", "vae", "text_encoder"])
@pytest.mark.parametrize("damage", ["truncated", "garbled", "empty"])
def test_a_corrupt_weight_file_is_named_before_any_file_is_written(capsys, model_folder, tmp_path, component,
                                                                   damage):
    folder = tmp_path / "model"
    shutil.copytree(model_folder, folder)
    weights = next((folder / component).glob("*.safetensors"))
    data = weights.read_bytes()
    weights.write_bytes({"truncated": data[: len(data) // 2], "garbled": data[:8] + b"\xff" * 64 + data[72:],
                         "empty": b""}[damage])
    out = tmp_path / "out"
    line = error_line(capsys, ["generate", "--preset", "tiny", "--model_path", str(folder), "--output_dir", str(out),
                               "--quiet"], EXIT_BAD_INPUT)
    assert line.startswith(f"error: --model_path: '{weights}' is not a complete safetensors file")
    assert not out.exists() or not os.listdir(out)  # the transformer's damage found before stage 1 wrote


@pytest.mark.parametrize("name", ["stage1_embeddings.safetensors", "stage2_latents.safetensors"])
def test_a_truncated_stage_file_is_named(capsys, run_dir, name):
    path = run_dir / name
    path.write_bytes(path.read_bytes()[:-7])
    line = error_line(capsys, ["stage2" if name.startswith("stage1") else "stage3", "--input_dir", str(run_dir),
                               "--quiet"], EXIT_BAD_INPUT)
    assert line.startswith(f"error: --input_dir: '{path}' is not a readable safetensors file")


# ------------------------------------------------------------------------------------------ NaN and Inf
@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_stage3_refuses_latents_that_are_not_finite(capsys, run_dir, value):
    path = run_dir / "stage2_latents.safetensors"
    latents = load_file(path)["latents"]
    latents[0, 0, 0, 0, 0] = value
    save_file({"latents": latents}, path)
    os.remove(run_dir / "output_video.mp4")
    line = error_line(capsys, ["stage3", "--input_dir", str(run_dir), "--quiet"], EXIT_BAD_INPUT)
    assert line.startswith(f"error: --input_dir: '{path}': latents holds 1 NaN or infinite value(s) of "
                           f"{latents.numel()}")
    assert not (run_dir / "output_video.mp4").exists()


def test_stage2_stops_at_the_first_step_that_makes_nan(capsys, run_dir, monkeypatch):
    """A step whose prediction turns NaN at its third call: stage 2 names step 3 and writes nothing."""
    import hyv_lib.pipeline.denoiser as denoiser

    real_make_step = denoiser.make_step
    calls = []

    def make_step(*args, **kwargs):
        step = real_make_step(*args, **kwargs)

        def broken(**inputs):
            calls.append(1)
            noise = step(**inputs)
            return noise * float("nan") if len(calls) == 3 else noise
        return broken

    monkeypatch.setattr(denoiser, "make_step", make_step)
    before = (run_dir / "stage2_latents.safetensors").read_bytes()
    line = error_line(capsys, ["stage2", "--input_dir", str(run_dir), "--num_inference_steps", "5", "--quiet"],
                      EXIT_FAULT)
    assert line.startswith("error: denoising step 3 of 5: the latents became NaN or infinite at timestep ")
    assert len(calls) == 3  # stopped there, not run to the end
    assert (run_dir / "stage2_latents.safetensors").read_bytes() == before and partial_files(run_dir) == []


# ----------------------------------------------------------------------------- settings refused up front
@pytest.fixture(scope="module")
def pipe():
    import hyv_lib

    return hyv_lib.load_pipeline("tiny", progress=False)


@pytest.mark.parametrize("kwargs,argument", [
    (dict(seed=None), "seed"),  # was a bare TypeError
    (dict(seed=2**63), "seed"),
    (dict(seed=-1), "seed"),
    (dict(flow_shift=1e308), "flow_shift"),  # was an IndexError in the scheduler
    (dict(flow_shift=float("inf")), "flow_shift"),
    (dict(guidance_scale=1e308), "guidance_scale"),  # was an all-black video
    (dict(guidance_scale=float("inf")), "guidance_scale"),
])
def test_generate_refuses_settings_that_crashed_late(pipe, kwargs, argument):
    with pytest.raises(HyvInputError) as err:
        pipe.generate("a red ball", num_inference_steps=1, progress=False, **kwargs)
    assert err.value.argument == argument


@pytest.mark.parametrize("flags,argument", [
    (["--fps", "1e308"], "--fps"),  # was a broken pipe from ffmpeg after the decode
    (["--fps", "inf"], "--fps"),
    (["--fps", "1000"], "--fps"),  # the mp4 reads back at 0 fps
    (["--guidance_scale", "1e308"], "--guidance_scale"),
    (["--flow_shift", "1e308"], "--flow_shift"),
    (["--seed", str(2**63)], "--seed"),
    (["--runtime", "jax", "--mesh", "data=4,tensor=2"], "--mesh"),  # data does not divide the CFG pair
])
def test_the_cli_refuses_them_before_writing(capsys, tmp_path, flags, argument):
    out = tmp_path / "out"
    line = error_line(capsys, ["generate", "--preset", "tiny", "--output_dir", str(out), "--quiet", *flags],
                      EXIT_BAD_INPUT)
    assert line.startswith(f"error: {argument}: ")
    assert not out.exists() or not os.listdir(out)


def test_a_mesh_whose_data_axis_does_not_divide_the_cfg_pair_is_named():
    from hyv_lib.pipeline.inference import load_pipeline

    with pytest.raises(HyvInputError, match="data=4 does not divide the batch of 2") as err:
        load_pipeline("tiny", runtime="jax", mesh="data=4,tensor=2", progress=False)
    assert err.value.argument == "mesh"


def test_video_save_refuses_frame_rates_an_mp4_cannot_hold(pipe, tmp_path):
    video = pipe.generate("a red ball", num_inference_steps=1, progress=False)
    for fps in (float("inf"), 1e308, 1000, 0, 1e-6):
        with pytest.raises(HyvInputError) as err:
            video.save(str(tmp_path / "v.mp4"), fps=fps)
        assert err.value.argument == "fps"
    assert not list(tmp_path.iterdir())


def test_the_flow_shift_bound_is_where_the_schedule_stays_near_pure_noise():
    """The bound's message: at shift 1000 even the last of 50 steps starts at sigma 0.95 (diffusers' scheduler)."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    from hyv_lib.models.hunyuan_video15.sampling import sampling_schedule
    from hyv_lib.pipeline.settings import MAX_FLOW_SHIFT

    scheduler = FlowMatchEulerDiscreteScheduler(shift=MAX_FLOW_SHIFT)
    sampling_schedule(scheduler, 50)
    assert 0.95 <= float(scheduler.sigmas[49]) < 0.96


@pytest.mark.parametrize("kwargs,argument", [(dict(data=0), "data"), (dict(data=-1), "data"),
                                             (dict(tensor=0), "tensor"), (dict(sequence=1.5), "sequence")])
def test_make_mesh_names_a_bad_axis_size(kwargs, argument):
    from hyv_lib.parallel.mesh import make_mesh

    with pytest.raises(HyvInputError) as err:  # data=0 was a ZeroDivisionError
        make_mesh(**kwargs)
    assert err.value.argument == argument


# ------------------------------------------------------------------------------------------ the size check
def test_the_size_check_is_hand_worked_and_refuses_before_any_work(capsys, tmp_path, monkeypatch):
    """A 16384 x 16384 tiny video of 9 frames (the preset's length) on a 16 GiB host: 9 x 16384^2 x 3 values, each
    at least 6 bytes in the decode (its output, at least bf16, and to_uint8_frames' fp32 copy) plus 1 byte of uint8
    frames = 50,734,301,184 bytes (47.25 GiB). It used to run stage 1 and the denoising for minutes first."""
    import hyv_lib.pipeline.size_check as size_check

    need = 9 * 16384 * 16384 * 3 * (6 + 1)
    assert need == 50_734_301_184
    monkeypatch.setattr(size_check, "host_memory_bytes", lambda: 16 * 2**30)
    out = tmp_path / "out"
    line = error_line(capsys, ["generate", "--preset", "tiny", "--height", "16384", "--width", "16384",
                               "--output_dir", str(out), "--quiet"], EXIT_BAD_INPUT)
    assert line == ("error: --height: a 16384x16384 video of 9 frames cannot fit: its decode alone holds at least "
                    "47.2 GiB on the host, which has 16.0 GiB; make --height/--width or --video_length smaller")
    assert not out.exists()
    monkeypatch.setattr(size_check, "host_memory_bytes", lambda: need)  # exactly enough: allowed
    size_check.check_fits(16384, 16384, 9, "torch")
    monkeypatch.setattr(size_check, "host_memory_bytes", lambda: need - 1)
    with pytest.raises(HyvInputError):
        size_check.check_fits(16384, 16384, 9, "torch")


def test_the_size_check_counts_the_gpu_when_the_decode_runs_there(monkeypatch):
    import hyv_lib.pipeline.size_check as size_check

    monkeypatch.setattr(size_check, "local_device", lambda: torch.device("cuda", 0))
    monkeypatch.setattr(size_check, "gpu_memory_bytes", lambda device: 80 * 10**9)  # an "80 GB" card
    monkeypatch.setattr(size_check, "host_memory_bytes", lambda: 2**40)
    size_check.check_fits(720, 1280, 121, "torch")  # 1.9 GiB of decode: fits
    with pytest.raises(HyvInputError, match=r"at least 544\.5 GiB on the GPU, which has 74\.5 GiB"):
        size_check.check_fits(16384, 16384, 121, "torch")  # 121 x 16384^2 x 3 x 6 bytes
    size_check.check_fits(16384, 16384, 121, "jax")  # the TPU's memory is the compiler's to judge; 90.8 GiB of frames


def test_the_size_check_is_a_lower_bound_of_a_measured_decode():
    """The bound never refuses what runs. Measured on the host: turning a decoded video into uint8 frames holds 10
    bytes per value at once from a bf16 video and 12 from an fp32 one (the video, its fp32 copies, the frames), at
    least the 6 + 1 counted; a whole tiny decode holds more than the bound too."""
    from hyv_lib.models.families import get_preset
    from hyv_lib.models.components import build_tiny_components
    from hyv_lib.pipeline.size_check import DECODE_BYTES_PER_VALUE, FRAMES_BYTES_PER_VALUE, decode_bytes
    from hyv_lib.runtimes.vae import decode_latents, to_uint8_frames

    height, width, frames = 256, 256, 9
    for dtype, measured in ((torch.bfloat16, 10), (torch.float32, 12)):
        video = (torch.rand(3, frames, height, width) * 2 - 1).to(dtype)
        held = video.numel() * video.element_size() + live_peak_bytes(lambda: to_uint8_frames(video))
        assert held / video.numel() == pytest.approx(measured, abs=0.01)
        assert measured >= DECODE_BYTES_PER_VALUE + FRAMES_BYTES_PER_VALUE
    preset = get_preset("tiny")
    vae = build_tiny_components(preset, names=["vae"])["vae"]
    latents = torch.randn(preset.latent_shape(height, width, frames))
    bound = decode_bytes(height, width, frames, on_gpu=False)["host"]
    assert bound == 9 * 256 * 256 * 3 * 7
    assert live_peak_bytes(lambda: decode_latents(vae, latents)) >= bound  # 136.7 MB against 12.4 MB here


# ------------------------------------------------------------------------------- modes, paths, threads
def test_stage_files_get_the_umask_mode_like_the_json_and_the_mp4(tmp_path):
    from hyv_lib.pipeline.stages import generate

    before = os.umask(0o027)
    try:
        generate("tiny", "a red ball", output_dir=str(tmp_path / "out"), num_inference_steps=1, save_frames=True,
                 quiet=True)
    finally:
        os.umask(before)
    modes = {p.name: p.stat().st_mode & 0o777 for p in (tmp_path / "out").iterdir()}
    # the safetensors files were 0600
    assert modes == dict.fromkeys(["generation_config.json", "output_video.mp4", "stage1_embeddings.safetensors",
                                   "stage2_latents.safetensors", "stage3_frames.safetensors"], 0o640)


def test_video_save_expands_the_home_folder(pipe, tmp_path, monkeypatch):
    home, cwd = tmp_path / "home", tmp_path / "cwd"
    home.mkdir()
    cwd.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(cwd)
    video = pipe.generate("a red ball", num_inference_steps=1, progress=False)
    assert video.save("~/clips/x.mp4") == str(home / "clips" / "x.mp4")
    assert (home / "clips" / "x.mp4").is_file() and not list(cwd.iterdir())  # no folder named "~"


def test_a_model_path_under_home_is_expanded(model_folder, tmp_path, monkeypatch):
    """``load_components(..., model_path="~/...")`` from Python: the folder under $HOME (it was "does not exist")."""
    from hyv_lib.models.families import get_preset
    from hyv_lib.models.components import load_components

    monkeypatch.setenv("HOME", str(model_folder.parent))
    loaded = load_components(get_preset("tiny"), f"~/{model_folder.name}", ["scheduler"])
    assert loaded["scheduler"].config.shift == get_preset("tiny").flow_shift


def test_two_threads_on_one_pipeline_get_their_own_videos(pipe):
    """DeepCache keeps its features on the shared transformer and the decode patches the shared VAE: two threads'
    calls used to mix (latents off by ~1, or an AttributeError in the VAE patch). Now they wait for each other."""
    from hyv_lib.runtimes.deepcache import DeepCacheSchedule

    kwargs = dict(num_inference_steps=4, cache=DeepCacheSchedule(4, start=1, end=4, interval=2), progress=False)
    alone = {seed: pipe.generate("a red ball", seed=seed, **kwargs) for seed in (1, 2)}
    together, errors = {}, []

    def call(seed):
        try:
            together[seed] = pipe.generate("a red ball", seed=seed, **kwargs)
        except Exception as err:  # noqa: BLE001 - reported below
            errors.append(err)

    threads = [threading.Thread(target=call, args=(seed,)) for seed in (1, 2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    for seed in (1, 2):
        assert torch.equal(together[seed].latents, alone[seed].latents)
        assert np.array_equal(together[seed].frames, alone[seed].frames)


def test_an_image_path_under_home_is_expanded(tmp_path, monkeypatch):
    """``load_image("~/frame.png")`` from Python: the file under $HOME (it was "does not exist")."""
    from PIL import Image

    from hyv_lib.pipeline.image import load_image

    Image.new("RGB", (64, 48), (200, 30, 30)).save(tmp_path / "frame.png")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert load_image("~/frame.png").size == (64, 48)

"""The adaptive (MagCache-style) step cache: its decision rule, calibration, runtimes, flags and records."""

import copy
import json
import random

import pytest
import torch
from tiny_inputs import TINY, forward_kwargs

from hyv_lib.base.errors import HyvInputError
from hyv_lib.models.families import get_preset
from hyv_lib.pipeline.calibration import CalibrationStep, resolve_calibration
from hyv_lib.models.hunyuan_video15.sampling import denoise
from hyv_lib.pipeline.settings import resolve_settings
from hyv_lib.runtimes.deepcache import DeepCacheStep, TorchDeepCache
from hyv_lib.runtimes.magcache import (
    MagCacheCalibration,
    MagCacheSchedule,
    bundled_calibration,
    full_steps,
    load_calibration,
)
from hyv_lib.runtimes.step import torch_step


# ----------------------------------------------------------------------------------------------- the rule alone
def test_a_hand_worked_curve_gives_the_expected_pattern():
    """Worked by hand: retention 0.2 of 10 steps keeps 0 and 1 full; then each step adds its curve value to the
    drift and the drift to the error; a step is cached while error < threshold and at most max_skip in a row.
    threshold 0.2, K 2: t2 drift .05 err .05 cached; t3 .10/.15 cached; t4 .15/.30 full (reset); t5 .3/.3 full;
    t6 .05/.05 cached; t7 .10/.15 cached; t8 .15/.30 full; t9 .05/.05 cached."""
    curve = [0.0, 0.05, 0.05, 0.05, 0.05, 0.3, 0.05, 0.05, 0.05, 0.05]
    schedule = MagCacheSchedule(curve, threshold=0.2, max_skip=2, retention=0.2)
    assert schedule.full_steps == [0, 1, 4, 5, 8]
    assert schedule.cached_steps == [2, 3, 6, 7, 9]
    assert [schedule.is_full(s) for s in range(10)] == [s in (0, 1, 4, 5, 8) for s in range(10)]
    assert schedule.cached_in(8) == 4 and schedule.num_steps == 10
    # A large threshold leaves only K: two cached, the third full, again and again.
    assert full_steps(curve, threshold=10.0, max_skip=2, retention=0.2) == [0, 1, 4, 7]
    # Retention 0.5 keeps the first five full; threshold 0 keeps everything full (strict comparison).
    assert full_steps(curve, threshold=0.2, max_skip=2, retention=0.5) == [0, 1, 2, 3, 4, 5, 8]
    assert full_steps(curve, threshold=0.0, max_skip=5, retention=0.0) == list(range(10))
    assert full_steps([0.0] * 10, threshold=0.0, max_skip=5, retention=0.0) == list(range(10))
    # 5 full of 10 steps, 2 blocks, 1 recomputed: 10 * 2 / (5 * 2 + 5 * 1)
    assert schedule.block_speedup(2, 1) == pytest.approx(20 / 15)


def test_never_more_than_k_in_a_row_and_the_first_steps_always_full():
    rng = random.Random(0)
    for _ in range(300):
        n = rng.randint(1, 60)
        curve = [0.0] + [rng.uniform(0, 0.2) for _ in range(n - 1)]
        k, retention, threshold = rng.randint(1, 6), rng.choice([0.0, 0.1, 0.2, 0.5]), rng.uniform(0, 1.5)
        full = set(full_steps(curve, threshold, k, retention))
        assert 0 in full and set(range(int(retention * n + 1e-9))) <= full
        run = 0
        for step in range(n):
            run = 0 if step in full else run + 1
            assert run <= k


@pytest.mark.parametrize("kwargs", [dict(curve=[]), dict(curve=[0.0, -0.1]), dict(curve=[0.0, float("nan")]),
                                    dict(threshold=-1.0), dict(max_skip=0), dict(retention=1.0)])
def test_bad_schedules_raise(kwargs):
    with pytest.raises(ValueError):
        MagCacheSchedule(**{"curve": [0.0, 0.1], **kwargs})


# ----------------------------------------------------------------------------------------------- on the model
@pytest.fixture(scope="module")
def model():
    from hyv_lib.models.components import build_tiny_components

    return build_tiny_components(TINY, names=["transformer"])["transformer"]


STEPS = 8


def run_loop(step, steps=STEPS):
    """The pipeline's own CFG loop on tiny latents with real padding (as tests/test_cache.py runs it)."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    kwargs = forward_kwargs(seed=1)
    conditioning = {k: v for k, v in kwargs.items() if k not in ("hidden_states", "timestep")}
    latents = torch.randn(1, TINY.latent_channels, 2, 6, 10, generator=torch.Generator().manual_seed(3))
    return denoise(step, latents, conditioning, FlowMatchEulerDiscreteScheduler(shift=5.0), num_inference_steps=steps,
                   guidance_scale=6.0, progress=False)


@pytest.fixture(scope="module")
def calibrated(model):
    """(curve, latents) of a calibration loop on the torch runtime, and the uncached latents."""
    step = CalibrationStep(TorchDeepCache(model), 1)
    latents = run_loop(step)
    return step.curve, latents, run_loop(torch_step(model))


def test_the_calibration_run_is_the_uncached_run_and_its_curve_is_the_relative_change(model, calibrated):
    curve, latents, uncached = calibrated
    assert torch.equal(latents, uncached)
    assert len(curve) == STEPS and curve[0] == 0.0 and all(0 < c < 2 for c in curve[1:])
    # The first value recomputed from the recorded tokens by hand: the tokens entering the last block at steps 0, 1.
    runtime, seen = TorchDeepCache(model), []

    class Recorder:
        def reset(self):
            pass

        def __call__(self, **kwargs):
            out, cache = runtime.run_and_cache(1, **kwargs)
            seen.append(cache[0])
            if len(seen) == 2:
                raise StopIteration
            return out

    with pytest.raises(StopIteration):
        run_loop(Recorder())
    by_hand = ((seen[1] - seen[0]).norm(dim=-1) / seen[0].norm(dim=-1)).mean().item()
    assert curve[1] == pytest.approx(by_hand, rel=1e-6)


def test_threshold_zero_runs_every_step_full_and_gives_exactly_the_uncached_latents(model, calibrated):
    curve, _, uncached = calibrated
    step = DeepCacheStep(TorchDeepCache(model), MagCacheSchedule(curve, threshold=0.0))
    with pytest.warns(UserWarning, match="caches none"):
        latents = run_loop(step)
    assert torch.equal(latents, uncached)
    assert (step.full_calls, step.cached_calls, step.skipped_steps) == (STEPS, 0, [])


@pytest.fixture(scope="module")
def skipping(model, calibrated):
    """(schedule, step, latents) of a torch run with a threshold of 1.5x the curve's largest value (each step alone
    may be skipped after the retained ones, so some are) and K = 2."""
    curve = calibrated[0]
    schedule = MagCacheSchedule(curve, threshold=1.5 * max(curve), max_skip=2, retention=0.25)
    step = DeepCacheStep(TorchDeepCache(model), schedule)
    return schedule, step, run_loop(step)


def test_a_higher_threshold_skips_the_schedules_steps_and_no_more_than_k_in_a_row(calibrated, skipping):
    uncached = calibrated[2]
    schedule, step, latents = skipping
    assert schedule.cached_steps  # this threshold skips something on this curve
    assert step.skipped_steps == schedule.cached_steps
    assert (step.full_calls, step.cached_calls) == (len(schedule.full_steps), len(schedule.cached_steps))
    assert {0, 1} <= set(schedule.full_steps)  # retention 0.25 of 8 steps
    runs, run = [], 0
    for s in range(STEPS):
        run = 0 if schedule.is_full(s) else run + 1
        runs.append(run)
    assert max(runs) <= 2
    assert not torch.equal(latents, uncached)
    assert (latents - uncached).abs().max() < 0.5 * uncached.abs().max()


def test_tpu_runtime_calibrates_alike_skips_the_same_steps_and_compiles_two_programs(model, calibrated, skipping):
    from hyv_lib.runtimes.jax_step import JaxTransformer

    curve = calibrated[0]
    schedule, torch_cached, reference = skipping
    tpu = JaxTransformer(copy.deepcopy(model), attention="xla")
    calibration = CalibrationStep(tpu, 1)
    run_loop(calibration)  # through the full program: the first of the two
    assert calibration.curve == pytest.approx(curve, rel=1e-4, abs=1e-6)
    own = MagCacheSchedule(calibration.curve, schedule.threshold, schedule.max_skip, schedule.retention)
    assert own.full_steps == schedule.full_steps  # its own curve makes the same decisions
    step = DeepCacheStep(tpu, schedule)
    latents = run_loop(step)
    assert step.skipped_steps == torch_cached.skipped_steps == schedule.cached_steps
    torch.testing.assert_close(latents, reference, rtol=0, atol=1e-5)
    assert tpu.compilations == 2  # one full program, one cached program: calibration and all 8 steps included


# ----------------------------------------------------------------------------------------------- files
def calibration(**overrides):
    fields = dict(preset="tiny", num_inference_steps=4, flow_shift=5.0, no_cache_blocks=1,
                  curve=(0.0, 0.1, 0.05, 0.2), guidance_scale=6.0, height=96, width=160, video_length=9)
    return MagCacheCalibration(**{**fields, **overrides})


def test_a_calibration_file_round_trips_and_a_mismatched_one_is_refused(tmp_path):
    path = str(tmp_path / "cal.json")
    original = calibration()
    original.save(path)
    loaded = load_calibration(path)
    assert loaded == original and loaded.path == path
    assert MagCacheSchedule.from_calibration(loaded, 0.3, 2, 0.25).curve == original.curve
    loaded.check("tiny", 4, 5.0, 1)
    with pytest.raises(HyvInputError, match="num_inference_steps 4 but this run has 8") as err:
        loaded.check("tiny", 8, 5.0, 1)
    assert err.value.argument == "cache_calibration" and "calibrate_cache" in err.value.message
    mismatched = resolve_settings(TINY, num_inference_steps=8, enable_cache=True, cache_method="magcache",
                                  cache_calibration=path)  # settings take the file; it is resolved with the schedule
    with pytest.raises(HyvInputError, match="cache_calibration"):
        resolve_calibration(mismatched, TINY)
    for bad in ("not json", json.dumps({"format": "other"}),
                json.dumps({**original.to_json(), "curve": [0.0, 0.1]}),
                json.dumps({k: v for k, v in original.to_json().items() if k != "flow_shift"})):
        (tmp_path / "bad.json").write_text(bad)
        with pytest.raises(HyvInputError, match="cache_calibration"):
            load_calibration(str(tmp_path / "bad.json"))


@pytest.mark.parametrize("no_cache_blocks", [1, 0])
def test_the_shipped_tiny_trained_calibration_fits_its_defaults_and_its_first_values_regenerate(no_cache_blocks):
    """The shipped files (one per no_cache_blocks) are records of the bundled weights: their settings are the
    preset's, and the first values of a curve come back from the same calibration loop (stopped after 4 of its 20
    steps)."""
    from hyv_lib.pipeline import calibration
    from hyv_lib.pipeline.calibration import calibrate
    from hyv_lib.pipeline.sampling import sample_latents
    from hyv_lib.runtimes.magcache import DEFAULT_THRESHOLD

    preset = get_preset("tiny_trained")
    path = bundled_calibration(preset, no_cache_blocks)
    shipped = load_calibration(path)
    assert (shipped.num_inference_steps, shipped.flow_shift, shipped.guidance_scale, shipped.no_cache_blocks) == \
        (preset.default_steps, preset.flow_shift, preset.guidance_scale, no_cache_blocks)
    settings = resolve_settings(preset, enable_cache=True, cache_method="magcache", no_cache_blocks=no_cache_blocks)
    assert resolve_calibration(settings, preset) == path and settings.cache_threshold == DEFAULT_THRESHOLD
    other = resolve_settings(preset, num_inference_steps=6, enable_cache=True, no_cache_blocks=no_cache_blocks,
                             cache_method="magcache")
    assert resolve_calibration(other, preset) is None  # other steps: calibrated anew
    assert bundled_calibration(preset, 2) is None

    class Stop(Exception):
        pass

    original = CalibrationStep.__call__

    def stop_after_four(self, **kwargs):
        if len(self.curve) == 4:
            raise Stop
        return original(self, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(CalibrationStep, "__call__", stop_after_four)
        real_sample = sample_latents

        def sample(step, *args, **kwargs):
            try:
                return real_sample(step, *args, **kwargs)
            except Stop:
                return None

        patch.setattr(calibration, "sample_latents", sample)  # the name calibrate() calls
        first = calibrate("tiny_trained", prompt=shipped.prompt, seed=shipped.seed,
                          no_cache_blocks=no_cache_blocks)
    assert first.curve == pytest.approx(list(shipped.curve[:4]), abs=2e-6)


# ----------------------------------------------------------------------------------------------- flags
def hyv(capsys, *argv):
    from hyv_lib.cli.commands import run

    code = run(list(argv))
    return code, capsys.readouterr().err.strip().splitlines()


@pytest.mark.parametrize("flags,argument", [
    (["--enable_cache", "--cache_method", "teacache"], "--cache_method"),
    (["--cache_method", "magcache"], "--cache_method"),  # needs --enable_cache
    (["--enable_cache", "--cache_threshold", "0.1"], "--cache_threshold"),  # deepcache has no threshold
    (["--enable_cache", "--cache_method", "magcache", "--cache_threshold", "-0.1"], "--cache_threshold"),
    (["--enable_cache", "--cache_method", "magcache", "--cache_threshold", "nan"], "--cache_threshold"),
    (["--enable_cache", "--cache_method", "magcache", "--cache_max_skip", "0"], "--cache_max_skip"),
    (["--enable_cache", "--cache_method", "magcache", "--cache_retention", "1"], "--cache_retention"),
    (["--enable_cache", "--cache_method", "magcache", "--cache_calibration", "/nonexistent.json"],
     "--cache_calibration"),
    (["--preset", "480p_t2v", "--enable_cache", "--cache_method", "magcache"], "--cache_calibration"),
])
def test_bad_flags_exit_2_naming_the_flag(capsys, tmp_path, flags, argument):
    out = tmp_path / "out"
    code, err = hyv(capsys, "generate", "--output_dir", str(out), "--quiet", *flags)
    assert code == 2 and len(err) == 1 and err[0].startswith(f"error: {argument}:"), err
    assert not out.exists()


@pytest.mark.parametrize("flags,argument", [
    (["--output", "cal.txt"], "--output"),
    (["--output", "cal.json", "--no_cache_blocks", "9"], "--no_cache_blocks"),
    (["--output", "cal.json", "--runtime", "ulysses"], "--runtime"),
    (["--output", "cal.json", "--num_inference_steps", "0"], "--num_inference_steps"),
])
def test_calibrate_cache_rejects_bad_flags_before_running(capsys, tmp_path, monkeypatch, flags, argument):
    monkeypatch.chdir(tmp_path)
    code, err = hyv(capsys, "calibrate_cache", "--preset", "tiny", "--quiet", *flags)
    assert code == 2 and len(err) == 1 and err[0].startswith(f"error: {argument}:"), err
    assert not list(tmp_path.iterdir())


def test_a_calibration_for_other_steps_exits_2_naming_the_flag(capsys, tmp_path):
    path = str(tmp_path / "cal.json")
    calibration(num_inference_steps=4).save(path)
    out = tmp_path / "out"
    code, err = hyv(capsys, "generate", "--preset", "tiny", "--num_inference_steps", "8", "--enable_cache",
                    "--cache_method", "magcache", "--cache_calibration", path, "--output_dir", str(out), "--quiet")
    assert code == 2 and len(err) == 1 and err[0].startswith("error: --cache_calibration:"), err
    assert "num_inference_steps 4 but this run has 8" in err[0] and not out.exists()


def test_calibrate_cache_then_generate_records_the_method_and_the_skipped_steps(capsys, tmp_path):
    """The CLI end to end on the tiny preset: a calibration file, a run that uses it, and one without a file that
    calibrates on the fly (with a warning) to the same curve, so it skips the same steps."""
    common = ["--preset", "tiny", "--video_length", "5", "--num_inference_steps", "4", "--height", "32", "--width",
              "48"]
    path = tmp_path / "cal.json"
    code, err = hyv(capsys, "calibrate_cache", *common, "--output", str(path), "--quiet")
    assert code == 0, err
    cal = load_calibration(str(path))
    assert (cal.num_inference_steps, cal.video_length, cal.height, len(cal.curve)) == (4, 5, 32, 4)
    threshold = str(1.5 * max(cal.curve))
    flags = ["--enable_cache", "--cache_method", "magcache", "--cache_threshold", threshold, "--cache_max_skip", "2",
             "--cache_retention", "0.2", "--prompt", "a red ball", "--quiet"]
    code, err = hyv(capsys, "generate", *common, *flags, "--cache_calibration", str(path), "--output_dir",
                    str(tmp_path / "a"))
    assert code == 0, err
    config = json.loads((tmp_path / "a" / "generation_config.json").read_text())
    expected = MagCacheSchedule.from_calibration(cal, float(threshold), 2, 0.2).cached_steps
    assert expected and config["cache_skipped_steps"] == expected
    assert (config["cache_method"], config["cache_threshold"], config["cache_max_skip"]) == \
        ("magcache", float(threshold), 2)
    assert config["cache_calibration"] == str(path) and config["cache_cached_steps"] == len(expected)
    assert "cache_start_step" not in config
    with pytest.warns(UserWarning, match="calibrating with one uncached run now"):
        code, err = hyv(capsys, "stage2", "--input_dir", str(tmp_path / "a"), "--output_dir", str(tmp_path / "b"),
                        *common[2:], *flags[:-3], "--quiet")
    assert code == 0, err
    again = json.loads((tmp_path / "b" / "generation_config.json").read_text())
    assert again["cache_calibration"] is None and again["cache_skipped_steps"] == expected


def test_deepcache_stays_the_default_method(tmp_path):
    settings = resolve_settings(TINY, enable_cache=True, cache_start_step=1, cache_end_step=6)
    assert settings.cache_method == "deepcache" and "cache_threshold" not in settings.config()


def test_the_in_memory_pipeline_takes_a_magcache_schedule(tmp_path):
    import hyv_lib
    from hyv_lib.pipeline.calibration import magcache_schedule

    pipe = hyv_lib.load_pipeline("tiny", progress=False)
    cal = calibration(num_inference_steps=4, curve=(0.0, 0.1, 0.05, 0.2), flow_shift=TINY.flow_shift)
    path = str(tmp_path / "cal.json")
    cal.save(path)
    schedule = magcache_schedule("tiny", num_inference_steps=4, cache_threshold=0.12, cache_max_skip=2,
                                 cache_retention=0.25, cache_calibration=path)
    # By hand: retention keeps step 0; t1 error .1 < .12 cached; t2 drift .15, error .25 full; t3 error .2 full.
    assert schedule.cached_steps == [1]
    small = dict(seed=1, video_length=5, num_inference_steps=4, height=32, width=48, progress=False)
    video = pipe.generate("a red ball", cache=schedule, **small)
    assert video.config["cache_skipped_steps"] == [1] and video.config["cache_method"] == "magcache"
    assert (video.config["cache_calibration"], video.config["cache_threshold"]) == (path, 0.12)
    with pytest.raises(HyvInputError, match="cache_threshold"):
        magcache_schedule("tiny", num_inference_steps=4, cache_threshold=-1, cache_calibration=path)
    with pytest.raises(HyvInputError, match="flow_shift"):
        pipe.generate("a red ball", num_inference_steps=4, flow_shift=2.0, cache=schedule, progress=False)

"""dropout_target: a caption-dropped clip trained towards the frozen model's prediction for the empty prompt instead
of its own data, so guidance's unconditional half stays where it was."""

import copy

import pytest
import torch
from tiny_inputs import write_image_clips

from hyv_lib.base.errors import HyvInputError
from hyv_lib.models.components import build_tiny_components
from hyv_lib.models.families import get_preset
from hyv_lib.training.loop import build_batches, train

TINY = get_preset("tiny")


@pytest.fixture(scope="module")
def features(tmp_path_factory):
    """Two one-frame clips (64 x 112 PNGs) and their features, with one prior caption."""
    from hyv_lib.training.features import extract_features

    root = tmp_path_factory.mktemp("dropout_data")
    write_image_clips(root, [f"a green square number {i}" for i in range(2)], seed=2)
    assert extract_features(str(root / "data.json"), preset="tiny", output_dir=str(root / "features"),
                            prior_captions=["a red circle moving left on a black background"], progress=False).ok
    return str(root / "features")


def test_frozen_rows_train_towards_the_model_before_training(features):
    """At a fresh LoRA the adapted model is the frozen one, so clips trained towards it have loss 0; after updates
    the loss the step returns is the MSE against the untouched model (a copy made before the LoRA) on the frozen
    rows and against the data on the others, with the prior half as before."""
    from hyv_lib.models.lora import add_lora
    from hyv_lib.runtimes.torch_train import TorchTrainStep
    from hyv_lib.training.feature_set import FeatureSet

    fs = FeatureSet(features)
    options = dict(preset=TINY, model_config=TINY.transformer, task="t2v", caption_dropout=0.0, shift=3.0,
                   sampling="logit_normal", generator=torch.Generator().manual_seed(4))
    batch, prior = build_batches(fs, [0, 1], [0, 0], **options)
    model = build_tiny_components(TINY, names=["transformer"])["transformer"]
    before = copy.deepcopy(model).eval()
    torch.manual_seed(0)
    add_lora(model, 4)
    step = TorchTrainStep(copy.deepcopy(model), learning_rate=1e-2, remat=False)
    assert step.step(batch, frozen_rows=torch.tensor([True, True])) < 1e-12
    assert TorchTrainStep(copy.deepcopy(model), learning_rate=1e-2, remat=False).step(batch) > 1e-3
    step = TorchTrainStep(model, learning_rate=1e-2, remat=False)
    rows, w = torch.tensor([True, False]), 0.5
    for _ in range(3):
        step.step(batch, prior=prior, prior_weight=w, frozen_rows=rows)
    data_inputs = {k: v for k, v in batch.items() if k != "target"}
    prior_inputs = {k: v for k, v in prior.items() if k != "target"}
    with torch.no_grad():
        untouched, untouched_prior = (before(**x, return_dict=False)[0] for x in (data_inputs, prior_inputs))
        adapted, adapted_prior = (model(**x, return_dict=False)[0] for x in (data_inputs, prior_inputs))
    assert not torch.allclose(adapted, untouched, atol=1e-3)  # the LoRA did train
    target = torch.stack([untouched[0], batch["target"][1]])
    expected = ((adapted - target).pow(2).mean() + w * (adapted_prior - untouched_prior).pow(2).mean()) / (1 + w)
    got = step.step(batch, prior=prior, prior_weight=w, frozen_rows=rows)  # the loss before its update
    assert got == pytest.approx(float(expected), rel=1e-4)


def test_train_records_the_target_draws_as_before_and_checks_it(features, tmp_path, capsys):
    """hyv-tiny's default is frozen, the real presets' and tiny's data; with no caption dropped the two give the
    same losses (the coins are the same first draw); full and jax cannot switch a LoRA off."""
    from hyv_lib.cli.commands import run as cli
    from hyv_lib.training.checkpoint import checkpoint_path, read_info
    from hyv_lib.training.loop import LOG_FILE, read_log
    from hyv_lib.training.run_settings import train_defaults

    assert train_defaults(get_preset("tiny_trained"))["dropout_target"] == "frozen"
    assert {train_defaults(get_preset(p))["dropout_target"] for p in ("tiny", "480p_t2v", "720p_i2v")} == {"data"}

    def run(name, **kwargs):
        out = str(tmp_path / name)
        train(features, preset="tiny", steps=3, batch_size=2, output_dir=out, progress=False, **kwargs)
        return read_info(checkpoint_path(out))["settings"]["dropout_target"], [r["loss"] for r in read_log(f"{out}/{LOG_FILE}")]

    assert run("default", lora_rank=2)[0] == "data"
    same = [run(n, lora_rank=2, caption_dropout=0.0, dropout_target=n) for n in ("data", "frozen")]
    assert same[0][1] == same[1][1] and [s[0] for s in same] == ["data", "frozen"]
    assert run("dropped", lora_rank=2, caption_dropout=0.999, dropout_target="frozen")[1][0] < 1e-9
    assert run("full", full=True)[0] == "data"
    with pytest.raises(HyvInputError, match="dropout_target: must be one of data, frozen"):
        run("bad", lora_rank=2, dropout_target="base")
    with pytest.raises(HyvInputError, match="dropout_target.*not `full`"):
        run("bad_full", full=True, dropout_target="frozen")
    with pytest.raises(HyvInputError, match="dropout_target.*torch only"):
        run("bad_jax", lora_rank=2, runtime="jax", dropout_target="frozen")
    assert cli(["train", "--features", features, "--preset", "tiny", "--lora_rank", "2", "--steps", "1",
                "--output_dir", str(tmp_path / "cli"), "--dropout_target", "nothing", "--quiet"]) == 2
    assert capsys.readouterr().err.startswith("error: --dropout_target: must be one of data, frozen")

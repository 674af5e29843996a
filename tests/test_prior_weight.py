"""Prior captions: extract_features encodes them, build_batches gives each batch a prior half, and the torch step
trains it towards the frozen model's prediction (the LoRA switched off), weighted by train's prior_weight."""

import copy

import pytest
import torch
from tiny_inputs import write_image_clips

from hyv_lib.base.errors import HyvInputError
from hyv_lib.models.components import build_tiny_components
from hyv_lib.models.families import get_preset
from hyv_lib.training.loop import build_batch, build_batches, pick_clips, train

TINY = get_preset("tiny")
PRIOR = ["a red circle moving left on a black background", "a blue square moving up on a gray background",
         "a white triangle moving down on a purple background"]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """Two one-frame clips (64 x 112 PNGs), their features with the three PRIOR captions and without any."""
    from hyv_lib.training.features import extract_features

    root = tmp_path_factory.mktemp("prior_data")
    write_image_clips(root, [f"a green square number {i}" for i in range(2)], seed=1)
    for name, prior in (("with", PRIOR), ("without", ())):
        report = extract_features(str(root / "data.json"), preset="tiny", output_dir=str(root / name),
                                  prior_captions=prior, progress=False)
        assert report.ok
    return root


def test_the_prior_captions_are_encoded_as_a_clips_caption_is(folders):
    """Prior caption i's tensors are the text encoders' output for it (a clip captioned with it gets the same), in the
    order given; a folder without them has none; tiny's default is none."""
    from hyv_lib.models.components import load_components
    from hyv_lib.pipeline.text import encode_prompts
    from hyv_lib.training.feature_set import FeatureSet

    features = FeatureSet(str(folders / "with"))
    assert features.prior_captions == PRIOR and FeatureSet(str(folders / "without")).prior_captions == []
    components = load_components(TINY, None, ["tokenizer", "text_encoder", "tokenizer_2", "text_encoder_2"])
    for i, caption in enumerate(PRIOR):
        expected = encode_prompts(components, TINY, [caption])
        got = features.prior(i)
        assert set(got) == set(expected)
        for name, tensor in got.items():
            assert torch.equal(tensor, expected[name][0]), (caption, name)
    with pytest.raises(IndexError):
        features.prior(3)


def test_a_batchs_prior_half_shares_its_noisy_latents_and_holds_the_prior_text(folders):
    from hyv_lib.training.feature_set import FeatureSet

    features = FeatureSet(str(folders / "with"))
    g = torch.Generator().manual_seed(3)
    picks = pick_clips(features.shapes(), 2, g)
    state = g.get_state()
    options = dict(preset=TINY, model_config=TINY.transformer, task="t2v", caption_dropout=0.5, shift=3.0,
                   sampling="logit_normal")
    batch, prior = build_batches(features, picks, [2, 0], generator=g, **options)
    g.set_state(state)
    assert all(torch.equal(batch[k], v) for k, v in build_batch(features, picks, generator=g, **options).items())
    for key in ("hidden_states", "timestep", "image_embeds"):
        assert torch.equal(prior[key], batch[key])
    assert torch.equal(prior["encoder_hidden_states"][0], features.prior(2)["prompt_embeds"])
    assert torch.equal(prior["encoder_attention_mask"][1], features.prior(0)["prompt_embeds_mask"])


def test_the_prior_half_trains_towards_the_model_before_training(folders):
    """At a fresh LoRA (B = 0) the adapted model is the frozen one, so the prior half adds nothing and the loss is
    the data loss / (1 + w); after updates, frozen_prediction is still the untouched model's forward (a copy made
    before the LoRA) and the prior half's loss is the MSE to it."""
    from hyv_lib.models.lora import add_lora
    from hyv_lib.runtimes.torch_train import TorchTrainStep
    from hyv_lib.training.feature_set import FeatureSet

    features = FeatureSet(str(folders / "with"))
    options = dict(preset=TINY, model_config=TINY.transformer, task="t2v", caption_dropout=0.0, shift=3.0,
                   sampling="logit_normal", generator=torch.Generator().manual_seed(4))
    batch, prior = build_batches(features, [0, 1], [1, 2], **options)
    model = build_tiny_components(TINY, names=["transformer"])["transformer"]
    before = copy.deepcopy(model).eval()
    torch.manual_seed(0)
    add_lora(model, 4)
    plain = copy.deepcopy(model)
    w = 0.5
    step = TorchTrainStep(model, learning_rate=1e-2, remat=False)
    loss = step.step(batch, prior=prior, prior_weight=w)
    data_only = TorchTrainStep(plain, learning_rate=1e-2, remat=False).step(batch)
    assert loss == pytest.approx(data_only / (1 + w), rel=1e-6)
    for _ in range(3):
        step.step(batch, prior=prior, prior_weight=w)
    inputs = {k: v for k, v in prior.items() if k != "target"}
    with torch.no_grad():
        untouched = before(**inputs, return_dict=False)[0]
        adapted = model(**inputs, return_dict=False)[0]
    frozen = step.frozen_prediction(inputs)
    print(f"frozen vs untouched {float((frozen - untouched).abs().max()):.1e}; adapted moved "
          f"{float((adapted - untouched).abs().max()):.1e}")
    assert torch.allclose(frozen, untouched, atol=1e-5)
    assert not torch.allclose(adapted, untouched, atol=1e-3)  # the LoRA did train
    data_inputs = {k: v for k, v in batch.items() if k != "target"}
    with torch.no_grad():
        data_pred = model(**data_inputs, return_dict=False)[0]
    expected = ((data_pred - batch["target"]).pow(2).mean() + w * (adapted - untouched).pow(2).mean()) / (1 + w)
    got = step.step(batch, prior=prior, prior_weight=w)  # the loss it returns is the one before its update
    assert got == pytest.approx(float(expected), rel=1e-4)


def test_train_uses_the_prior_captions_by_default_and_checks_the_weight(folders, tmp_path):
    from hyv_lib.training.checkpoint import checkpoint_path, read_info

    def weight(name, **kwargs):
        out = str(tmp_path / name)
        train(str(folders / kwargs.pop("features", "with")), preset="tiny", steps=1, output_dir=out, progress=False,
              **kwargs)
        return read_info(checkpoint_path(out))["settings"]["prior_weight"]

    assert weight("default", lora_rank=2) == 1.0
    assert weight("given", lora_rank=2, prior_weight=0.25) == 0.25
    assert weight("off", lora_rank=2, prior_weight=0) == 0.0
    assert weight("none", lora_rank=2, features="without") == 0.0
    assert weight("full", full=True) == 0.0  # no adapter to switch off: the default leaves them out
    with pytest.raises(HyvInputError, match="prior_weight.*hold no prior captions"):
        weight("bad", lora_rank=2, features="without", prior_weight=1)
    with pytest.raises(HyvInputError, match="prior_weight.*not `full`"):
        weight("bad_full", full=True, prior_weight=1)
    with pytest.raises(HyvInputError, match="prior_weight.*runtime` torch only"):
        weight("bad_jax", lora_rank=2, runtime="jax", prior_weight=1)
    with pytest.raises(HyvInputError, match="prior_weight"):
        weight("negative", lora_rank=2, prior_weight=-1)


def test_the_cli_reads_a_captions_file_and_none(folders, tmp_path, capsys):
    from hyv_lib.cli.commands import run as cli
    from hyv_lib.training.feature_set import FeatureSet

    captions = tmp_path / "prior.txt"
    captions.write_text("\n".join(PRIOR[:2]) + "\n\n")
    base = ["extract_features", "--data_json", str(folders / "data.json"), "--preset", "tiny", "--quiet"]
    assert cli([*base, "--output_dir", str(tmp_path / "file"), "--prior_captions", str(captions)]) == 0
    assert FeatureSet(str(tmp_path / "file")).prior_captions == PRIOR[:2]
    assert cli([*base, "--output_dir", str(tmp_path / "none"), "--prior_captions", "none"]) == 0
    assert FeatureSet(str(tmp_path / "none")).prior_captions == []
    capsys.readouterr()
    # a rerun with other prior captions is refused, naming them
    assert cli([*base, "--output_dir", str(tmp_path / "none"), "--prior_captions", str(captions)]) == 2
    assert "prior_captions" in capsys.readouterr().err
    from hyv_lib.training.data_json import check_prior_captions

    with pytest.raises(HyvInputError, match="prior_captions: lists 'a red' more than once"):
        check_prior_captions(["a red", "a blue", "a red"])
    with pytest.raises(HyvInputError, match="prior_captions: must be a list"):
        check_prior_captions(["a red", ""])
    (tmp_path / "empty.txt").write_text("\n")
    assert cli([*base, "--output_dir", str(tmp_path / "empty"), "--prior_captions", str(tmp_path / "empty.txt")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --prior_captions:") and "no caption" in err
    assert cli(["train", "--features", str(tmp_path / "none"), "--preset", "tiny", "--lora_rank", "2", "--steps", "1",
                "--output_dir", str(tmp_path / "run"), "--prior_weight", "1", "--quiet"]) == 2
    assert capsys.readouterr().err.startswith("error: --prior_weight: 1, but the features hold no prior captions")


def test_hyv_tinys_prior_captions_are_training_captions_and_no_probe_caption():
    from hyv_lib.tiny import data, finetune_gate, motion_gate
    from hyv_lib.training.run_settings import train_defaults

    prior = train_defaults(get_preset("tiny_trained"))["prior_captions"]
    trained = {c.caption for c in data.split_combos()[0]}
    probes = {finetune_gate.caption(c) for c in finetune_gate.HELD_OUT + finetune_gate.KNOWN_PROBE}
    probes |= {c.caption for c in motion_gate.HELD_OUT + motion_gate.KNOWN_PROBE}
    assert len(prior) == 32 and set(prior) <= trained and not set(prior) & probes
    assert train_defaults(get_preset("480p_t2v"))["prior_captions"] == ()

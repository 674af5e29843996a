"""The fine-tuning loop (hyv_lib.training.loop) on a tiny feature folder: one torch train step against diffusers' eager
fp32 objective written out here, exact resume, the LoRA file it writes, 2-rank FSDP2 on gloo against one process,
and the CLI's errors."""

import copy
import json
import os
import threading

import numpy as np
import pytest
import torch

from tiny_inputs import replay_draws

from hyv_lib.base.errors import HyvInputError
from hyv_lib.models.families import get_preset
from hyv_lib.models.components import build_tiny_components
from hyv_lib.models.hunyuan_video15.components import example_forward_kwargs
from hyv_lib.training.loop import build_batch, pick_clips, read_log, train

TINY = get_preset("tiny")
CAPTIONS = ["a red circle", "a blue square moving left", "a green ball", "a gray box"]
# a short run: batches of 2, LoRA rank 4, a checkpoint every 2 steps, warmup over 2
RUN = dict(preset="tiny", lora_rank=4, batch_size=2, task="i2v", checkpoint_every=2, warmup_steps=2,
           learning_rate=1e-3, progress=False)


@pytest.fixture(scope="module")
def features_dir(tmp_path_factory):
    """Four one-frame clips (PNG images) of two latent shapes (6 x 10 and 10 x 6), t2v + i2v features, extracted by
    hyv_lib.training.features.extract_features."""
    from PIL import Image

    from hyv_lib.training.features import extract_features

    folder = tmp_path_factory.mktemp("train_data")
    rng = np.random.default_rng(0)
    entries = []
    for i, (h, w) in enumerate([(64, 112), (64, 112), (112, 64), (64, 112)]):
        Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)).save(folder / f"img{i}.png")
        entries.append({"path": f"img{i}.png", "cap": CAPTIONS[i]})
    (folder / "data.json").write_text(json.dumps(entries))
    report = extract_features(str(folder / "data.json"), preset="tiny", output_dir=str(folder / "features"),
                              task="i2v", progress=False)
    assert report.ok
    return str(folder / "features")


# ------------------------------------------------------------------------------------------------ (a)
def test_batch_and_step_equal_the_eager_objective(features_dir):
    """build_batch against the same draws replayed by hand, then one TorchTrainStep (full, gradient checkpointing on)
    against diffusers' eager fp32 forward of a copy, the MSE to noise - x0, the clipped gradients and AdamW's first
    update written out (m_hat = g, v_hat = g^2)."""
    from hyv_lib.training.feature_set import FeatureSet
    from hyv_lib.runtimes.torch_train import TorchTrainStep

    features = FeatureSet(features_dir)
    g = torch.Generator().manual_seed(5)
    picks = pick_clips(features.shapes(), 2, g)
    assert len({features.shapes()[i] for i in picks}) == 1  # one latent shape per batch
    state = g.get_state()
    batch = build_batch(features, picks, preset=TINY, model_config=TINY.transformer, task="i2v", caption_dropout=0.5,
                        shift=3.0, sampling="logit_normal", generator=g)

    # the same batch by hand: coins, noise, z in this order; i2v condition channels; empty prompt where dropped
    g.set_state(state)
    clips, drop, x0, noise, sigma = replay_draws(features, picks, g, 3.0)
    s = sigma.view(2, 1, 1, 1, 1)
    cond = torch.zeros(2, 9, *x0.shape[2:])
    cond[:, :8, :1] = torch.stack([c["cond_latents"] for c in clips])
    cond[:, 8, 0] = 1
    assert torch.equal(batch["hidden_states"], torch.cat([(1 - s) * x0 + s * noise, cond], dim=1))
    assert torch.equal(batch["target"], noise - x0)
    assert torch.allclose(batch["timestep"], sigma * 1000)
    assert torch.equal(batch["image_embeds"], torch.stack([c["image_embeds"] for c in clips]))
    for i, c in enumerate(clips):
        source = features.negative if drop[i] else c
        assert torch.equal(batch["encoder_hidden_states"][i], source["prompt_embeds"])
        assert torch.equal(batch["encoder_attention_mask_2"][i], source["prompt_embeds_mask_2"])

    # a batch with real padding in both text masks (14 and 40 of 128 tokens; ByT5 0 and 9 of 32), random image tokens
    kwargs = example_forward_kwargs(TINY, image=True, latent=(1, 6, 10))
    kwargs["timestep"] = torch.tensor([812.5, 230.0])
    kwargs["target"] = torch.randn(2, 8, 1, 6, 10, generator=torch.Generator().manual_seed(1))
    model = build_tiny_components(TINY, names=["transformer"])["transformer"]
    oracle = copy.deepcopy(model).train().requires_grad_(True)
    lr, wd = 1e-3, 0.01
    step = TorchTrainStep(model, trainable="full", learning_rate=lr, weight_decay=wd, remat=True)
    assert model.is_gradient_checkpointing
    loss = step.step(kwargs)

    inputs = {k: v for k, v in kwargs.items() if k != "target"}
    expected = (oracle(**inputs).sample - kwargs["target"]).pow(2).mean()
    expected.backward()
    grads = {n: p.grad for n, p in oracle.named_parameters() if p.grad is not None}
    norm = torch.sqrt(sum((g_ ** 2).sum() for g_ in grads.values()))
    clip = min(1.0, 1.0 / (norm.item() + 1e-6))
    print(f"loss {loss:.6f} vs eager {expected.item():.6f}; gradient norm {norm.item():.3f}, clip {clip:.3f}")
    assert loss == pytest.approx(expected.item(), rel=1e-6)
    trained = dict(model.named_parameters())
    worst_grad = worst_update = 0.0
    for name, p0 in oracle.named_parameters():
        g0 = grads.get(name, torch.zeros_like(p0)) * clip
        got = trained[name].grad if trained[name].grad is not None else torch.zeros_like(p0)
        worst_grad = max(worst_grad, (got - g0).abs().max().item() / (g0.abs().max().item() + 1e-12))
        updated = p0.detach() * (1 - lr * wd) - lr * g0 / (g0.abs() + 1e-8)
        updated = torch.where(g0 == 0, p0.detach() * (1 - lr * wd) if name in grads else p0.detach(), updated)
        worst_update = max(worst_update, (trained[name].detach() - updated).abs().max().item())
    print(f"worst relative gradient error {worst_grad:.1e}, worst updated-weight error {worst_update:.1e}")
    assert worst_grad < 1e-4  # measured ~1e-6: recomputed blocks, the same fp32 arithmetic
    assert worst_update < 1e-6  # an update is lr * sign(g) here: errors only where |g| is near eps


# ------------------------------------------------------------------------------------------------ (b), (c)
@pytest.fixture(scope="module")
def runs(features_dir, tmp_path_factory):
    """Four steps in one run, and the same run killed after its step-2 checkpoint (steps=2) and rerun with steps=4."""
    root = tmp_path_factory.mktemp("train_runs")
    whole = train(features_dir, output_dir=str(root / "whole"), steps=4, **RUN)
    first = train(features_dir, output_dir=str(root / "resumed"), steps=2, **RUN)
    with open(root / "resumed" / "train_log.jsonl", "a") as f:  # a step 3 the kill interrupted after its log line
        f.write(json.dumps({"step": 3, "loss": 123.0}) + "\n")
    second = train(features_dir, output_dir=str(root / "resumed"), steps=4, **RUN)
    return root, whole, first, second


def test_resume_reproduces_the_loss_curve_and_weights(runs, features_dir):
    from hyv_lib.models.lora import read_lora

    root, whole, first, second = runs
    assert second.resumed_from == 2 and [r["step"] for r in second.records] == [3, 4]
    curve = [r["loss"] for r in read_log(str(root / "whole" / "train_log.jsonl"))]
    resumed = [r["loss"] for r in read_log(str(root / "resumed" / "train_log.jsonl"))]
    print(f"losses, 4 steps: {curve}; killed after 2 and resumed: {resumed}")
    assert len(curve) == 4 and resumed == curve  # bit for bit
    a, b = read_lora(str(root / "whole")), read_lora(str(root / "resumed"))
    for name, layer in a.layers.items():
        assert torch.equal(layer.up, b.layers[name].up) and torch.equal(layer.down, b.layers[name].down)
    lrs = [r["lr"] for r in read_log(str(root / "whole" / "train_log.jsonl"))]
    assert lrs == [5e-4, 1e-3, 1e-3, 1e-3]  # linear warmup over 2 updates
    again = train(features_dir, steps=4, output_dir=str(root / "whole"), **RUN)  # finished: outputs written again
    assert again.resumed_from == 4 and again.records == []
    with pytest.raises(HyvInputError, match="steps") as info:  # fewer steps than the checkpoint holds
        train(features_dir, steps=3, output_dir=str(root / "whole"), **RUN)
    assert info.value.argument == "steps"


@pytest.mark.parametrize("shape", ["cosine", "linear"])
def test_decaying_schedules_follow_diffusers_schedulers(shape):
    """After the warmup, the learning rate of update k is the peak times diffusers' scheduler factor at step k (its
    get_scheduler of the same name); during the warmup, the loop's own (k + 1) / warmup of the peak."""
    from diffusers.optimization import get_scheduler

    from hyv_lib.runtimes.torch_train import lr_schedule

    peak, warmup, total = 3e-3, 5, 40
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=peak)
    theirs = get_scheduler(shape, optimizer, num_warmup_steps=warmup, num_training_steps=total)
    factors = [lam(k) for lam in theirs.lr_lambdas for k in range(total)]
    ours = lr_schedule(shape, peak, warmup, total)
    assert [ours(k) for k in range(warmup)] == pytest.approx([peak * (k + 1) / warmup for k in range(warmup)])
    assert [ours(k) for k in range(warmup, total)] == pytest.approx([peak * f for f in factors[warmup:]], abs=1e-12)
    assert ours(total) == pytest.approx(0.0, abs=1e-12) and ours(10 * total) == pytest.approx(0.0, abs=1e-12)


def test_a_decaying_run_logs_its_rates_and_refuses_more_steps(features_dir, tmp_path):
    """``lr_schedule="cosine"`` over 4 updates (warmup 2): 5e-4, 1e-3, then half of a cosine, 5e-4 (at p = 1/2);
    the decayed run cannot be trained further in its folder (its steps are part of its settings)."""
    out = str(tmp_path / "cosine")
    train(features_dir, output_dir=out, steps=4, lr_schedule="cosine", **RUN)
    lrs = [r["lr"] for r in read_log(os.path.join(out, "train_log.jsonl"))]
    assert lrs == pytest.approx([5e-4, 1e-3, 1e-3, 5e-4])
    with pytest.raises(HyvInputError, match="decays to zero at step 4") as info:
        train(features_dir, output_dir=out, steps=6, lr_schedule="cosine", **RUN)
    assert info.value.argument == "steps"
    with pytest.raises(HyvInputError, match="lr_schedule") as info:
        train(features_dir, output_dir=str(tmp_path / "other"), steps=4, lr_schedule="cos", **RUN)
    assert info.value.argument == "lr_schedule"


def test_the_presets_training_defaults_fill_what_a_run_leaves_out(features_dir, tmp_path):
    """A preset without train_defaults (tiny) trains at the official trainer's settings; hyv-tiny's replace them where
    the caller gives none; a given setting wins."""
    from hyv_lib.training.checkpoint import checkpoint_path, read_info
    from hyv_lib.training.run_settings import train_defaults

    official = dict(learning_rate=1e-4, batch_size=1, lr_schedule="constant", lora_targets="attn")
    assert {k: train_defaults(TINY)[k] for k in official} == official
    assert {k: train_defaults(get_preset("720p_t2v"))[k] for k in official} == official
    assert {k: train_defaults(get_preset("tiny_trained"))[k] for k in official} == dict(
        learning_rate=3e-3, batch_size=8, lr_schedule="cosine", lora_targets="text")
    out = str(tmp_path / "defaults")
    train(features_dir, preset="tiny", lora_rank=4, steps=1, output_dir=out, progress=False)
    settings = read_info(checkpoint_path(out))["settings"]
    assert {k: settings[k] for k in official} == official and settings["decay_steps"] is None
    out = str(tmp_path / "given")
    train(features_dir, preset="tiny", lora_rank=4, steps=2, output_dir=out, progress=False, batch_size=2,
          lr_schedule="linear", lora_targets="attn,mlp")
    settings = read_info(checkpoint_path(out))["settings"]
    assert (settings["batch_size"], settings["lr_schedule"], settings["decay_steps"]) == (2, "linear", 2)
    assert settings["lora_targets"] == "attn,mlp" and settings["learning_rate"] == 1e-4


def test_lora_output_changes_only_lora_weights(runs, features_dir):
    from hyv_lib.models.lora import LORA_FILE, add_lora, merge_lora, read_lora

    root, whole, _, _ = runs
    assert whole.output == str(root / "whole" / LORA_FILE)
    weights = read_lora(whole.output)
    assert weights.rank == 4 and weights.metadata["preset"] == "tiny" and weights.metadata["steps"] == 4
    base = build_tiny_components(TINY, names=["transformer"])["transformer"]
    with torch.random.fork_rng(devices=[]):  # the run's LoRA init: seeded by --seed (0)
        torch.manual_seed(0)
        fresh = copy.deepcopy(base)
        add_lora(fresh, 4)
    # lora_A moved from its seeded init, lora_B from zero; every layer trained
    from hyv_lib.training.checkpoint import load_checkpoint

    state, info = load_checkpoint(str(root / "whole" / "checkpoint.safetensors"))
    params = state["step"]["params"]
    assert info["step"] == 4 and all("lora_" in name for name in params)
    init = dict(fresh.named_parameters())
    still = {n for n, t in params.items() if torch.equal(t, init[n].detach())}
    # the last block's text-stream query and output projections feed only the text tokens it returns, which the
    # model drops: no gradient (to_add_out: none at all; add_q_proj: zero, so its lora_B stays zero)
    last = f"transformer_blocks.{len(base.transformer_blocks) - 1}.attn."
    assert still <= {f"{last}{m}.lora_{ab}.default.weight" for m in ("to_add_out", "add_q_proj") for ab in "AB"}
    # merged into the base model: only the adapted Linear weights change
    merged = copy.deepcopy(base)
    merge_lora(merged, weights)
    changed = {n for n, p in merged.state_dict().items() if not torch.equal(p, base.state_dict()[n])}
    assert changed and changed <= {f"{module}.weight" for module in weights.layers}


# ------------------------------------------------------------------------------------------------ (d)
def two_rank_job(features_dir, out_dir):
    """On each of 2 gloo ranks: the "whole" run of ``runs``, FSDP2-sharded, each rank one clip of every batch."""
    torch.set_num_threads(1)
    result = train(features_dir, output_dir=out_dir, steps=4, **RUN)
    return [r["loss"] for r in result.records]


def test_two_rank_fsdp_equals_one_process(runs, features_dir, tmp_path):
    from hyv_lib.models.lora import read_lora
    from hyv_lib.parallel.distributed import run_distributed
    from hyv_lib.training.checkpoint import load_checkpoint

    root, whole, _, _ = runs
    sharded = run_distributed(two_rank_job, 2, features_dir, str(tmp_path / "fsdp"), timeout=240)
    losses = [r["loss"] for r in whole.records]
    print(f"losses, 1 process {losses}; 2 FSDP2 ranks {sharded}")
    assert np.allclose(sharded, losses, rtol=1e-5, atol=0)  # measured 7e-8 relative
    a, b = read_lora(str(root / "whole")), read_lora(str(tmp_path / "fsdp"))
    worst = max(max((a.layers[n].up - b.layers[n].up).abs().max().item(),
                    (a.layers[n].down - b.layers[n].down).abs().max().item()) for n in a.layers)
    print(f"worst LoRA weight difference {worst:.1e}")
    assert worst < 1e-6  # measured 3e-8
    state_a, _ = load_checkpoint(str(root / "whole" / "checkpoint.safetensors"))
    state_b, info = load_checkpoint(str(tmp_path / "fsdp" / "checkpoint.safetensors"))
    assert info["step"] == 4 and info["settings"]["ranks"] == 2
    for name, tensor in state_a["step"]["optimizer"]["state"].items():
        assert torch.allclose(tensor["exp_avg"], state_b["step"]["optimizer"]["state"][name]["exp_avg"],
                              rtol=1e-4, atol=1e-9)


# ------------------------------------------------------------------------------------------------ (e)
def cli(argv, capsys):
    from hyv_lib.cli.commands import run

    code = run(argv)
    return code, capsys.readouterr().err


@pytest.mark.parametrize("extra, flag", [
    (["--full", "--lora_rank", "4"], "not allowed with argument"),  # argparse's mutually exclusive group
    ([], "--lora_rank"),
    (["--lora_rank", "0"], "--lora_rank"),
    (["--lora_rank", "4", "--steps", "0"], "--steps"),
    (["--lora_rank", "4", "--learning_rate", "-1"], "--learning_rate"),
    (["--lora_rank", "4", "--learning_rate", "nan"], "--learning_rate"),
    (["--lora_rank", "4", "--batch_size", "0"], "--batch_size"),
    (["--lora_rank", "4", "--caption_dropout", "1.5"], "--caption_dropout"),
    (["--lora_rank", "4", "--lr_schedule", "cosine_with_restarts"], "--lr_schedule"),
    (["--lora_rank", "4", "--task", "v2v"], "--task"),
    (["--lora_rank", "4", "--runtime", "cuda"], "--runtime"),
    (["--lora_rank", "4", "--mesh", "data=2"], "--mesh"),
    (["--full", "--lora_alpha", "8"], "--lora_alpha"),
    (["--lora_rank", "4", "--attention", "dense"], "--attention"),
    (["--lora_rank", "4", "--runtime", "jax", "--attention", "diffusers"], "--attention"),
    (["--lora_rank", "4", "--preset", "tiny_trained"], "--features"),  # extracted for another preset
])
def test_cli_errors(extra, flag, features_dir, tmp_path, capsys):
    argv = ["train", "--features", features_dir, "--preset", "tiny", "--output_dir", str(tmp_path / "out"),
            "--quiet"]
    if "--steps" not in extra:
        argv += ["--steps", "2"]
    try:
        code, err = cli(argv + extra, capsys)
    except SystemExit as exit_:  # argparse's own errors
        code, err = exit_.code, capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error:") or "error:" in line]
    print(err.strip().splitlines()[-1])
    assert code == 2 and len(lines) == 1 and flag in lines[0]
    assert not os.path.exists(tmp_path / "out" / "checkpoint.safetensors")


def test_cli_full_run_lock_and_other_settings(features_dir, tmp_path, capsys):
    """--full writes a diffusers transformer folder that loads; a held folder and other settings are one error."""
    from diffusers import HunyuanVideo15Transformer3DModel

    from hyv_lib.base.lock import folder_lock

    out = str(tmp_path / "full")
    argv = ["train", "--features", features_dir, "--preset", "tiny", "--full", "--steps", "1", "--output_dir", out,
            "--quiet", "--learning_rate", "1e-4"]
    code, err = cli(argv, capsys)
    assert code == 0, err
    model = HunyuanVideo15Transformer3DModel.from_pretrained(os.path.join(out, "transformer"))
    base = build_tiny_components(TINY, names=["transformer"])["transformer"]
    assert any(not torch.equal(p, base.state_dict()[n]) for n, p in model.state_dict().items())
    assert not [n for n in os.listdir(out) if n.startswith(".")]  # no temporary folder or lock file left
    code, err = cli(argv[:-1] + ["2e-4", "--steps", "2"], capsys)  # another learning rate in the same folder
    assert code == 2 and "learning_rate" in err and err.startswith("error: --output_dir")
    held, done = threading.Event(), threading.Event()

    def hold():  # another thread of this process is another run (base.lock)
        with folder_lock(out):
            held.set()
            done.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        held.wait(30)
        code, err = cli(argv, capsys)
    finally:
        done.set()
        holder.join()
    assert code == 2 and "in use" in err and len(err.strip().splitlines()) == 1


def test_features_of_another_model_are_refused(features_dir, tmp_path):
    from hyv_lib.training.feature_set import FeatureSet

    features = FeatureSet(features_dir)
    features.metadata = {**features.metadata, "model_config_digest": "0" * 64}  # as if another VAE made them
    with pytest.raises(HyvInputError, match="another model") as info:
        train(features, output_dir=str(tmp_path / "out"), steps=1, **RUN)
    assert info.value.argument == "features"
    assert not os.path.exists(tmp_path / "out" / "checkpoint.safetensors")

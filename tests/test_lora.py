"""LoRA files: merged weights equal peft's unmerged adapter, diffusers loads our files, --lora on every runtime."""

import copy
import hashlib
import json
import os
import re

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from tiny_inputs import forward_kwargs

from hyv_lib.base.errors import HyvInputError
from hyv_lib.models.families import get_preset
from hyv_lib.cli.commands import run
from hyv_lib.models import lora
from hyv_lib.models.components import build_tiny_components

TINY = get_preset("tiny")
RANK, ALPHA = 4, 8.0  # alpha != rank: a scaling of 2 that a loader ignoring alpha would get wrong
STEPS = ["--num_inference_steps", "3", "--video_length", "5", "--quiet"]


def random_adapter(transformer, seed=0, std=0.3):
    """Give the attached adapter random non-zero A and B (B starts at zero: the adapter would do nothing)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in transformer.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=g) * std)


@pytest.fixture(scope="module")
def base():
    """The tiny transformer (seed 0, fp32): what ``--preset tiny`` loads."""
    return build_tiny_components(TINY, names=["transformer"])["transformer"].float().eval()


@pytest.fixture(scope="module")
def adapted(base, tmp_path_factory):
    """(base + an attached random LoRA, the file save_lora wrote for it)."""
    model = copy.deepcopy(base)
    lora.add_lora(model, RANK, alpha=ALPHA)
    random_adapter(model)
    path = lora.save_lora(model, str(tmp_path_factory.mktemp("lora") / "out"), metadata={"steps": 7})
    return model, path


@torch.no_grad()
def test_merge_equals_the_unmerged_peft_adapter_at_each_scale(base, adapted):
    """merge_lora(scale s) vs peft's unmerged forward with the adapter's scale set to s (diffusers' set_adapters):
    fp32, real padding. Measured: 3.6e-7 (outputs up to ~2, the LoRA moving them by 0.5-1.3); tolerance 1.5e-6."""
    model, path = adapted
    kwargs = forward_kwargs()
    plain = base(**kwargs).sample
    for scale in (1.0, 0.5, -0.7):
        model.set_adapters("default", weights=scale)
        truth = model(**kwargs).sample
        merged = copy.deepcopy(base)
        lora.merge_lora(merged, path, scale)
        out = merged(**kwargs).sample
        assert (truth - plain).abs().max() > 0.2 * abs(scale)  # the LoRA does change the output
        assert (out - truth).abs().max() <= 1.5e-6, scale
    model.set_adapters("default", weights=1.0)
    weights = lora.read_lora(path)
    assert weights.rank == RANK and weights.metadata["steps"] == 7
    assert all(layer.scaling == ALPHA / RANK for layer in weights.layers.values())
    assert len(weights.layers) == 8 * TINY.transformer["num_layers"]  # q/k/v/out of both streams, each block


@torch.no_grad()
def test_our_file_is_diffusers_lora_format(base, adapted):
    """The keys are what diffusers' LoraBaseMixin.pack_weights writes; diffusers' own load_lora_adapter (the file;
    the state dict with the file's metadata, without which diffusers takes alpha = rank) gives our merge's output
    (3.6e-7); a file of diffusers' save_lora_adapter merges too."""
    from diffusers.loaders.lora_base import LoraBaseMixin
    from peft.utils import get_peft_model_state_dict

    model, path = adapted
    ours = load_file(path)
    packed = LoraBaseMixin.pack_weights(get_peft_model_state_dict(model), "transformer")
    assert sorted(ours) == sorted(packed) and all(torch.equal(ours[k], packed[k]) for k in ours)
    kwargs = forward_kwargs(seed=1)
    merged = copy.deepcopy(base)
    lora.merge_lora(merged, path)
    expected = merged(**kwargs).sample
    from_file = copy.deepcopy(base)
    from_file.load_lora_adapter(os.path.dirname(path), weight_name=lora.LORA_FILE, prefix="transformer")
    assert (from_file(**kwargs).sample - expected).abs().max() <= 1.5e-6
    metadata = json.loads(safe_open(path, "pt").metadata()[lora.DIFFUSERS_METADATA_KEY])
    from_dict = copy.deepcopy(base)
    from_dict.load_lora_adapter(ours, prefix="transformer", metadata=metadata)
    assert (from_dict(**kwargs).sample - expected).abs().max() <= 1.5e-6
    # the other direction: diffusers writes (bare keys, its metadata), we read and merge
    folder = os.path.join(os.path.dirname(path), "diffusers_saved")
    model.save_lora_adapter(folder)
    theirs = copy.deepcopy(base)
    lora.merge_lora(theirs, folder)
    assert (theirs(**kwargs).sample - expected).abs().max() <= 1.5e-6


def test_generate_with_lora_on_torch_and_tpu(adapted, tmp_path):
    """generate --lora changes the latents; --lora_scale 0 reproduces the no-LoRA latents exactly; the jax runtime
    (JAX on CPU) with the LoRA equals torch with it (measured 7.4e-6, runtime tolerance 1e-4 as in test_tpu.py);
    generation_config.json records the file, its SHA-256, the scale and the rank."""
    _, path = adapted
    g, out = tmp_path / "g", {}
    assert run(["generate", "--preset", "tiny", "--prompt", "a red ball", "--output_dir", str(g), "--lora",
                os.path.dirname(path), *STEPS]) == 0
    config = json.loads((g / "generation_config.json").read_text())
    with open(path, "rb") as f:
        sha = hashlib.sha256(f.read()).hexdigest()
    assert (config["lora"], config["lora_sha256"], config["lora_scale"], config["lora_rank"]) == (path, sha, 1.0, RANK)
    for name, flags in (("none", []), ("zero", ["--lora", path, "--lora_scale", "0"]),
                        ("jax", ["--lora", path, "--runtime", "jax"])):
        assert run(["stage2", "--input_dir", str(g), "--output_dir", str(tmp_path / name), *flags, *STEPS]) == 0
        out[name] = load_file(str(tmp_path / name / "stage2_latents.safetensors"))["latents"]
    with_lora = load_file(str(g / "stage2_latents.safetensors"))["latents"]
    assert (with_lora - out["none"]).abs().max() > 0.1
    assert torch.equal(out["zero"], out["none"])
    assert (out["jax"] - with_lora).abs().max() <= 1e-4
    rerun = json.loads((tmp_path / "none" / "generation_config.json").read_text())
    assert not any(k.startswith("lora") for k in rerun)  # made from g's folder, without a LoRA: none recorded
    jax_run = json.loads((tmp_path / "jax" / "generation_config.json").read_text())
    assert (jax_run["runtime"], jax_run["lora_sha256"]) == ("jax", sha)


def test_load_pipeline_and_prompts_file_settings(adapted, tmp_path):
    """load_pipeline(lora=) merges once before the step is built and records it; a kept transformer refuses another
    LoRA; the prompts-file settings digest changes with the LoRA's scale."""
    from hyv_lib import load_pipeline
    from hyv_lib.pipeline.batch import BatchRunner

    _, path = adapted
    common = dict(stage2=dict(num_inference_steps=2, video_length=5, quiet=True))
    runners = {scale: BatchRunner("tiny", **{**common, "stage2": {**common["stage2"], "lora": path,
                                                                  "lora_scale": scale}}) for scale in (1.0, 0.5)}
    assert runners[1.0].settings_sha256 != runners[0.5].settings_sha256
    assert runners[0.5].video_settings()["stage2"]["lora_scale"] == 0.5
    pipe = load_pipeline("tiny", lora=path, lora_scale=0.5, progress=False)
    assert pipe.lora_record["lora_scale"] == 0.5 and pipe.lora_record["lora"] == path
    fresh = build_tiny_components(TINY, names=["transformer"])["transformer"]
    name = "transformer_blocks.0.attn.to_q.weight"
    assert not torch.equal(pipe.components["transformer"].state_dict()[name], fresh.state_dict()[name])
    with pytest.raises(HyvInputError, match="already has the LoRA"):
        lora.ensure_merged(pipe.components["transformer"], path, 1.0)
    with pytest.raises(HyvInputError, match="merged into its weights"):
        lora.ensure_merged(pipe.components["transformer"], None)


def test_bad_lora_input_is_one_error_line(adapted, tmp_path, capsys, monkeypatch):
    """A LoRA whose shapes do not fit, for a module the model lacks, for another model class, a missing file, a
    corrupt file and a NaN/Inf scale: exit 2, one ``error:`` line naming the flag and the file, nothing written."""
    _, path = adapted
    bad = {}
    shapes = {k: v for k, v in load_file(path).items()}
    key = "transformer.transformer_blocks.0.attn.to_q.lora_A.weight"
    shapes[key] = torch.zeros(RANK, 48)
    bad["shape"] = (shapes, "is \\[out, in\\] = \\[32, 48\\] in the LoRA but \\[32, 32\\]")
    missing = dict(load_file(path))
    missing["transformer.transformer_blocks.9.attn.to_q.lora_A.weight"] = torch.zeros(RANK, 32)
    missing["transformer.transformer_blocks.9.attn.to_q.lora_B.weight"] = torch.zeros(32, RANK)
    bad["module"] = (missing, "adapts 'transformer_blocks.9.attn.to_q', but HunyuanVideo15Transformer3DModel has no")
    for name, (tensors, _) in bad.items():
        save_file(tensors, str(tmp_path / f"{name}.safetensors"))
    other = dict(safe_open(path, "pt").metadata())
    other[lora.HYV_METADATA_KEY] = json.dumps({**json.loads(other[lora.HYV_METADATA_KEY]), "model_class": "Flux"})
    save_file(load_file(path), str(tmp_path / "class.safetensors"), metadata=other)
    bad["class"] = (None, "was trained for Flux, not HunyuanVideo15Transformer3DModel")
    with open(path, "rb") as f:
        (tmp_path / "corrupt.safetensors").write_bytes(f.read()[:-100])
    bad["corrupt"] = (None, "is not a complete safetensors file")
    bad["nope"] = (None, "does not exist")
    monkeypatch.setenv("HOME", str(tmp_path))
    for name, (_, message) in bad.items():
        out = tmp_path / f"out_{name}"
        code = run(["generate", "--preset", "tiny", "--prompt", "x", "--output_dir", str(out), "--lora",
                    f"~/{name}.safetensors", *STEPS])
        err = capsys.readouterr().err.strip()
        assert code == 2 and len(err.splitlines()) == 1, (name, err)
        assert err.startswith(f"error: --lora: '{tmp_path / name}.safetensors'"), err  # ~ expanded
        assert re.search(message, err), (name, err)
        assert not out.exists(), name  # refused before stage 1 wrote anything
    for scale in ("nan", "inf"):
        assert run(["generate", "--preset", "tiny", "--prompt", "x", "--output_dir", str(tmp_path / "s"), "--lora",
                    path, "--lora_scale", scale, *STEPS]) == 2
        assert capsys.readouterr().err.startswith("error: --lora_scale: must be a finite number")
    with pytest.raises(HyvInputError) as err:  # from Python: the parameter's name
        lora.merge_lora(build_tiny_components(TINY, names=["transformer"])["transformer"],
                        str(tmp_path / "shape.safetensors"), argument="lora")
    assert err.value.argument == "lora"

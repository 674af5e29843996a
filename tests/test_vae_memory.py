"""The VAE decode's memory: the mid-block attention without its S x S mask, the peak-memory model, --vae_memory_gb."""

import json
from pathlib import Path

import pytest
import torch
from diffusers import AutoencoderKLHunyuanVideo15
from diffusers.models.autoencoders.autoencoder_kl_hunyuanvideo15 import HunyuanVideo15AttnBlock

from hyv_lib.base.errors import HyvInputError
from hyv_lib.models.hunyuan_video15.presets import TINY
from hyv_lib.models.families import get_preset
from hyv_lib.models.patches import frame_causal_attention
from hyv_lib.runtimes.vae import decode_latents
from hyv_lib.runtimes.vae_memory import SMALLEST_TILE_PX, VAE_TILE_COPIES, decode_peak_bytes, tile_for_budget

REAL_720P = (1, 32, 31, 45, 80)  # 720p/121f latents
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def real_vae_on_meta():
    with torch.device("meta"):
        return AutoencoderKLHunyuanVideo15(**get_preset("720p_t2v").vae)


@pytest.fixture(scope="module")
def tiny_vae():
    torch.manual_seed(0)
    return AutoencoderKLHunyuanVideo15(**TINY.vae).eval()


def test_frame_causal_attention_equals_diffusers_masked_block():
    """Frame by frame, no [S, S] mask: diffusers' own block (loop-built mask + SDPA) in float64, 4 frames of 3 x 5,
    one sample at a time (diffusers' block fails on batches: hyv_lib.models.patches.batched_vae_attention)."""
    torch.manual_seed(0)
    block = HunyuanVideo15AttnBlock(16).double()
    for p in block.parameters():
        torch.nn.init.normal_(p, std=0.3)
    x = torch.randn(2, 16, 4, 3, 5, dtype=torch.float64)
    with torch.no_grad():
        expected = torch.cat([block(x[i:i + 1]) for i in range(2)])
        ours = frame_causal_attention(block, x)
    assert (ours - expected).abs().max() < 1e-12  # measured 4e-16
    assert not torch.equal(expected, block.proj_out(block.norm(x)) + x)  # the attention moves the output


def test_the_torch_decode_never_builds_the_mask_and_matches_diffusers(tiny_vae, monkeypatch):
    """decode_latents (torch) never calls diffusers' mask builder and decodes what diffusers' own decode does, tiled
    with tile_px and untiled; the VAE's tile settings are left as found."""
    torch.manual_seed(1)
    latents = torch.randn(1, TINY.latent_channels, 2, 8, 8)
    with torch.no_grad():
        tiny_vae.disable_tiling()
        plain = tiny_vae.decode(latents / tiny_vae.config.scaling_factor).sample[0]
        tiny_vae.enable_tiling(tile_sample_min_height=64, tile_sample_min_width=64, tile_latent_min_height=4,
                               tile_latent_min_width=4)
        tiled = tiny_vae.decode(latents / tiny_vae.config.scaling_factor).sample[0]
        tiny_vae.enable_tiling(tile_sample_min_height=256, tile_sample_min_width=256, tile_latent_min_height=16,
                               tile_latent_min_width=16)

    def no_mask(*args, **kwargs):
        raise AssertionError("the S x S mask was built")

    monkeypatch.setattr(HunyuanVideo15AttnBlock, "prepare_causal_attention_mask", staticmethod(no_mask))
    ours_plain = decode_latents(tiny_vae, latents, tiling=False)
    ours_tiled = decode_latents(tiny_vae, latents, tiling=True, tile_px=64)
    to_uint8 = lambda v: ((v.clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8).permute(1, 2, 3, 0)  # noqa: E731
    for ours, theirs in ((ours_plain, plain), (ours_tiled, tiled)):
        assert (ours.int() - to_uint8(theirs).int()).abs().max() <= 1  # a rounding edge at most
    assert not torch.equal(ours_plain, ours_tiled)  # the 64 px tiles were used
    assert tiny_vae.tile_sample_min_height == 256 and tiny_vae.tile_latent_min_width == 16


def test_peak_model_terms_are_the_hand_counted_ones(real_vae_on_meta):
    """720p/121f, bf16: the whole VAE's 1,260,634,115 parameters (the official count); in one piece the decode phase is
    7 + 2/128 copies of the last level's 128 channels x 121 frames x 720 x 1280 px; with 256 px tiles diffusers makes
    4 x 7 = 28 of them (origins 0, 12, 24, 36 x 0, 12, ..., 72 in latents) and the largest phase is a full tile's
    7 + 2/128 copies beside the tiles decoded before it."""
    whole = decode_peak_bytes(real_vae_on_meta, REAL_720P, None, torch.bfloat16)
    assert whole["weights"] == 1_260_634_115 * 2 and whole["tiles"] == 1
    assert whole["decode"] == (VAE_TILE_COPIES + 2 / 128) * 128 * 121 * 720 * 1280 * 2
    tiled = decode_peak_bytes(real_vae_on_meta, REAL_720P, 256, torch.bfloat16)
    full_tile = 121 * 256 * 256 * 2
    assert tiled["tiles"] == 28
    # the last full tile is number 19 (row 2, column 5): before it two rows of 6 full + 1 half tile, and 5 full
    assert tiled["tile_phase"] == (VAE_TILE_COPIES + 2 / 128) * 128 * full_tile + 3 * full_tile * (2 * 6.5 + 5)


def test_peak_model_against_the_h200_measurements(real_vae_on_meta):
    """The model (counted from the code, nothing fitted to these rows) against every VAE row of the H200's run 4:
    tiles of 128-384 px and the 320 px decode --vae_memory_gb 24 chose, each within 2% of the measured peak
    (measured: 0.5-1.0% under it); each --vae_memory_gb decode stayed within its budget."""
    rows = json.loads((ROOT / "benchmarks/results/gpu_check_2026-11-26_H200_run4.json").read_text())
    rows = rows["sections"]["vae"]["rows"]
    assert {r["tile_px"] for r in rows} == {128, 192, 256, 320, 384}
    for row in rows:
        modelled = decode_peak_bytes(real_vae_on_meta, tuple(row["latents"]), row["tile_px"], torch.bfloat16)
        assert abs(modelled["total"] / 2**30 - row["peak_allocated_gib"]) / row["peak_allocated_gib"] < 0.02, row
        if "budget_gib" in row:
            assert row["peak_allocated_gib"] <= row["budget_gib"]


def test_the_largest_tile_that_fits_is_chosen(real_vae_on_meta):
    """Each choice fits its budget and the next 64 px step would not; more memory never means smaller tiles; a
    budget under the smallest tile's need is an error naming --vae_memory_gb with that need."""
    chosen = []
    for budget in (8, 17, 48):
        tile = tile_for_budget(real_vae_on_meta, REAL_720P, budget, torch.bfloat16)
        assert decode_peak_bytes(real_vae_on_meta, REAL_720P, tile, torch.bfloat16)["total"] <= budget * 2**30
        assert decode_peak_bytes(real_vae_on_meta, REAL_720P, tile + 64, torch.bfloat16)["total"] > budget * 2**30
        chosen.append(tile)
    assert chosen == sorted(chosen) and chosen[1] == 256 and chosen[0] >= SMALLEST_TILE_PX
    with pytest.raises(HyvInputError, match=r"too little: the smallest tile \(64 px, all 31 latent frames\) needs"):
        tile_for_budget(real_vae_on_meta, REAL_720P, 2, torch.bfloat16)
    for bad in (0, -1, float("nan"), "8"):
        with pytest.raises(HyvInputError, match="positive number of GiB"):
            tile_for_budget(real_vae_on_meta, REAL_720P, bad, torch.bfloat16)


def test_stage3_decodes_with_the_budgeted_tiles_and_records_them(tiny_run, tmp_path, capsys):
    """stage3 --vae_memory_gb: the tile the model picks is used (the same frames as decode_latents with that tile)
    and recorded; bad combinations are one error line each."""
    import shutil

    from hyv_lib.cli.commands import run as cli
    from hyv_lib.models.components import load_components
    from hyv_lib.pipeline.stage_io import load_stage2
    from hyv_lib.pipeline.stages import stage3

    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    budget = 0.05  # GiB: the tiny VAE needs 0.043 GiB with 64 px tiles, 0.066 GiB in one piece
    frames = stage3(str(run), vae_memory_gb=budget)
    config = json.loads((run / "generation_config.json").read_text())
    vae = load_components(TINY, None, ["vae"])["vae"]
    latents = load_stage2(str(run))
    tile = tile_for_budget(vae, tuple(latents.shape), budget, torch.float32)
    assert config["vae_tile_px"] == tile == 64 and config["vae_memory_gb"] == budget
    assert torch.equal(frames, decode_latents(vae, latents, tile_px=64))
    for flags, message in ((["--vae_memory_gb", "0"], "--vae_memory_gb: must be > 0"),
                           (["--vae_memory_gb", "4", "--disable_tiling"], "drop --disable_tiling"),
                           (["--vae_memory_gb", "4", "--runtime", "jax"], "not of --runtime jax")):
        assert cli(["stage3", "--input_dir", str(run), *flags]) == 2
        assert message in capsys.readouterr().err

"""The training loops behind hyv-tiny: the VAE batch fix, the flow-matching objective, caption dropout."""

import numpy as np
import pytest
import torch

from hyv_lib.models.hunyuan_video15.presets import TINY_TRAINED
from hyv_lib.models.families import get_preset
from hyv_lib.tiny import data, train


def test_noise_levels_follow_the_schedulers_shift():
    from diffusers import FlowMatchEulerDiscreteScheduler

    shift = 3.0
    scheduler = FlowMatchEulerDiscreteScheduler(shift=shift)
    u = np.linspace(1.0, 0.0, 9)[:-1]
    scheduler.set_timesteps(sigmas=u)
    warped = shift * torch.tensor(u) / (1 + (shift - 1) * torch.tensor(u))
    torch.testing.assert_close(scheduler.sigmas[:-1].double(), warped, rtol=1e-6, atol=1e-6)
    sigmas = train.flow_matching_sigmas(10_000, shift, torch.Generator().manual_seed(0))
    assert 0 <= sigmas.min() and sigmas.max() <= 1
    assert (sigmas > 0.5).float().mean() > 0.7  # shift 3 puts 3/4 of the mass above sigma = 0.5


def test_flow_matching_loss_is_zero_for_the_true_velocity():
    x0 = torch.randn(2, 4, 2, 3, 3)

    class Oracle(torch.nn.Module):  # knows x0, so it can return noise - x0 exactly from x_sigma
        def forward(self, hidden_states, timestep, **_):
            sigma = (timestep / 1000).view(-1, 1, 1, 1, 1)
            noisy = hidden_states[:, :4]
            noise = (noisy - (1 - sigma) * x0) / sigma
            return (noise - x0,)

    loss = train.dit_loss(Oracle(), x0, {}, shift=3.0, generator=torch.Generator().manual_seed(0))
    assert loss.item() < 1e-8


def test_caption_dropout_swaps_in_the_empty_prompt():
    embeds = {"prompt_embeds": torch.ones(3, 5, 2), "prompt_embeds_mask": torch.ones(3, 5, dtype=torch.long),
              "prompt_embeds_2": torch.ones(3, 4, 2), "prompt_embeds_mask_2": torch.ones(3, 4, dtype=torch.long)}
    negative = {k: torch.zeros_like(v[:1]) for k, v in embeds.items()}
    out = train.select_conditioning(embeds, negative, torch.tensor([0, 2]), torch.tensor([False, True]), 4, 6)
    assert out["encoder_hidden_states"][0].eq(1).all() and out["encoder_hidden_states"][1].eq(0).all()
    assert out["encoder_attention_mask"][1].eq(0).all() and out["image_embeds"].shape == (2, 4, 6)


def test_vae_trains_on_batches_and_the_patch_is_undone():
    from diffusers import AutoencoderKLHunyuanVideo15
    from diffusers.models.autoencoders.autoencoder_kl_hunyuanvideo15 import HunyuanVideo15AttnBlock

    original = HunyuanVideo15AttnBlock.prepare_causal_attention_mask
    torch.manual_seed(0)
    vae = AutoencoderKLHunyuanVideo15(**get_preset("tiny").vae)
    clips = torch.from_numpy(np.stack([data.render_clip(c, seed=0) for c in data.all_combos()[:2]]))
    with pytest.raises(RuntimeError, match="broadcast"):  # the diffusers bug the context manager works around
        vae.encode(clips)
    rng = torch.get_rng_state()
    records = train.train_vae(vae, data.all_combos()[:4], steps=4, batch_size=2, lr=1e-3, eval_clips=clips,
                              eval_every=4, progress=False)
    assert torch.equal(torch.get_rng_state(), rng)  # it seeds its own run; the caller's RNG is left as found
    assert [r["step"] for r in records] == [1, 2, 3, 4] and "psnr_held_out" in records[-1]
    assert all(np.isfinite(r["loss"]) and r["latent_abs"] > 0 for r in records)
    with pytest.raises(ValueError, match="exactly one"):
        train.train_vae(vae, data.all_combos()[:4], steps=1, fixed_clips=clips)
    fixed = train.train_vae(vae, None, steps=2, fixed_clips=clips[:1], progress=False)
    assert len(fixed) == 2 and fixed[1]["psnr_train"] > 0
    logged = []  # an image stage (1-frame clips) names its records and its kept-weights record
    images = train.train_vae(vae, data.all_combos()[:4], steps=2, batch_size=2, clip_size=(1, 32, 32),
                             eval_clips=clips[:, :, :1], eval_every=1, stage="vae_image", log=logged.append,
                             progress=False)
    assert {r["stage"] for r in images} == {"vae_image"} and logged[-1]["stage"] == "vae_image_kept"
    assert HunyuanVideo15AttnBlock.prepare_causal_attention_mask is original or \
        HunyuanVideo15AttnBlock.__dict__["prepare_causal_attention_mask"].__func__ is original
    assert not vae.training and not any(p.requires_grad for p in vae.parameters())


def test_dit_overfits_a_small_set_and_lora_trains_only_the_adapter():
    from diffusers import HunyuanVideo15Transformer3DModel
    from peft import LoraConfig

    preset = TINY_TRAINED
    torch.manual_seed(0)
    model = HunyuanVideo15Transformer3DModel(**preset.transformer)
    latents = torch.randn(4, preset.latent_channels, 3, 4, 7)
    embeds = {"prompt_embeds": torch.randn(2, preset.text_len, preset.text_dim),
              "prompt_embeds_mask": (torch.arange(preset.text_len) < 40).long().expand(2, -1).clone(),
              "prompt_embeds_2": torch.zeros(2, preset.byt5_len, preset.byt5_dim),
              "prompt_embeds_mask_2": torch.zeros(2, preset.byt5_len, dtype=torch.long)}
    negative = {k: v[:1].clone() for k, v in embeds.items()}
    kwargs = dict(shift=preset.flow_shift, image_tokens=preset.image_tokens, image_dim=preset.image_dim,
                  batch_size=4, progress=False)
    records = train.train_dit(model, latents, torch.tensor([0, 1, 0, 1]), embeds, negative, steps=30, lr=2e-3,
                              **kwargs)
    first, last = np.mean([r["loss"] for r in records[:5]]), np.mean([r["loss"] for r in records[-5:]])
    assert last < 0.8 * first
    before = {n: p.clone() for n, p in model.named_parameters()}
    model.add_adapter(LoraConfig(r=2, lora_alpha=2, target_modules=["to_q", "to_v"]))
    adapter = [p for n, p in model.named_parameters() if "lora_" in n]
    train.train_dit(model, latents, torch.tensor([0, 1, 0, 1]), embeds, negative, steps=3, lr=1e-2,
                    parameters=adapter, stage="lora", **kwargs)
    for name, p in model.named_parameters():
        if "lora_" not in name:
            torch.testing.assert_close(p, before[name.replace(".base_layer", "")], rtol=0, atol=0)


def test_spike_guard_skips_only_outlier_updates():
    param = torch.nn.Parameter(torch.zeros(3))
    optimizer = torch.optim.SGD([param], lr=0.1)
    guard = train.SpikeGuard(factor=5.0, after_steps=3)
    taken = []
    for scale in (1, 1, 1, 1, 100, 1, 100, 100, 100, 100):
        param.grad = torch.full((3,), 0.1 * scale)
        before = param.detach().clone()
        _, skipped = guard.step(optimizer, [param])
        taken.append(not skipped and not torch.equal(before, param.detach()))
    # one spike is skipped; a lasting rise is followed after 3 skips in a row
    assert taken == [True, True, True, True, False, True, False, False, False, True]


def test_missing_bundled_weights_name_the_preset():
    import dataclasses

    from hyv_lib.base.errors import HyvInputError
    from hyv_lib.models.components import load_components

    broken = dataclasses.replace(TINY_TRAINED, bundled_weights="no-such-folder")
    with pytest.raises(HyvInputError, match="bundled weights are missing") as err:
        load_components(broken, None, ["vae"])
    assert err.value.argument == "preset"


def test_zero_init_starts_the_vae_as_its_shortcut_path_and_the_latent_penalty_counts():
    from diffusers import AutoencoderKLHunyuanVideo15

    torch.manual_seed(0)
    vae = AutoencoderKLHunyuanVideo15(**get_preset("tiny").vae)
    train.zero_init_residual_branches(vae)
    zeroed = [n for n, p in vae.named_parameters() if p.abs().max() == 0]
    resnets = [n for n, _ in vae.named_modules() if n.endswith("resnets.0")]
    assert all(f"{r}.conv2.conv.weight" in zeroed for r in resnets) and resnets
    assert any("downsamplers.0.conv.conv.weight" in n for n in zeroed)
    assert any("upsamplers.0.conv.conv.weight" in n for n in zeroed)
    assert any("attentions.0.proj_out.weight" in n for n in zeroed)
    assert not any("conv1" in n or "conv_in" in n or "conv_out" in n for n in zeroed)  # the paths stay alive
    clips = torch.from_numpy(np.stack([data.render_clip(data.all_combos()[0], seed=0)]))
    with torch.no_grad():
        loss_0, reconstruction, latents = train.vae_loss(vae, clips, latent_weight=0.0)
        loss_1, _, _ = train.vae_loss(vae, clips, latent_weight=1.0)
        latent_mean = vae.encode(clips).latent_dist.mean
    torch.testing.assert_close(latents, latent_mean, rtol=0, atol=0)
    torch.testing.assert_close(loss_0, (reconstruction - clips).pow(2).mean())
    torch.testing.assert_close(loss_1 - loss_0, latent_mean.pow(2).mean(), rtol=1e-4, atol=1e-6)


def test_foreground_weights_cover_the_shape_and_its_edge_only():
    combo = data.Combo("green", "square", "right", "purple")
    clip = torch.from_numpy(data.render_clip(combo, seed=2))[None]
    weights = train.foreground_weights(clip, 9.0)
    assert weights.shape == (1, 1, data.FRAMES, data.HEIGHT, data.WIDTH)
    assert set(weights.unique().tolist()) == {1.0, 10.0}
    background = torch.tensor(data.BACKGROUNDS["purple"]).view(1, 3, 1, 1, 1) * 2 - 1
    on_shape = (clip - background).abs().sum(dim=1, keepdim=True) > 0.1
    assert (weights[on_shape] == 10).all()  # every shape pixel, and a 2-px ring around it
    assert 0.02 < (weights == 10).float().mean() < 0.25
    assert (weights[..., :2, :] == 1).all() or (weights[..., -2:, :] == 1).all()  # some border stays background


def test_foreground_weighted_vae_loss_is_the_weighted_mean_of_squared_errors():
    from diffusers import AutoencoderKLHunyuanVideo15

    torch.manual_seed(0)
    vae = AutoencoderKLHunyuanVideo15(**get_preset("tiny").vae)
    clips = torch.from_numpy(np.stack([data.render_clip(data.all_combos()[7], seed=1)]))
    with torch.no_grad():
        plain, reconstruction, _ = train.vae_loss(vae, clips, latent_weight=0.0)
        weighted, _, _ = train.vae_loss(vae, clips, latent_weight=0.0, foreground_weight=9.0)
        weights = train.foreground_weights(clips, 9.0)
    expected = (weights * (reconstruction - clips).pow(2)).sum() / weights.expand_as(clips).sum()
    torch.testing.assert_close(weighted, expected)
    assert weighted != plain  # the error of a random VAE is not uniform


def test_rms_norm_floor_matches_diffusers_above_the_floor_and_is_undone():
    from diffusers.models.autoencoders.autoencoder_kl_hunyuanvideo15 import HunyuanVideo15RMS_norm

    norm = HunyuanVideo15RMS_norm(4, images=False)
    x = torch.randn(2, 4, 3, 5, 5)
    x[0, :, 0, 0, 0] = 1e-3  # one pixel with a tiny channel vector
    plain = norm(x)
    original = HunyuanVideo15RMS_norm.forward
    with train.rms_norm_floor(0.3):
        floored = norm(x)
    assert HunyuanVideo15RMS_norm.forward is original
    big = x.norm(dim=1, keepdim=True).expand_as(x) >= 0.3
    torch.testing.assert_close(floored[big], plain[big], rtol=0, atol=0)
    assert floored[0, :, 0, 0, 0].abs().max() < 0.1 < plain[0, :, 0, 0, 0].abs().max()  # shrunk, not blown up


def test_decoder_only_vae_training_keeps_the_encoder_and_so_the_latents():
    from diffusers import AutoencoderKLHunyuanVideo15

    torch.manual_seed(0)
    vae = AutoencoderKLHunyuanVideo15(**get_preset("tiny").vae)
    encoder = {k: v.clone() for k, v in vae.encoder.state_dict().items()}
    decoder = {k: v.clone() for k, v in vae.decoder.state_dict().items()}
    records = train.train_vae(vae, data.all_combos()[:4], steps=2, batch_size=2, lr=1e-3, decoder_only=True,
                              keep_best=False, progress=False, stage="vae_decoder")
    assert [r["stage"] for r in records] == ["vae_decoder"] * 2
    for k, v in vae.encoder.state_dict().items():
        torch.testing.assert_close(v, encoder[k], rtol=0, atol=0, msg=k)
    assert any(not torch.equal(v, decoder[k]) for k, v in vae.decoder.state_dict().items())


def test_concatenated_latent_datasets_keep_each_clip_with_its_caption():
    def part(n_captions, clips_per_caption, value):
        embeds = {"prompt_embeds": torch.full((n_captions, 2, 3), value) + torch.arange(n_captions)[:, None, None],
                  "prompt_embeds_mask": torch.ones(n_captions, 2, dtype=torch.long)}
        return {"latents": torch.full((n_captions * clips_per_caption, 1), value),
                "caption_index": torch.arange(n_captions).repeat_interleave(clips_per_caption),
                "embeds": embeds, "negative": {k: v[:1] for k, v in embeds.items()}}

    a, b = part(2, 3, 0.0), part(4, 1, 100.0)
    joined = train.concat_latent_datasets(a, b)
    assert len(joined["latents"]) == 10 and joined["embeds"]["prompt_embeds"].shape == (6, 2, 3)
    for source, rows in ((a, range(0, 6)), (b, range(6, 10))):
        for i, j in enumerate(rows):
            torch.testing.assert_close(joined["embeds"]["prompt_embeds"][joined["caption_index"][j]],
                                       source["embeds"]["prompt_embeds"][source["caption_index"][i]])
    assert joined["negative"] is a["negative"]
    with pytest.raises(ValueError, match="datasets"):
        train.concat_latent_datasets()

"""Train the tiny VAE and DiT on the procedural clips: the loops behind the hyv-tiny weights and chapter 7."""

from __future__ import annotations

import contextlib
import json
import math
import time
from typing import Any, Callable

import numpy as np
import torch
from tqdm.auto import tqdm

from ..models.flow_matching import NUM_TRAIN_TIMESTEPS, flow_matching_loss, sample_sigmas, training_inputs
from ..models.patches import batched_vae_attention, rms_norm_floor
from ..pipeline.image import crop_to_bucket, encode_image
from ..pipeline.text import encode_prompts
from ..runtimes.vae import to_uint8_frames
from . import data
from .quality import psnr


def cosine_lr(step: int, total: int, peak: float, warmup: int) -> float:
    """Linear warmup, then cosine decay to 5% of the peak."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return peak * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * progress)))


class SpikeGuard:
    """Clip gradients to norm 1 and skip an update whose norm spikes above 5x the running mean (at most 3 in a
    row, so a lasting change of scale is followed, not ignored)."""

    def __init__(self, factor: float = 5.0, after_steps: int = 20, max_skips: int = 3):
        self.factor, self.after_steps, self.max_skips = factor, after_steps, max_skips
        self.steps, self.typical, self.skips_in_a_row = 0, 0.0, 0

    def step(self, optimizer, parameters) -> tuple[float, bool]:
        """Clip, then step ``optimizer`` unless the norm spiked; returns (gradient norm, skipped)."""
        norm = torch.nn.utils.clip_grad_norm_(list(parameters), 1.0).item()
        skipped = (self.steps >= self.after_steps and norm > self.factor * self.typical
                   and self.skips_in_a_row < self.max_skips)
        self.skips_in_a_row = self.skips_in_a_row + 1 if skipped else 0
        if not skipped:
            optimizer.step()
            self.typical = norm if self.steps == 0 else 0.95 * self.typical + 0.05 * norm
        self.steps += 1
        return norm, skipped


class ClipStream:
    """An endless, seeded stream of training batches rendered on the fly from the training captions.

    ``size`` = (frames, height, width) of the clips: 1 frame for images; clips of the size the model is used at
    for anything temporal (see ``train_vae``).
    """

    def __init__(self, combos: list[data.Combo], batch_size: int, seed: int = 0,
                 size: tuple[int, int, int] = (data.FRAMES, data.HEIGHT, data.WIDTH)):
        self.combos, self.batch_size, self.size = combos, batch_size, size
        self.rng = np.random.default_rng(seed)

    def next(self) -> tuple[torch.Tensor, list[str]]:
        picks = self.rng.integers(len(self.combos), size=self.batch_size)
        seeds = self.rng.integers(2**31, size=self.batch_size)
        frames, height, width = self.size
        clips = [data.render_clip(self.combos[i], seed=int(s), height=height, width=width, frames=frames)
                 for i, s in zip(picks, seeds)]
        return torch.from_numpy(np.stack(clips)), [self.combos[i].caption for i in picks]


def zero_init_residual_branches(vae) -> None:
    """Zero the last layer of every residual branch of a fresh VAE, so it starts as its DC-AE shortcut path.

    The branches are each ResNet block's conv2, the down/up-sampler convs (added to their space-to-channel
    shortcuts) and the mid-block attention's output projection. The zero-gamma / Fixup idea (Goyal et al. 2017,
    Zhang et al. 2019): with diffusers' default init our small VAE collapsed within ~20 steps to the clip's
    mean colour and never left it (16.7 dB on 8 fixed clips); from this init, with ``vae_loss``'s latent penalty,
    the same clips reached 22.8 dB in 200 steps.
    """
    for name, module in vae.named_modules():
        if name.endswith(("conv2", "downsamplers.0.conv", "upsamplers.0.conv", "attentions.0.proj_out")):
            for parameter in module.parameters():
                torch.nn.init.zeros_(parameter)


def foreground_weights(clips: torch.Tensor, weight: float) -> torch.Tensor:
    """Per-pixel loss weights [B, 1, F, H, W]: 1 + ``weight`` on and within 2 px of the shape, 1 elsewhere.

    The background colour of a frame is the median of its border pixels; a pixel more than 0.1 (summed over
    RGB, on the [-1, 1] scale) away from it is foreground. The shape covers ~5-10% of a frame, so plain MSE
    is dominated by the easy background: our VAE learned to paint a blurred, desaturated blob (22.6 dB on
    held-out images after 300 steps) and with ``weight`` 9 reached 26.5 dB in the same 300 steps.
    Same border-median idea as ``quality.read_video``, but per frame, batched in torch and with a far lower
    threshold: the reader must ignore generation noise, this mask must catch the shape's soft edge.
    """
    border = torch.cat([clips[..., 0, :], clips[..., -1, :], clips[..., :, 0], clips[..., :, -1]], dim=-1)
    background = border.median(dim=-1).values[..., None, None]  # [B, 3, F, 1, 1]
    shape = ((clips - background).abs().sum(dim=1, keepdim=True) > 0.1).float()
    shape = torch.nn.functional.max_pool3d(shape, kernel_size=(1, 5, 5), stride=1, padding=(0, 2, 2))
    return 1 + weight * shape


def vae_loss(vae, clips: torch.Tensor, latent_weight: float,
             foreground_weight: float = 0.0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(loss, reconstruction, latents): pixel MSE of the decoded posterior mean + ``latent_weight`` x mean(mean^2).

    With ``foreground_weight`` > 0 the MSE is weighted by :func:`foreground_weights` (normalised by their
    mean, so the loss stays on the MSE's scale). The latent penalty is what keeps training alive: without it
    the encoder grew a huge, spatially constant offset in the latents (mean absolute value ~180 after 40
    steps), the decoder's RMS norms then saw the same direction at every pixel and the output froze at the
    mean colour. (A KL at weight 1e-4 was too weak to stop it, and decoding samples instead of means
    plateaued the same way.) The DiT is trained on, and generates, means.
    """
    posterior = vae.encode(clips).latent_dist
    latents = posterior.mode()
    reconstruction = vae.decode(latents).sample
    squared_error = (reconstruction - clips).pow(2)
    if foreground_weight:
        weights = foreground_weights(clips, foreground_weight)
        mse = (weights * squared_error).mean() / weights.mean()
    else:
        mse = squared_error.mean()
    return mse + latent_weight * latents.pow(2).mean(), reconstruction, latents


def reconstruct(vae, clips: torch.Tensor, batch_size: int = 4) -> torch.Tensor:
    """encode -> posterior mode -> decode of ``clips`` in batches, clamped to [-1, 1] (no gradients)."""
    with torch.no_grad(), batched_vae_attention():
        return torch.cat([vae.decode(vae.encode(clips[i : i + batch_size]).latent_dist.mode()).sample.clamp(-1, 1)
                          for i in range(0, len(clips), batch_size)])


def evaluate_vae(vae, clips: torch.Tensor, batch_size: int = 4) -> float:
    """Mean over batches of the PSNR (dB) between ``clips`` and what ``reconstruct`` returns for them."""
    reconstruction = reconstruct(vae, clips, batch_size)
    return float(np.mean([psnr(reconstruction[i : i + batch_size], clips[i : i + batch_size], peak=2.0)
                          for i in range(0, len(clips), batch_size)]))


@torch.random.fork_rng(devices=[])  # seeds its own run; the caller's global RNG is restored afterwards
def train_vae(
    vae, combos: list[data.Combo] | None, *, steps: int, batch_size: int = 8, lr: float = 3e-4,
    latent_weight: float = 1e-2,
    eval_clips: torch.Tensor | None = None, eval_every: int = 100, seed: int = 0,
    log: Callable[[dict[str, Any]], None] | None = None, progress: bool = True,
    clip_size: tuple[int, int, int] = (data.FRAMES, data.HEIGHT, data.WIDTH), norm_floor: float | None = None, weight_decay: float = 0.05,
    keep_best: bool = True, fixed_clips: torch.Tensor | None = None, foreground_weight: float = 9.0,
    stage: str = "vae", decoder_only: bool = False,
) -> list[dict[str, Any]]:
    """Train ``vae`` in place with AdamW on fresh clips each step; returns the log records.

    Training clips are ``clip_size`` = (frames, height, width), by default the size the model is used at:
    5-frame clips were cheaper but did not transfer to 9 frames (the third latent frame's causal context is
    never seen); (1, H, W) trains on images. ``eval_clips`` can be any size. With ``keep_best`` (and ``eval_clips``) the
    weights of the best held-out evaluation are restored at the end: our runs peaked and then lost PSNR to
    loss spikes, so the last step is not the best one. ``fixed_clips`` trains on those clips every step instead
    of fresh ones from ``combos``: the quick probe of whether a recipe can fit anything at all.
    ``foreground_weight``: see :func:`foreground_weights` (0 is plain MSE). ``stage`` names the records and the
    progress bar (e.g. "vae_image" for a stage on 1-frame clips). ``decoder_only`` freezes the encoder, so the
    latents (and a DiT trained on them) stay valid while the decoder improves."""
    if (combos is None) == (fixed_clips is None):
        raise ValueError("pass exactly one of combos (fresh clips each step) and fixed_clips")
    torch.manual_seed(seed)
    stream = ClipStream(combos, batch_size, seed=seed, size=clip_size) if fixed_clips is None else None
    # beta2 = 0.95: with the default 0.999 the second moment lags a sudden rise of a gradient and the update
    # of that parameter grows up to ~30x; our VAE runs diverged that way at learning rates of 4e-4 to 2e-3.
    vae.train().requires_grad_(True)
    if decoder_only:
        vae.encoder.requires_grad_(False)
    params = [p for p in vae.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=weight_decay)
    records: list[dict[str, Any]] = []
    best: tuple[float, int, dict[str, torch.Tensor]] | None = None
    start = time.perf_counter()
    guard = SpikeGuard()
    with batched_vae_attention():
        for step in tqdm(range(steps), desc=stage.upper(), disable=not progress):
            for group in optimizer.param_groups:
                group["lr"] = cosine_lr(step, steps, lr, warmup=min(50, steps // 10 + 1))
            clips = fixed_clips if stream is None else stream.next()[0]
            with rms_norm_floor(norm_floor) if norm_floor else contextlib.nullcontext():  # not while evaluating
                loss, reconstruction, latents = vae_loss(vae, clips, latent_weight, foreground_weight)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            grad_norm, skipped = guard.step(optimizer, params)
            record = {"stage": stage, "step": step + 1, "loss": loss.item(), "grad_norm": grad_norm, "skipped": skipped,
                      "psnr_train": psnr(reconstruction.detach().clamp(-1, 1), clips, peak=2.0),
                      "latent_abs": latents.detach().abs().mean().item(), "seconds": time.perf_counter() - start}
            if eval_clips is not None and ((step + 1) % eval_every == 0 or step + 1 == steps):
                vae.eval()
                record["psnr_held_out"] = evaluate_vae(vae, eval_clips)
                vae.train()
                if keep_best and (best is None or record["psnr_held_out"] > best[0]):
                    best = (record["psnr_held_out"], step + 1,
                            {k: v.detach().clone() for k, v in vae.state_dict().items()})
            records.append(record)
            if log is not None:
                log(record)
    if best is not None:
        vae.load_state_dict(best[2])
        if log is not None:
            log({"stage": f"{stage}_kept", "step": best[1], "psnr_held_out": best[0]})
    vae.eval().requires_grad_(False)
    return records


def jsonl_logger(path: str) -> Callable[[dict[str, Any]], None]:
    """A ``log`` callback appending one JSON record per line (flushed, so a crash keeps the curve)."""

    def log(record: dict[str, Any]) -> None:
        with open(path, "a") as f:
            f.write(json.dumps(record) + "\n")

    return log


def flow_matching_sigmas(batch_size: int, shift: float, generator: torch.Generator | None = None) -> torch.Tensor:
    """Training noise levels: u ~ U(0, 1) warped by the scheduler's shift, sigma = s*u / (1 + (s-1)*u).

    The same warp the FlowMatchEulerDiscreteScheduler applies at inference, so training sees noise
    levels as often as sampling visits them (high noise, where layout and color are decided, most).
    (:func:`hyv_lib.models.flow_matching.sample_sigmas` with ``sampling="uniform"``; the official trainer's
    default is logit-normal, which hyv-tiny was not trained with.)
    """
    return sample_sigmas(batch_size, shift=shift, sampling="uniform", generator=generator)


def dit_loss(transformer, x0: torch.Tensor, conditioning: dict[str, torch.Tensor], shift: float,
             generator: torch.Generator | None = None, cond_latents: torch.Tensor | None = None) -> torch.Tensor:
    """Flow-matching loss: x_t = (1 - sigma) x0 + sigma * noise, target velocity noise - x0 (the
    scheduler's Euler step x += (sigma_next - sigma) * v then walks back towards x0). The input is the noisy
    latents, then the condition latents and a mask channel, as the pipeline builds them: zeros for t2v; with
    ``cond_latents`` [B, C, 1, h, w] (i2v) the first frame's latents in latent frame 0 and the mask 1 there
    (:func:`hyv_lib.models.flow_matching.training_inputs`). Draws the noise, then the noise levels."""
    noise = torch.randn(x0.shape, generator=generator)
    sigma = flow_matching_sigmas(len(x0), shift, generator)
    hidden, target = training_inputs(x0, noise, sigma, cond_latents)
    prediction = transformer(hidden_states=hidden, timestep=sigma * NUM_TRAIN_TIMESTEPS, **conditioning,
                             return_dict=False)[0]
    return flow_matching_loss(prediction, target)


def select_conditioning(embeds: dict[str, torch.Tensor], negative: dict[str, torch.Tensor], index: torch.Tensor,
                        drop: torch.Tensor, image_tokens: int, image_dim: int) -> dict[str, torch.Tensor]:
    """Forward kwargs for the captions ``index``; where ``drop`` is True the negative (empty) prompt's
    embeddings replace them, which is what classifier-free guidance needs at sampling time."""
    out = {}
    for key, name in (("encoder_hidden_states", "prompt_embeds"), ("encoder_attention_mask", "prompt_embeds_mask"),
                      ("encoder_hidden_states_2", "prompt_embeds_2"),
                      ("encoder_attention_mask_2", "prompt_embeds_mask_2")):
        chosen = embeds[name][index]
        keep = (~drop).view(-1, *([1] * (chosen.dim() - 1)))
        out[key] = torch.where(keep, chosen, negative[name].expand_as(chosen))
    out["image_embeds"] = torch.zeros(len(index), image_tokens, image_dim)
    return out


def encode_latents(vae, clips: torch.Tensor, batch_size: int = 8, progress: bool = True) -> torch.Tensor:
    """Posterior means of ``clips`` (unscaled), [N, C, T, h, w]."""
    out = []
    with torch.no_grad(), batched_vae_attention():
        for i in tqdm(range(0, len(clips), batch_size), desc="encode", disable=not progress):
            out.append(vae.encode(clips[i : i + batch_size]).latent_dist.mode())
    return torch.cat(out)


def train_dit(
    transformer, latents: torch.Tensor, caption_index: torch.Tensor, embeds: dict[str, torch.Tensor],
    negative: dict[str, torch.Tensor], *, steps: int, shift: float, image_tokens: int, image_dim: int,
    batch_size: int = 32, lr: float = 5e-4, drop_prob: float = 0.1, seed: int = 0,
    parameters: list[torch.nn.Parameter] | None = None, log: Callable[[dict[str, Any]], None] | None = None,
    progress: bool = True, stage: str = "dit", first_frames: dict[str, torch.Tensor] | None = None,
    i2v_prob: float = 0.5,
) -> list[dict[str, Any]]:
    """Flow-matching training of ``transformer`` (or only ``parameters`` of it, e.g. LoRA) on scaled latents.

    ``latents`` [N, C, T, h, w] are already multiplied by the VAE's scaling factor; ``caption_index[i]``
    names the row of ``embeds`` (stage-1 tensors of every caption) that describes clip i. ``first_frames``
    (:func:`first_frame_conditions` of the same clips) makes a fraction ``i2v_prob`` of the batches
    image-to-video: each clip conditioned on its own first frame. A batch is all one task because diffusers'
    forward decides t2v for the whole batch (all image embeddings zero) and would otherwise attend to the t2v
    samples' zero image tokens.
    """
    generator = torch.Generator().manual_seed(seed)
    params = list(parameters) if parameters is not None else list(transformer.parameters())
    transformer.train()
    for p in params:
        p.requires_grad_(True)
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.01)
    records: list[dict[str, Any]] = []
    start = time.perf_counter()
    guard = SpikeGuard()
    for step in tqdm(range(steps), desc=stage.upper(), disable=not progress):
        for group in optimizer.param_groups:
            group["lr"] = cosine_lr(step, steps, lr, warmup=min(100, steps // 10 + 1))
        pick = torch.randint(len(latents), (batch_size,), generator=generator)
        drop = torch.rand(batch_size, generator=generator) < drop_prob
        conditioning = select_conditioning(embeds, negative, caption_index[pick], drop, image_tokens, image_dim)
        cond_latents = None
        if first_frames is not None and torch.rand((), generator=generator) < i2v_prob:
            # The caption may be dropped (CFG), the image never: sampling gives both CFG halves the image.
            conditioning["image_embeds"] = first_frames["image_embeds"][pick]
            cond_latents = first_frames["cond_latents"][pick]
        loss = dit_loss(transformer, latents[pick], conditioning, shift, generator, cond_latents)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm, skipped = guard.step(optimizer, params)
        record = {"stage": stage, "step": step + 1, "loss": loss.item(), "grad_norm": grad_norm, "skipped": skipped,
                  "seconds": time.perf_counter() - start}
        if first_frames is not None:
            record["task"] = "t2v" if cond_latents is None else "i2v"
        records.append(record)
        if log is not None:
            log(record)
    transformer.eval().requires_grad_(False)
    return records


def first_frame_image(clip: torch.Tensor | np.ndarray):
    """Frame 0 of a clip [3, F, H, W] in [-1, 1] as the 8-bit RGB PIL image a user would give stage 1."""
    from PIL import Image

    return Image.fromarray(to_uint8_frames(torch.as_tensor(clip)[:, :1])[0].numpy())


@torch.no_grad()
def first_frame_conditions(components: dict, preset, clips: torch.Tensor | np.ndarray,
                           progress: bool = True) -> dict[str, torch.Tensor]:
    """Image-to-video training conditions of clips [N, 3, F, H, W]: each clip's first frame, as an 8-bit image,
    through exactly stage 1's path (bucket crop, SigLIP, VAE): ``image_embeds`` [N, tokens, dim] and ``cond_latents``
    [N, C, 1, h, w], scaled as the latents are."""
    parts = [encode_image(components, preset, crop_to_bucket(preset, first_frame_image(clip)))
             for clip in tqdm(clips, desc="first frames", disable=not progress)]
    return {k: torch.cat([p[k].float() for p in parts]) for k in parts[0]}


def encode_captions(text_components: dict, preset, captions: list[str], batch_size: int = 32) -> dict[str, torch.Tensor]:
    """Stage-1 tensors for many captions (the frozen text encoders run once, in batches)."""
    parts = [encode_prompts(text_components, preset, captions[i : i + batch_size])
             for i in range(0, len(captions), batch_size)]
    return {k: torch.cat([p[k] for p in parts]) for k in parts[0]}


def build_latent_dataset(vae, text_components: dict, preset, combos: list[data.Combo], clips_per_combo: int,
                         seed: int = 0, progress: bool = True, image_components: dict | None = None) -> dict[str, Any]:
    """Render clips, encode them once with the (frozen) VAE and the captions once with the text encoders.

    Returns ``latents`` (scaled by the VAE's scaling factor), ``caption_index``, ``embeds`` (one row per
    combo) and ``negative`` (the empty prompt, used for caption dropout); with ``image_components`` (SigLIP's
    ``image_encoder`` and ``feature_extractor``) also ``first_frames`` (:func:`first_frame_conditions`).
    """
    clips, _ = data.make_dataset(combos, clips_per_combo, seed=seed)
    latents = encode_latents(vae, torch.from_numpy(clips), progress=progress) * vae.config.scaling_factor
    caption_index = torch.arange(len(combos)).repeat_interleave(clips_per_combo)
    embeds = encode_captions(text_components, preset, [c.caption for c in combos])
    negative = encode_captions(text_components, preset, [""])
    out = {"latents": latents, "caption_index": caption_index, "embeds": embeds, "negative": negative}
    if image_components is not None:
        out["first_frames"] = first_frame_conditions({**image_components, "vae": vae}, preset, clips, progress)
    return out


def concat_latent_datasets(*datasets: dict[str, Any]) -> dict[str, Any]:
    """One dataset from several ``build_latent_dataset`` results (e.g. new data plus prior-preservation data),
    with each part's ``caption_index`` shifted to its rows of the joined ``embeds``; ``negative`` from the first."""
    if not datasets:
        raise ValueError("datasets: need at least one")
    offsets = np.cumsum([0] + [len(d["embeds"]["prompt_embeds"]) for d in datasets[:-1]])
    return {
        "latents": torch.cat([d["latents"] for d in datasets]),
        "caption_index": torch.cat([d["caption_index"] + int(o) for d, o in zip(datasets, offsets)]),
        "embeds": {k: torch.cat([d["embeds"][k] for d in datasets]) for k in datasets[0]["embeds"]},
        "negative": datasets[0]["negative"],
    }

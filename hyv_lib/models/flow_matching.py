"""HunyuanVideo-1.5's flow-matching training objective: noise-level sampling, the shift warp, model inputs, loss.

What the official trainer does (Tencent-Hunyuan/HunyuanVideo-1.5, ``train.py``, read for facts only):

- ``TimestepSampler`` with ``snr_type`` "lognorm" (the default): ``u ~ N(0, 1)``, ``t = sigmoid(u)`` squeezed
  into ``[eps, 1 - eps]`` with ``TRAIN_EPS = 1e-5``; "uniform" draws ``t ~ U(eps, 1 - eps)``.
- ``timestep_transform`` with ``train_timestep_shift = 3.0`` (inference uses 5 at 480p, 7/9 at 720p):
  ``sigma = s t / (1 + (s - 1) t)``, the warp FlowMatchEulerDiscreteScheduler applies at sampling time.
- The model sees ``timestep = sigma * 1000`` (``num_train_timesteps``), input ``x_t = (1 - sigma) x0 + sigma noise``
  followed by the condition latents and a mask channel (zeros for t2v; the first latent frame and mask 1 there for
  i2v), and is trained with the MSE to the velocity ``noise - x0``.

``sampling="uniform"`` here is hyv_lib's tiny trainer's ``u ~ U(0, 1)`` (no eps interval), kept exactly because
chapter 7 and the bundled hyv-tiny weights were made with it.
"""

from __future__ import annotations

import torch

NUM_TRAIN_TIMESTEPS = 1000
"""The model's timestep is ``sigma * NUM_TRAIN_TIMESTEPS`` (diffusers' scheduler and the official trainer)."""

TRAIN_TIMESTEP_SHIFT = 3.0
"""The official trainer's ``train_timestep_shift``."""

TRAIN_EPS = 1e-5
"""The official trainer's logit-normal draws lie in ``[TRAIN_EPS, 1 - TRAIN_EPS]`` before the shift."""

SAMPLINGS = ("logit_normal", "uniform")


def shift_sigmas(u: torch.Tensor, shift: float) -> torch.Tensor:
    """The scheduler's shift warp ``s u / (1 + (s - 1) u)`` (identity for s = 1; more time at high noise for s > 1)."""
    return shift * u / (1 + (shift - 1) * u)


def sample_sigmas(batch_size: int, *, shift: float, sampling: str = "logit_normal",
                  generator: torch.Generator | None = None) -> torch.Tensor:
    """Training noise levels [batch_size] in (0, 1): ``u`` drawn by ``sampling``, then :func:`shift_sigmas`.

    "logit_normal" (the official trainer's "lognorm"): ``u = eps + (1 - 2 eps) sigmoid(z)``, ``z ~ N(0, 1)``, one
    ``torch.randn`` draw of ``generator``. "uniform": ``u ~ U(0, 1)``, one ``torch.rand`` draw (the tiny trainer).
    """
    if sampling == "logit_normal":
        z = torch.randn(batch_size, generator=generator)
        u = torch.sigmoid(z) * (1 - 2 * TRAIN_EPS) + TRAIN_EPS
    elif sampling == "uniform":
        u = torch.rand(batch_size, generator=generator)
    else:
        raise ValueError(f"sampling: {sampling!r}; valid: {', '.join(SAMPLINGS)}")
    return shift_sigmas(u, shift)


def condition_channels(x0: torch.Tensor, cond_latents: torch.Tensor | None = None) -> torch.Tensor:
    """What the DiT gets after the noisy latents on the channel axis (its in_channels are 2 C + 1): C condition
    channels and one mask channel, [B, C + 1, T, h, w]. Image to video (``cond_latents`` [B, C, 1, h, w], the first
    frame's VAE latents): the condition channels hold them in latent frame 0 and zeros after, and the mask is 1 on
    frame 0, 0 elsewhere. Text to video (None): all zeros. As diffusers' pipelines build them
    (``prepare_cond_latents_and_mask``), for sampling and training alike."""
    b, c, f, h, w = x0.shape
    condition = torch.zeros(b, c + 1, f, h, w, dtype=x0.dtype, device=x0.device)
    if cond_latents is not None:
        condition[:, :c, :1] = cond_latents
        condition[:, c, 0] = 1.0
    return condition


def training_inputs(x0: torch.Tensor, noise: torch.Tensor, sigma: torch.Tensor,
                    cond_latents: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(hidden_states [B, 2C + 1, T, h, w], target [B, C, T, h, w]) for clean latents ``x0``, ``noise`` and ``sigma``
    [B]: ``cat([(1 - sigma) x0 + sigma noise, condition_channels(x0, cond_latents)])`` and the velocity
    ``noise - x0``. The transformer's timestep is ``sigma * NUM_TRAIN_TIMESTEPS``."""
    s = sigma.view(-1, *([1] * (x0.dim() - 1)))
    noisy = (1 - s) * x0 + s * noise
    hidden = torch.cat([noisy, condition_channels(x0, cond_latents)], dim=1)
    return hidden, noise - x0


def flow_matching_loss(prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean squared error between the predicted and the target velocity, in fp32."""
    return (prediction.float() - target.float()).pow(2).mean()

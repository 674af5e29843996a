"""The model-glue interface the runtimes, caches, planner and compile path are written against, and its registry.

A diffusers video transformer's ``forward`` mixes three kinds of work: prompt-only decisions made once per
conditioning (often data-dependent, so not jittable as written), per-step embeddings around a stack of blocks, and
an output head. A :class:`ModelAdapter` names those pieces for one model class, so the torchax/JAX runtime, Ulysses,
DeepCache, the sharding rules and the planner never name a model's submodules themselves. HunyuanVideo-1.5 is the
first implementation (:mod:`hyv_lib.models.hunyuan_video15.adapter`); a second model (CogVideoX) is another subclass, found by
:func:`hyv_lib.models.registry.adapter_for`. A training step uses the same pieces: :meth:`ModelAdapter.forward` is
differentiable.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping

import torch

from ..base.errors import HyvInputError
from ..parallel.sharding import STRATEGIES, Rule


class ModelAdapter:
    """How to run one diffusers video-transformer class piece by piece (subclass it; one instance per class).

    The runtimes call, per denoising step::

        prepared = adapter.prepare(model, **conditioning)        # once per conditioning, eager, concrete tensors
        inputs = adapter.block_inputs(prepared)                     # what every block needs besides the tokens
        temb = adapter.condition_embedding(model, adapter.time_embedding(model, timestep, timestep_r), inputs)
        video = adapter.embed_video(model, latents)                 # [B, N, C] video tokens
        context = adapter.embed_context(model, timestep, prepared)  # [B, L, C] context tokens (or None)
        for block in adapter.blocks(model):
            video, context = adapter.run_block(block, video, context, temb, inputs, rope)
        out = adapter.unpatchify(adapter.output_tokens(model, video, temb), latents.shape)

    ``prepare`` returns a flat dict of static-shaped tensors (per-sample ones with the batch first): the jitted step's
    inputs. Everything after it must be traceable by JAX through torchax (no data-dependent Python branches).
    """

    #: A short name (``--model`` values, error messages).
    name: str = ""
    #: The diffusers transformer class names this adapter runs (looked up by :func:`adapter_for`).
    model_classes: tuple[str, ...] = ()
    #: The transformer config keys that fix a checkpoint's layout (channels, patches, target size, task, ...), not its
    #: widths: :mod:`hyv_lib.models.folder` matches a model folder to a preset by them.
    layout_keys: tuple[str, ...] = ()
    #: The keyword names of the model's forward that carry the conditioning (besides latents and timesteps).
    conditioning: tuple[str, ...] = ()
    #: Keys of :meth:`prepare`'s dict that every block needs (kept with DeepCache's cached tokens).
    block_keys: tuple[str, ...] = ()
    #: The weight-placement rule sets over this model's parameter names, one per strategy of
    #: :data:`hyv_lib.parallel.sharding.STRATEGIES` (see :func:`hyv_lib.parallel.sharding.tensor_parallel_rule_sets`).
    rule_sets: Mapping[str, list[Rule]] = {}
    #: The name prefix of the block stack's parameters (``"transformer_blocks."``): the planner reads per-block sizes.
    block_prefix: str = ""
    #: The dtype the runtimes give the timestep (None: the model's dtype, as HunyuanVideo-1.5's pipeline passes it;
    #: CogVideoX's pipeline passes integer timesteps that diffusers embeds in float32, where bf16 would round 999 to
    #: 1000).
    timestep_dtype: torch.dtype | None = None
    #: The LoRA target groups (``train --lora_targets``, :func:`hyv_lib.models.lora.lora_target_names`): a group name
    #: -> a regex an ``nn.Linear``'s module name must match whole. Every model names ``attn`` (the attention
    #: projections of its blocks, the default), ``mlp`` (its blocks' feed-forward layers) and ``all`` (every
    #: ``nn.Linear`` of the transformer, as the official trainer's peft ``"all-linear"`` adapts them).
    lora_targets: Mapping[str, str] = {}

    # What the model takes beyond the common path: the pipeline, settings checks and planner read these instead of
    # naming a model.
    #: Its attention processors run SSTA, the sparse attention of HunyuanVideo-1.5's 720p sparse checkpoints
    #: (``--attention ssta``, ``--sparse_attn``, the planner's ``attention="ssta"``).
    runs_ssta: bool = False
    #: It samples with a flow-matching scheduler, so ``--flow_shift`` means something (False: a v-prediction DDIM or
    #: DPM scheduler, which has none).
    takes_flow_shift: bool = True
    #: ``generate --lora`` loads LoRA files (hyv_lib's or the official trainer's) into it.
    takes_lora_files: bool = True
    #: ``--vae_memory_gb``'s memory model (fitted on a GPU) was measured on its VAE.
    vae_memory_model: bool = False
    #: A line the planner adds to its GPU rows for this model (what no multi-GPU run has checked), or None.
    gpu_plan_note: str | None = None
    #: The diffusers class name of the model's VAE (built from a preset's ``vae`` config on the meta device by the
    #: planner, the VAE compile and the training features' digest).
    vae_class: str = ""

    @property
    def block_prefixes(self) -> tuple[str, ...]:
        """The name prefixes of every group of blocks, in order (:attr:`block_prefix` alone by default; a model with a
        second kind of block, such as HunyuanVideo's single-stream ones, lists that group's too): the planner's
        weight layout counts every block."""
        return (self.block_prefix,)

    def build(self, config: dict[str, Any]) -> torch.nn.Module:
        """A transformer of ``config`` (its diffusers class's keyword arguments), on the current default device:
        under ``torch.device("meta")`` the planner and the compile path get parameter names and shapes, no memory."""
        import diffusers

        return getattr(diffusers, self.model_classes[0])(**config)

    def example_inputs(self, preset, height: int, width: int, video_length: int, batch: int = 2,
                       dtype: torch.dtype = torch.bfloat16) -> dict[str, torch.Tensor]:
        """Forward keyword arguments of a ``preset``'s real shapes (zeros are fine: the compile path reads only
        shapes and dtypes, :func:`hyv_lib.planning.tpu_compile.compile_step`)."""
        raise NotImplementedError

    # ------------------------------------------------------------------------------------------ checks
    def check(self, model, who: str) -> None:
        """Raise ValueError if ``who`` (a runtime's name) cannot run this model configuration."""

    def check_timestep_r(self, model, timestep_r) -> None:
        """Raise ValueError if a second timestep (MeanFlow's ``timestep_r``) is given to a model without one."""
        if timestep_r is not None:
            raise ValueError(f"timestep_r is not an input of {self.name}: pass timestep_r=None")

    def rules(self, strategy: str) -> list[Rule]:
        """The rule set of ``strategy`` (a ``--sharding`` value) for this model."""
        if strategy not in self.rule_sets:
            valid = ", ".join(s for s in STRATEGIES if s in self.rule_sets)
            raise HyvInputError("sharding", f"must be one of {valid} for {self.name}, got {strategy!r}")
        return self.rule_sets[strategy]

    # ------------------------------------------------------------------------------------------ pieces
    def blocks(self, model) -> torch.nn.ModuleList:
        """The stack of transformer blocks, in order (DeepCache splits it; FSDP gathers per block; ``--compile``
        compiles each, :func:`hyv_lib.runtimes.compiled.compile_blocks`: the repeated blocks of one class)."""
        raise NotImplementedError

    def attention_modules(self, model) -> list[torch.nn.Module]:
        """The attention modules of the blocks that see the video tokens (Ulysses replaces their processors)."""
        return [block.attn for block in self.blocks(model)]

    def use_attention(self, model, backend: str = "auto", **options: Any) -> int:
        """Install hyv_lib's masked attention ``backend`` on the model's attention modules; returns how many."""
        raise NotImplementedError

    def note_latent_shape(self, model, latent_shape: tuple[int, ...]) -> None:
        """Told the latents' shape of every step a runtime runs from cached RoPE tables (:class:`RopeTables`), for
        attention that needs the video's token grid (SSTA's tiles). Default: nothing."""

    def prepare(self, model, **conditioning) -> dict[str, torch.Tensor]:
        """The prompt-only inputs of a step from the forward's conditioning keywords (concrete tensors: Python may
        branch on them). Static shapes; per-sample tensors keep the batch first. Unknown names are a TypeError."""
        raise NotImplementedError

    def time_embedding(self, model, timestep: torch.Tensor, timestep_r: torch.Tensor | None = None) -> torch.Tensor:
        """The per-sample timestep embedding the blocks and the head are modulated by."""
        raise NotImplementedError

    def condition_embedding(self, model, temb: torch.Tensor, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        """The whole modulation vector from the timestep's ``temb`` and the block inputs (:meth:`block_inputs`):
        ``temb`` itself by default; a model whose prompt or guidance also modulates the blocks (HunyuanVideo's pooled
        text and embedded guidance) adds them here. Every runtime calls it after :meth:`time_embedding`, DeepCache's
        cached steps with the cached inputs (the torch one adds :meth:`condition_inputs` of its step)."""
        return temb

    def condition_inputs(self, model, **forward_kwargs) -> dict[str, torch.Tensor]:
        """What :meth:`condition_embedding` reads, from a forward's keyword arguments, for a runtime that runs
        diffusers' own forward and records only what enters a block (the torch DeepCache's cached step): none by
        default."""
        return {}

    def embed_video(self, model, latents: torch.Tensor, start: int = 0, stop: int | None = None) -> torch.Tensor:
        """Video tokens [B, N, C] of the latents; ``start``/``stop`` embed only those tokens (Ulysses' shard; tokens
        past the end are zeros of the embedding's input)."""
        raise NotImplementedError

    def embed_context(self, model, timestep: torch.Tensor, prepared: dict[str, torch.Tensor]) -> torch.Tensor | None:
        """The context tokens [B, L, C] entering the first block (None for a model without a context stream)."""
        raise NotImplementedError

    def block_inputs(self, prepared: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """What every block needs from :meth:`prepare` besides the tokens (:attr:`block_keys`)."""
        return {key: prepared[key] for key in self.block_keys}

    def run_block(self, block, video, context, temb, inputs: dict[str, torch.Tensor], rope) -> tuple:
        """One block: (video, context) tokens in, (video, context) out (every block returns that pair)."""
        raise NotImplementedError

    def block_call(self, args: tuple, kwargs: dict) -> tuple:
        """A block call as the model's own forward makes it (recorded by a forward pre-hook), as
        ``(video, context, temb, inputs, rope)`` for :meth:`run_block`: DeepCache's eager runtime replays the last
        blocks from it."""
        raise NotImplementedError

    def cost_dims(self, config: Mapping[str, Any]) -> dict[str, int] | None:
        """The sizes :func:`hyv_lib.planning.costs.step_flops` counts from the transformer ``config``: ``heads``,
        ``head_dim``, ``hidden``, ``mlp``, ``refiner_mlp``, ``layers``, ``refiner_layers``, ``patch``, ``patch_t``,
        ``in_channels``, ``out_channels``, ``text_dim``, ``byt5_dim``, ``image_dim``, ``time_dim`` and ``streams`` (2:
        the context tokens have their own weights; 1: text and video share them). Optional keys, 0 when absent:
        ``single_layers`` single-stream blocks after the ``layers`` ones (one set of weights over [video ; context]:
        fused Q/K/V, an MLP-in ``single_mlp`` wide and one output projection over [attention ; MLP], an AdaLN h -> 3h),
        ``pooled_dim`` (a pooled text vector projected into the conditioning vector: pooled_dim -> h -> h) and
        ``guidance_embed`` (1: an embedded guidance scale, 256 sinusoids -> h -> h). None (the default): no analytic
        cost model, the planner compiles the step instead."""
        return None

    def context_tokens(self, preset) -> int:
        """The context tokens of one sample that the blocks attend to besides the video tokens: the preset's
        ``text_len`` by default."""
        return preset.text_len

    def token_grid(self, denoising_shape: tuple[int, ...]) -> tuple[int, int, int]:
        """The (frames, height, width) of latents of ``denoising_shape``
        (:meth:`hyv_lib.base.presets.Preset.denoising_shape`), before patching: [B, C, T, H, W] by default."""
        return tuple(denoising_shape[2:5])

    def video_grid(self, model, video_tokens: int) -> tuple[int, int, int]:
        """The (frames, height, width) token grid of the video ``model`` is running on, checked against the
        ``video_tokens`` an attention call sees (SSTA tiles it): only a model that runs SSTA records it."""
        raise NotImplementedError(f"{self.name} does not record its video's token grid (it runs no SSTA)")

    def video_token_count(self, model, latent_shape: tuple[int, ...]) -> int:
        """Video tokens of one sample for latents of ``latent_shape`` (Ulysses shards them): one per latent pixel of
        [B, C, T, H, W] latents by default (a 1x1x1 patch)."""
        return math.prod(latent_shape[2:])

    def rope(self, model, latent_shape: tuple[int, ...]) -> tuple[torch.Tensor, ...]:
        """The rotary tables (one row per video token) for latents of ``latent_shape``; depends on the shape only."""
        raise NotImplementedError

    def output_tokens(self, model, video: torch.Tensor, temb: torch.Tensor) -> torch.Tensor:
        """The output layer per video token: [B, N, C] -> [B, N, C_out]."""
        raise NotImplementedError

    def unpatchify(self, tokens: torch.Tensor, latent_shape: tuple[int, ...]) -> torch.Tensor:
        """Output tokens back to the latents' layout (``latent_shape``)."""
        raise NotImplementedError

    # ------------------------------------------------------------------------------------------ composed
    def forward(self, model, latents, timestep, prepared, rope, timestep_r=None) -> torch.Tensor:
        """The whole step from prepared inputs: what the runtimes jit, and a training step differentiates."""
        inputs = self.block_inputs(prepared)
        temb = self.condition_embedding(model, self.time_embedding(model, timestep, timestep_r), inputs)
        video = self.embed_video(model, latents)
        context = self.embed_context(model, timestep, prepared)
        for block in self.blocks(model):
            video, context = self.run_block(block, video, context, temb, inputs, rope)
        return self.unpatchify(self.output_tokens(model, video, temb), latents.shape)


class RopeTables:
    """A model's RoPE tables per latent shape: computed once each in eager torch by ``adapter.rope``, then put where
    a runtime needs them by ``place(*tables, *extra)`` (the TPU runtime: to JAX; Ulysses: this rank's rows on its
    device). ``extra`` joins the shape in the cache key; the batch size does not."""

    def __init__(self, adapter: ModelAdapter, model, place: Callable[..., tuple] | None = None):
        self.adapter, self.model, self.place, self.tables = adapter, model, place, {}

    def __call__(self, latent_shape: tuple[int, ...], *extra) -> tuple:
        key = (tuple(latent_shape[1:]), *extra)
        if key not in self.tables:
            with torch.no_grad():
                tables = self.adapter.rope(self.model, tuple(latent_shape))
            self.tables[key] = tables if self.place is None else self.place(*tables, *extra)
        self.adapter.note_latent_shape(self.model, tuple(latent_shape))  # a cached table calls no RoPE module
        return self.tables[key]

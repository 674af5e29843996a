"""Ulysses sequence parallelism for a video DiT (HunyuanVideo-1.5) on torch.distributed (nccl on GPUs, gloo on CPU)."""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ..base.errors import HyvInputError
from ..kernels.custom_op import CompilableAttention
from ..models.adapter import ModelAdapter, RopeTables
from ..models.attention_qkv import context_qkv, video_qkv
from ..models.registry import adapter_for
from ..parallel.distributed import local_device


# --------------------------------------------------------------------------------------------- layout
def check_heads(heads: int, world_size: int) -> None:
    """Ulysses gives each rank ``heads / world_size`` whole heads: raise ValueError unless that divides."""
    if world_size < 1 or heads % world_size:
        valid = ", ".join(str(n) for n in range(1, heads + 1) if heads % n == 0)
        raise ValueError(f"{heads} heads cannot be split over {world_size} ranks: Ulysses sequence parallelism "
                         f"needs a world size that divides the head count ({valid})")


def check_shared_heads(options: dict[str, Any], world_size: int) -> None:
    """SSTA's ``share_heads`` picks one tile mask from the means over *all* heads, which no rank holds under Ulysses
    (each has ``heads / world_size``): an error on 2+ ranks rather than a different mask per rank."""
    config = options.get("ssta")
    if world_size > 1 and getattr(config, "share_heads", False):
        raise HyvInputError("attention_options", "SstaConfig(share_heads=True) averages the tile means over every "
                                                 f"head, but Ulysses gives each of its {world_size} ranks a share of "
                                                 "the heads: use share_heads=False (the official default) or one "
                                                 "process")


def shard_length(tokens: int, world_size: int) -> int:
    """Video tokens per rank: ``ceil(tokens / world_size)``; the last shard(s) are padded up to it."""
    return -(-tokens // world_size)


class VideoShard(NamedTuple):
    """What each dual-stream block receives as ``freqs_cis`` under Ulysses.

    ``cos``/``sin`` are this rank's rows of the RoPE tables (zeros on padding rows); ``tokens`` is the
    real video length of the full sequence, so the attention processor knows which of the
    ``world_size * shard`` gathered video rows are padding.
    """

    cos: torch.Tensor
    sin: torch.Tensor
    tokens: int


# ---------------------------------------------------------------------------------------- collectives
def _sequence_to_heads(x: torch.Tensor, group, world: int) -> torch.Tensor:
    """[N, B, shard, H, D] (this rank's tokens, all heads) -> [N, B, world * shard, H / world, D] (all
    tokens, this rank's heads). Chunk j of the send buffer holds heads of rank j; chunk j of the receive
    buffer holds rank j's tokens, so concatenating the received chunks restores the sequence order."""
    n, b, s, h, d = x.shape
    send = x.reshape(n, b, s, world, h // world, d).permute(3, 0, 1, 2, 4, 5).contiguous()
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)
    return recv.permute(1, 2, 0, 3, 4, 5).reshape(n, b, world * s, h // world, d)


def _heads_to_sequence(x: torch.Tensor, group, world: int) -> torch.Tensor:
    """Inverse of :func:`_sequence_to_heads` for one tensor: [B, world * shard, h, D] -> [B, shard, world * h, D]."""
    b, s_full, h, d = x.shape
    send = x.reshape(b, world, s_full // world, h, d).transpose(0, 1).contiguous()
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)
    return recv.permute(1, 2, 0, 3, 4).reshape(b, s_full // world, world * h, d)


def _all_gather(x: torch.Tensor, dim: int, group, world: int) -> torch.Tensor:
    """Concatenate every rank's ``x`` (same shape on all ranks) along ``dim``, in rank order."""
    parts = [torch.empty_like(x) for _ in range(world)]
    dist.all_gather(parts, x.contiguous(), group=group)
    return torch.cat(parts, dim=dim)


# ------------------------------------------------------------------------------------------ processor
class UlyssesJointAttnProcessor:
    """Joint attention of a dual-stream block with the video sequence sharded over ``group``.

    Receives this rank's video shard [B, shard, C], the full (replicated) context [B, L, C], the
    valid-first context mask [B, L] and a :class:`VideoShard`. Projections, QK-norm and RoPE run on the
    local tokens; one all_to_all turns the video q/k/v from sequence shards into head shards; the
    context q/k/v are narrowed to the local heads; attention runs over
    ``[real video ; context ; video padding]`` with :func:`hyv_lib.kernels.dispatch.attention` (so the valid
    keys stay a prefix); the video output goes back to sequence shards with a second all_to_all and
    the context output is all_gathered over heads, leaving the same full context on every rank.

    ``backend`` and ``options`` go to the attention call. ``grid`` (a :class:`hyv_lib.models.hunyuan_video15.processors.TokenGrid`,
    for a backend that tiles the video on its token grid: SSTA) gives the grid at each call; such a backend sees
    exactly ``[real video (raster order) ; context]`` (the padding rows are dropped before the call and come back as
    zero rows) and this rank's whole heads, with every token of the sequence, so its tiles are the single process's.
    """

    def __init__(self, group=None, backend: str = "auto", grid=None, **options: Any):
        self.group = group
        self.world = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self.backend = backend
        self.grid = grid
        self.options = options
        self.attend = CompilableAttention(backend, **options)  # one opaque op inside a compiled block

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None,
                 image_rotary_emb=None):
        world, heads = self.world, attn.heads
        check_heads(heads, world)
        local = heads // world
        first = self.rank * local

        rope = None if image_rotary_emb is None else (image_rotary_emb[0], image_rotary_emb[1])
        query, key, value = video_qkv(attn, hidden_states, rope)
        shard = hidden_states.shape[1]
        tokens = getattr(image_rotary_emb, "tokens", world * shard)  # a plain (cos, sin) pair means no padding
        # [3, B, shard, H, D] -> [3, B, world * shard, H / world, D]: one collective for q, k and v.
        video_q, video_k, video_v = _sequence_to_heads(torch.stack([query, key, value]), self.group, world)

        batch = hidden_states.shape[0]
        context_len = 0 if encoder_hidden_states is None else encoder_hidden_states.shape[1]
        if encoder_hidden_states is not None:
            enc_q, enc_k, enc_v = context_qkv(attn, encoder_hidden_states)
            enc_q, enc_k, enc_v = (x.narrow(2, first, local) for x in (enc_q, enc_k, enc_v))
        else:
            enc_q = enc_k = enc_v = video_q.new_zeros(batch, 0, local, video_q.shape[-1])

        grid = None if self.grid is None else self.grid.current(tokens)
        rows = world * shard if self.grid is None else tokens  # video rows the kernel sees (a tiling one: no padding)

        def joint(video, context):  # [real video ; context ; padding], [B, S, h, D] -> [B, h, S, D]
            return torch.cat([video[:, :tokens], context, video[:, tokens:rows]], dim=1).transpose(1, 2)

        device = hidden_states.device
        context_mask = (torch.ones(batch, context_len, dtype=torch.bool, device=device) if attention_mask is None
                        else attention_mask.to(device=device, dtype=torch.bool))
        kv_mask = torch.cat([torch.ones(batch, tokens, dtype=torch.bool, device=device), context_mask,
                             torch.zeros(batch, rows - tokens, dtype=torch.bool, device=device)], dim=1)
        out = self.attend(joint(video_q, enc_q), joint(video_k, enc_k), joint(video_v, enc_v), kv_mask,
                          grid).transpose(1, 2).to(query.dtype)  # [B, S, h, D]
        out = F.pad(out, (0, 0, 0, 0, 0, world * shard - rows))  # the dropped padding rows back, as zeros

        # Padding rows are invalid queries, so their outputs are exactly zero: they go back as they are.
        video = torch.cat([out[:, :tokens], out[:, tokens + context_len:]], dim=1)
        video = _heads_to_sequence(video, self.group, world).flatten(2, 3)
        video = attn.to_out[1](attn.to_out[0](video))
        if encoder_hidden_states is None:
            return video, None
        context = _all_gather(out[:, tokens:tokens + context_len], 2, self.group, world).flatten(2, 3)
        if getattr(attn, "to_add_out", None) is not None:
            context = attn.to_add_out(context)
        return video, context


# ------------------------------------------------------------------------------------------- wrapper
class UlyssesTransformer:
    """A video transformer run with Ulysses sequence parallelism over ``group`` (pieces from ``adapter``, default the
    registered one for the model's class; the joint-attention processor below is HunyuanVideo-1.5's dual-stream one).

    Call it on every rank of ``group`` (default: the whole world) with identical full inputs and the
    keyword arguments of the model's forward; every rank gets the full noise prediction back, on the
    device of ``hidden_states``. The video tokens are split along the sequence (``ceil(S / world)``
    per rank, the last shard padded); the context tokens are replicated. The head count must be
    divisible by the world size.

    The model is modified in place: the dual-stream blocks get :class:`UlyssesJointAttnProcessor`,
    the token refiner hyv_lib's ``SelfAttnProcessor`` (it sees only the text and stays unsharded).
    ``attention_backend`` is a backend of :func:`hyv_lib.kernels.dispatch.attention` for torch tensors and
    ``attention_options`` its options (``{"ssta": hyv_lib.SstaConfig(...)}`` for ``ssta``); each block's processor
    runs what the adapter's ``use_attention`` chose for that block (SSTA: its token grid, and dense attention on
    the blocks of ``dense_every``). SSTA with ``share_heads`` needs every head on one rank: refused on 2+ ranks.

    It is also a DeepCache runtime (:class:`hyv_lib.runtimes.deepcache.CacheableRuntime`: :meth:`run_and_cache`,
    :meth:`run_from_cache`), so ``DeepCacheStep(ulysses, schedule)`` runs DeepCache and MagCache schedules with each
    rank caching its own sequence shard; build that step with :func:`hyv_lib.runtimes.step.make_step` (or pass the
    schedule through :meth:`agreed_schedule`), which gives every rank the same schedule.
    """

    def __init__(self, model, group=None, attention_backend: str = "auto", adapter: ModelAdapter | None = None,
                 attention_options: dict[str, Any] | None = None):
        if not (dist.is_available() and dist.is_initialized()):
            raise RuntimeError("UlyssesTransformer needs torch.distributed initialised: call "
                               "hyv_lib.parallel.distributed.init_distributed() (under torchrun) or "
                               "torch.distributed.init_process_group first")
        config = model.config
        self.adapter = adapter = adapter_for(model, adapter)
        adapter.check(model, "UlyssesTransformer")
        self.group = group
        self.world = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        if self.rank < 0:
            raise ValueError("this process is not a member of the group passed to UlyssesTransformer")
        check_heads(config.num_attention_heads, self.world)
        self.model = model
        options = dict(attention_options or {})
        # refiner: SelfAttnProcessor; blocks: the processors whose choices (backend, options, grid) Ulysses keeps
        adapter.use_attention(model, attention_backend, **options)  # also checks the backend and its options
        self.processors = []
        for attn in adapter.attention_modules(model):
            chosen = attn.processor
            processor = UlyssesJointAttnProcessor(group, getattr(chosen, "backend", attention_backend),
                                                  getattr(chosen, "grid", None),
                                                  **getattr(chosen, "options", options))
            check_shared_heads(processor.options, self.world)
            attn.set_processor(processor)
            self.processors.append(processor)
        self._rope = RopeTables(adapter, model, self._local_rows)  # once per latent shape and device

    @property
    def device(self) -> torch.device:
        """The model's device, read at each call: a model moved after this wrapper was built is served there."""
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        """The model's dtype, read at each call (a cast after construction is followed)."""
        return next(self.model.parameters()).dtype

    def _local_rows(self, cos: torch.Tensor, sin: torch.Tensor, device: torch.device) -> tuple[torch.Tensor, ...]:
        """This rank's rows of the RoPE tables (padding rows zero) on ``device``."""
        tokens = cos.shape[0]
        shard = shard_length(tokens, self.world)
        local = [F.pad(t, (0, 0, 0, shard * self.world - tokens))[self.rank * shard:(self.rank + 1) * shard]
                 for t in (cos, sin)]
        return tuple(t.to(device).contiguous() for t in local)

    def _timesteps(self, batch: int, timestep, timestep_r) -> tuple:
        """(timestep, timestep_r) as per-sample tensors on the model's device, and the timestep embedding."""
        a, device = self.adapter, self.device
        timestep, timestep_r = (None if t is None else torch.as_tensor(t).reshape(-1).expand(batch).to(
            device=device, dtype=a.timestep_dtype or self.dtype) for t in (timestep, timestep_r))
        return timestep, a.time_embedding(self.model, timestep, timestep_r)

    def _start(self, hidden_states, timestep, timestep_r, conditioning: dict) -> tuple:
        """A step up to the first block on this rank: (temb, video shard [B, shard, C], the full context, the
        adapter's block inputs, the :class:`VideoShard` RoPE rows)."""
        a, m, world, rank = self.adapter, self.model, self.world, self.rank
        a.check_timestep_r(m, timestep_r)
        device, dtype = self.device, self.dtype
        if device.type != "cuda" and dist.get_backend(self.group) == "nccl":
            raise ValueError(f"the model is on {device}, but nccl exchanges GPU tensors only: move it to this rank's "
                             "GPU first (hyv_lib.parallel.distributed.local_device())")

        def put(t):  # floating tensors in the model's dtype, integer ones (masks) as they are
            if not isinstance(t, torch.Tensor):
                return t
            return t.to(device=device, dtype=dtype if t.is_floating_point() else t.dtype)

        latents = put(hidden_states)
        tokens = a.video_token_count(m, tuple(latents.shape))
        shard = shard_length(tokens, world)
        timestep, temb = self._timesteps(latents.shape[0], timestep, timestep_r)
        prepared = a.prepare(m, **{name: put(t) for name, t in conditioning.items()})
        context = a.embed_context(m, timestep, prepared)
        inputs = a.block_inputs(prepared)
        temb = a.condition_embedding(m, temb, inputs)
        # only this rank's tokens are embedded; padding tokens past the end are zeros
        video = a.embed_video(m, latents, rank * shard, (rank + 1) * shard)  # [B, shard, C]
        cos, sin = self._rope(tuple(latents.shape), device)
        return temb, video, context, inputs, VideoShard(cos, sin, tokens)

    def _blocks(self, blocks, video, context, temb, inputs, rope) -> tuple:
        for block in blocks:
            video, context = self.adapter.run_block(block, video, context, temb, inputs, rope)
        return video, context

    def _finish(self, video, temb, hidden_states, tokens: int) -> torch.Tensor:
        """The output layer on this rank's tokens, all ranks' tokens gathered, as latents where ``hidden_states``
        is."""
        video = self.adapter.output_tokens(self.model, video, temb)  # per token, so still sharded: [B, shard, C_out]
        video = _all_gather(video, 1, self.group, self.world)[:, :tokens]
        return self.adapter.unpatchify(video, hidden_states.shape).to(hidden_states.device)

    def _split(self, no_cache_blocks: int) -> tuple[list, list]:
        """The blocks before DeepCache's cache point and the last ``no_cache_blocks`` (none for 0)."""
        blocks = list(self.adapter.blocks(self.model))
        return blocks[:len(blocks) - no_cache_blocks], blocks[len(blocks) - no_cache_blocks:]

    @torch.no_grad()
    def __call__(self, hidden_states, timestep, timestep_r=None, attention_kwargs=None, return_dict: bool = False,
                 **conditioning) -> torch.Tensor:
        """The model's forward (latents, timestep(s), the adapter's conditioning keywords) on every rank."""
        temb, video, context, inputs, rope = self._start(hidden_states, timestep, timestep_r, conditioning)
        video, _ = self._blocks(self.adapter.blocks(self.model), video, context, temb, inputs, rope)
        return self._finish(video, temb, hidden_states, rope.tokens)

    # ------------------------------------------------------------------ DeepCache (CacheableRuntime protocol)
    # Each rank caches its own sequence shard of the tokens entering the last ``no_cache_blocks`` blocks (the context
    # tokens, replicated, too). Which steps are full is DeepCacheStep's choice, by step index from the schedule alone;
    # :meth:`agreed_schedule` makes that schedule rank 0's on every rank, so all ranks run the same collectives.
    @torch.no_grad()
    def run_and_cache(self, no_cache_blocks: int, hidden_states, timestep, timestep_r=None, attention_kwargs=None,
                      **conditioning) -> tuple[torch.Tensor, Any]:
        """DeepCache's full step under Ulysses: the forward (the full prediction on every rank), and this rank's
        cache: its shard of the video tokens and the context tokens entering the last ``no_cache_blocks`` blocks
        (leaving the last block for 0), the block inputs and its RoPE rows."""
        temb, video, context, inputs, rope = self._start(hidden_states, timestep, timestep_r, conditioning)
        deep, tail = self._split(no_cache_blocks)
        video, context = self._blocks(deep, video, context, temb, inputs, rope)
        cache = (video, context, inputs, rope)
        video, _ = self._blocks(tail, video, context, temb, inputs, rope)
        return self._finish(video, temb, hidden_states, rope.tokens), cache

    @torch.no_grad()
    def run_from_cache(self, cache: Any, no_cache_blocks: int, hidden_states, timestep, timestep_r=None,
                       **_) -> torch.Tensor:
        """DeepCache's cached step under Ulysses: the fresh timestep embedding, the last ``no_cache_blocks`` blocks on
        this rank's cached shard (their attention's all_to_alls as in a full step) and the output layer, gathered
        (``hidden_states`` gives only the output's shape and device)."""
        self.adapter.check_timestep_r(self.model, timestep_r)
        video, context, inputs, rope = cache
        self.adapter.note_latent_shape(self.model, tuple(hidden_states.shape))  # this step's token grid (SSTA)
        _, temb = self._timesteps(hidden_states.shape[0], timestep, timestep_r)
        temb = self.adapter.condition_embedding(self.model, temb, inputs)
        video, _ = self._blocks(self._split(no_cache_blocks)[1], video, context, temb, inputs, rope)
        return self._finish(video, temb, hidden_states, rope.tokens)

    def agreed_schedule(self, schedule):
        """The step-cache schedule (a DeepCacheSchedule or MagCacheSchedule) every rank of the group runs: rank 0's,
        broadcast. DeepCacheStep decides full or cached by the step index from the schedule's precomputed plan, and
        no rank-local data (no tensor, no timing) enters that decision; the one thing that could differ between ranks
        is the plan itself (a MagCache curve calibrated on each rank, or different objects passed by the caller), so
        every rank takes rank 0's and the ranks' collectives stay matched."""
        box = [schedule]
        dist.broadcast_object_list(box, src=0 if self.group is None else dist.get_global_rank(self.group, 0),
                                   group=self.group)
        return box[0]


def ulysses_forward(model, kwargs: dict) -> torch.Tensor:
    """One Ulysses forward of ``model`` on this rank (a picklable entry point for :func:`run_distributed`): the rank's
    copy of the model goes to this rank's device first (its GPU under nccl, whose collectives take GPU tensors only);
    the prediction comes back on the host."""
    model.to(local_device())
    return UlyssesTransformer(model)(**kwargs).cpu()

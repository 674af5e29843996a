"""Ulysses sequence parallelism for a video DiT (HunyuanVideo-1.5) on torch.distributed (nccl on GPUs, gloo on CPU)."""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ..base.errors import HyvInputError
from ..kernels.dispatch import attention
from ..models.adapter import ModelAdapter, RopeTables
from ..models.processors import context_qkv, video_qkv
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

    ``backend`` and ``options`` go to the attention call. ``grid`` (a :class:`hyv_lib.models.processors.TokenGrid`,
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

        options = self.options if self.grid is None else {**self.options, "grid": self.grid.current(tokens)}
        rows = world * shard if self.grid is None else tokens  # video rows the kernel sees (a tiling one: no padding)

        def joint(video, context):  # [real video ; context ; padding], [B, S, h, D] -> [B, h, S, D]
            return torch.cat([video[:, :tokens], context, video[:, tokens:rows]], dim=1).transpose(1, 2)

        device = hidden_states.device
        context_mask = (torch.ones(batch, context_len, dtype=torch.bool, device=device) if attention_mask is None
                        else attention_mask.to(device=device, dtype=torch.bool))
        kv_mask = torch.cat([torch.ones(batch, tokens, dtype=torch.bool, device=device), context_mask,
                             torch.zeros(batch, rows - tokens, dtype=torch.bool, device=device)], dim=1)
        out = attention(joint(video_q, enc_q), joint(video_k, enc_k), joint(video_v, enc_v), kv_mask,
                        backend=self.backend, **options).transpose(1, 2).to(query.dtype)  # [B, S, h, D]
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

    @torch.no_grad()
    def __call__(self, hidden_states, timestep, timestep_r=None, attention_kwargs=None, return_dict: bool = False,
                 **conditioning) -> torch.Tensor:
        """The model's forward (latents, timestep(s), the adapter's conditioning keywords) on every rank."""
        a, m, world, rank = self.adapter, self.model, self.world, self.rank
        a.check_timestep_r(m, timestep_r)
        out_device = hidden_states.device
        device, dtype = self.device, self.dtype
        if device.type != "cuda" and dist.get_backend(self.group) == "nccl":
            raise ValueError(f"the model is on {device}, but nccl exchanges GPU tensors only: move it to this rank's "
                             "GPU first (hyv_lib.parallel.distributed.local_device())")

        def put(t):  # floating tensors in the model's dtype, integer ones (masks) as they are
            if not isinstance(t, torch.Tensor):
                return t
            return t.to(device=device, dtype=dtype if t.is_floating_point() else t.dtype)

        latents = put(hidden_states)
        batch = latents.shape[0]
        tokens = a.video_token_count(m, tuple(latents.shape))
        shard = shard_length(tokens, world)
        timestep, timestep_r = (None if t is None else torch.as_tensor(t).reshape(-1).expand(batch).to(
            device=device, dtype=a.timestep_dtype or dtype) for t in (timestep, timestep_r))
        temb = a.time_embedding(m, timestep, timestep_r)
        prepared = a.prepare(m, **{name: put(t) for name, t in conditioning.items()})
        context = a.embed_context(m, timestep, prepared)
        inputs = a.block_inputs(prepared)
        # only this rank's tokens are embedded; padding tokens past the end are zeros
        video = a.embed_video(m, latents, rank * shard, (rank + 1) * shard)  # [B, shard, C]
        cos, sin = self._rope(tuple(latents.shape), self.device)
        rope = VideoShard(cos, sin, tokens)
        for block in a.blocks(m):
            video, context = a.run_block(block, video, context, temb, inputs, rope)
        video = a.output_tokens(m, video, temb)  # per token, so still sharded: [B, shard, C_out]
        video = _all_gather(video, 1, self.group, world)[:, :tokens]
        return a.unpatchify(video, latents.shape).to(out_device)


def ulysses_forward(model, kwargs: dict) -> torch.Tensor:
    """One Ulysses forward of ``model`` on this rank (a picklable entry point for :func:`run_distributed`): the rank's
    copy of the model goes to this rank's device first (its GPU under nccl, whose collectives take GPU tensors only);
    the prediction comes back on the host."""
    model.to(local_device())
    return UlyssesTransformer(model)(**kwargs).cpu()

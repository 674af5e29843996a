"""The q, k, v of a diffusers ``Attention`` module as its processors compute them: projections, QK-norm, RoPE."""

from __future__ import annotations

import torch


def video_qkv(attn, hidden_states: torch.Tensor, rope=None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The q, k, v [B, S, H, D] of ``hidden_states`` (a dual-stream block's video stream, a joint block's tokens), as
    diffusers computes them: the projections, QK-norm on q and k, then RoPE (``rope``: the (cos, sin) tables of these
    tokens, or None)."""
    from diffusers.models.embeddings import apply_rotary_emb

    def heads(x):
        return x.unflatten(2, (attn.heads, -1))

    query = attn.norm_q(heads(attn.to_q(hidden_states)))
    key = attn.norm_k(heads(attn.to_k(hidden_states)))
    value = heads(attn.to_v(hidden_states))
    if rope is not None:
        query = apply_rotary_emb(query, rope, sequence_dim=1)
        key = apply_rotary_emb(key, rope, sequence_dim=1)
    return query, key, value


def context_qkv(attn, encoder_hidden_states: torch.Tensor):
    """The context stream's q, k, v of a dual-stream block as [B, L, H, D], QK-normalised like diffusers."""
    q, k, v = (proj(encoder_hidden_states).unflatten(2, (attn.heads, -1))
               for proj in (attn.add_q_proj, attn.add_k_proj, attn.add_v_proj))
    if attn.norm_added_q is not None:
        q = attn.norm_added_q(q)
    if attn.norm_added_k is not None:
        k = attn.norm_added_k(k)
    return q, k, v

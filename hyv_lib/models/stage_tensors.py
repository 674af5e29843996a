"""Checks of the tensors one stage hands to the next: their dtypes, and every value finite."""

from __future__ import annotations

import torch

from ..base.errors import HyvInputError

#: The float dtypes a stage file's embeddings and latents may have.
FLOATS = (torch.float32, torch.bfloat16, torch.float16)
#: The dtypes a stage file's masks may have.
INTS = (torch.int64, torch.int32, torch.bool)


def require_finite(path: str, name: str, tensor: torch.Tensor, remedy: str) -> None:
    """HyvInputError naming ``input_dir`` and the file unless every value of the float ``tensor`` is finite (one
    reduction); ``remedy`` says what to rerun."""
    if tensor.dtype in FLOATS and not bool(torch.isfinite(tensor).all()):
        bad = int((~torch.isfinite(tensor)).sum())
        raise HyvInputError("input_dir", f"{path!r}: {name} holds {bad} NaN or infinite value(s) of "
                                         f"{tensor.numel()}; {remedy}")

"""The dtype names of the CLI and the configs (fp32, bf16, fp16) and the torch dtypes they stand for."""

from __future__ import annotations

import torch

from ..base.errors import HyvInputError

#: Model dtypes by their CLI spelling (``--dtype``).
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def torch_dtype(name: str) -> torch.dtype:
    """'fp32' | 'bf16' | 'fp16' -> torch dtype; anything else is a HyvInputError naming ``dtype``."""
    try:
        return DTYPES[name]
    except KeyError:
        raise HyvInputError("dtype", f"must be one of {', '.join(DTYPES)}, got {name!r}") from None

"""A model's transformer blocks as groups of one kind, their weights stacked per group: what a ``jax.lax.scan`` over
the blocks runs on (:class:`hyv_lib.runtimes.jax_train.JaxTrainStep`)."""

from __future__ import annotations

import torch

from ..models.adapter import ModelAdapter

#: The name of a block weight stacked over the blocks (``scan_blocks``): ``transformer_blocks.*.attn.to_q.weight``.
STACKED = "*"


def block_index(name: str, prefix: str) -> tuple[int, str] | None:
    """(block index, name inside the block) of a block weight's name, else None."""
    if not name.startswith(prefix):
        return None
    index, _, rest = name[len(prefix):].partition(".")
    return (int(index), rest) if index.isdigit() and rest else None


def same_blocks(tensors: dict[str, torch.Tensor], prefix: str, count: int) -> bool:
    """Whether the ``count`` blocks hold the same weights (names, shapes, dtypes): then a scan can run them."""
    per_block: dict[int, dict[str, tuple]] = {}
    for name, tensor in tensors.items():
        found = block_index(name, prefix)
        if found:
            per_block.setdefault(found[0], {})[found[1]] = (tuple(tensor.shape), tensor.dtype)
    return count > 0 and sorted(per_block) == list(range(count)) and all(
        per_block[i] == per_block[0] for i in per_block)


def block_groups(model, adapter: ModelAdapter) -> list[tuple[str, list[torch.nn.Module]]]:
    """The adapter's block stack as runs of consecutive blocks of one container, in order: (the container's name
    prefix, e.g. ``transformer_blocks.`` or ``single_transformer_blocks.``, its blocks). HunyuanVideo's 20 dual- then
    40 single-stream blocks are two groups; a model with one kind of block, one."""
    names = {id(module): name for name, module in model.named_modules()}
    groups: list[tuple[str, list[torch.nn.Module]]] = []
    for block in adapter.blocks(model):
        prefix = names[id(block)].rpartition(".")[0] + "."
        if groups and groups[-1][0] == prefix:
            groups[-1][1].append(block)
        else:
            groups.append((prefix, [block]))
    return groups


def stack_blocks(tensors: dict[str, torch.Tensor], specs: dict[str, tuple],
                 groups: dict[str, int]) -> tuple[dict[str, torch.Tensor], dict[str, tuple]]:
    """Block weights stacked over each group's blocks (``prefix*.<name>`` -> [count, ...], ``groups``: prefix ->
    count), placed as one block's weight along its own dims; the other weights as they are."""
    stacked, stacked_specs = {}, {}
    for name, tensor in tensors.items():
        found = next(((prefix, index) for prefix in groups if (index := block_index(name, prefix))), None)
        if found is None:
            stacked[name], stacked_specs[name] = tensor, specs.get(name, ())
        elif found[1][0] == 0:
            prefix, rest = found[0], found[1][1]
            key = f"{prefix}{STACKED}.{rest}"
            stacked[key] = torch.stack([tensors[f"{prefix}{i}.{rest}"] for i in range(groups[prefix])])
            spec = specs.get(name, ())
            stacked_specs[key] = (None, *spec) if spec else ()
    return stacked, stacked_specs


def first_block_name(name: str, prefixes) -> str:
    """A stacked weight's name (``prefix*.<name>``) as its first block's (``prefix0.<name>``); others as they are."""
    for prefix in prefixes:
        if name.startswith(f"{prefix}{STACKED}."):
            return f"{prefix}0.{name[len(prefix) + len(STACKED) + 1:]}"
    return name


def unstack_blocks(tensors: dict[str, torch.Tensor], prefixes) -> dict[str, torch.Tensor]:
    """Stacked block weights (or their gradients) back under each block's own names."""
    out = {}
    for name, tensor in tensors.items():
        prefix = next((p for p in prefixes if name.startswith(f"{p}{STACKED}.")), None)
        if prefix is None:
            out[name] = tensor
        else:
            rest = name[len(prefix) + len(STACKED) + 1:]
            out.update({f"{prefix}{i}.{rest}": t for i, t in enumerate(tensor.unbind(0))})
    return out

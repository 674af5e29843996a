"""The torch train step: AdamW on the trainable weights, clipping, gradient checkpointing, FSDP2 over torchrun ranks."""

from __future__ import annotations

import copy
import math
from typing import Any, Callable

import torch
import torch.distributed as dist

from ..models.flow_matching import flow_matching_loss
from ..parallel.distributed import local_device
from .fsdp import mesh_device, shard_weights, under_torchrun

#: The batch keys every train step takes; the rest are the transformer's conditioning keywords (the model family's
#: :meth:`~hyv_lib.models.family.ModelFamily.training_inputs`, built on the host by :mod:`hyv_lib.training.loop`).
BATCH_KEYS = ("hidden_states", "timestep", "target")
TRAINABLE = ("lora", "full")


class LinearWarmup:
    """The learning rate of update ``count`` (0 for the first): ``peak * min(1, (count + 1) / warmup_steps)``, then
    constant. Plain arithmetic, so the same object is an optax schedule (``count`` a jax array) and a torch one."""

    def __init__(self, peak: float, warmup_steps: int):
        self.peak, self.warmup_steps = float(peak), int(warmup_steps)

    def __call__(self, count):
        if self.warmup_steps <= 0:
            return self.peak + 0 * count
        frac = (count + 1) / self.warmup_steps
        return self.peak * (frac - (frac - 1) * (frac > 1))  # min(frac, 1) without min(): jax arrays too

    def __repr__(self) -> str:
        return f"LinearWarmup(peak={self.peak}, warmup_steps={self.warmup_steps})"


#: The learning-rate schedules after the warmup (``train --lr_schedule``): ``constant`` holds the peak; ``cosine``
#: and ``linear`` decay it to zero at the run's last update, as diffusers' ``get_scheduler("cosine" | "linear")``.
LR_SCHEDULES = ("constant", "cosine", "linear")


class WarmupDecay(LinearWarmup):
    """:class:`LinearWarmup`'s warmup, then ``shape`` (``cosine``: ``0.5 * (1 + cos(pi * p))``, ``linear``:
    ``1 - p``) of the peak, ``p = (count - warmup_steps) / (total - warmup_steps)`` clipped to [0, 1]: after the
    warmup the factor of diffusers' ``get_cosine_schedule_with_warmup`` / ``get_linear_schedule_with_warmup`` at
    step ``count``. Works on Python numbers and on jax arrays (an optax schedule), as :class:`LinearWarmup`."""

    def __init__(self, peak: float, warmup_steps: int, total: int, shape: str):
        super().__init__(peak, warmup_steps)
        if shape not in LR_SCHEDULES[1:]:
            raise ValueError(f"shape: {shape!r}; valid: {', '.join(LR_SCHEDULES[1:])}")
        self.total, self.shape = int(total), shape

    def __call__(self, count):
        warm = super().__call__(count)
        span = max(1, self.total - self.warmup_steps)
        p = (count - self.warmup_steps) / span
        p = p * (p > 0)
        p = p - (p - 1) * (p > 1)  # clip to [0, 1] without min()/max(): jax arrays too
        if self.shape == "linear":
            factor = 1 - p
        else:
            cos = math.cos if isinstance(p, (int, float)) else _jax_cos
            factor = 0.5 * (1 + cos(math.pi * p))
        after = count >= self.warmup_steps
        return warm * (1 - after) + self.peak * factor * after

    def __repr__(self) -> str:
        return (f"WarmupDecay(peak={self.peak}, warmup_steps={self.warmup_steps}, total={self.total}, "
                f"shape={self.shape!r})")


def _jax_cos(x):
    import jax.numpy as jnp  # only a jax count (the jax runtime's optax schedule) gets here
    return jnp.cos(x)


def lr_schedule(name: str, peak: float, warmup_steps: int, total: int) -> LinearWarmup:
    """The schedule :data:`LR_SCHEDULES` names: :class:`LinearWarmup` (``constant``) or :class:`WarmupDecay` to zero
    at update ``total``."""
    if name not in LR_SCHEDULES:
        raise ValueError(f"lr schedule: {name!r}; valid: {', '.join(LR_SCHEDULES)}")
    return LinearWarmup(peak, warmup_steps) if name == "constant" else WarmupDecay(peak, warmup_steps, total, name)


def trainable_parameters(transformer: torch.nn.Module, trainable: str) -> list[tuple[str, torch.nn.Parameter]]:
    """(name, parameter) pairs to train, with ``requires_grad`` set accordingly on every parameter: ``lora``, the
    adapter's (``lora_`` in the name; attach one first with :func:`hyv_lib.models.lora.add_lora`); ``full``, all."""
    if trainable not in TRAINABLE:
        raise ValueError(f"trainable: {trainable!r}; valid: {', '.join(TRAINABLE)}")
    chosen = []
    for name, param in transformer.named_parameters():
        train = trainable == "full" or "lora_" in name
        param.requires_grad_(train)
        if train:
            chosen.append((name, param))
    if not chosen:
        raise ValueError("trainable='lora' but the transformer has no LoRA parameters: call add_lora first")
    return chosen


class TorchTrainStep:
    """One optimizer update per :meth:`step` on a HunyuanVideo-1.5 transformer (diffusers' forward), in place.

    AdamW (torch.optim, ``betas``, ``eps``, decoupled ``weight_decay``) over the parameters :func:`trainable_parameters`
    picks; the learning rate of update k is ``learning_rate(k)`` when it is callable (:class:`LinearWarmup`), else the
    number; gradients clipped to a global norm of ``max_grad_norm``. ``remat``: diffusers' gradient checkpointing
    (``enable_gradient_checkpointing``: each block's activations recomputed in the backward pass).

    Under torchrun (or an initialised process group) the transformer is sharded with FSDP2 over all ranks
    (:func:`hyv_lib.runtimes.fsdp.shard_weights`: every block, then the root) and each rank takes its contiguous
    slice of every batch (the batch size must divide by the number of ranks); FSDP averages the gradients, so an update
    equals one process's on the whole batch, and :meth:`step` returns the whole batch's loss on every rank.
    One process: the transformer moves to this process's device (:func:`hyv_lib.parallel.distributed.local_device`).

    Precision: the forward runs in the model's dtype (inputs cast to it, as the sampling loop does); the loss is fp32.
    In one process a LoRA adapter is kept in fp32 on a bf16 model (peft casts around it); under FSDP2 (one dtype per
    sharded group) it stays in the model's dtype, and ``full`` trains the weights in their own dtype (no fp32 master
    copy, unlike :class:`hyv_lib.runtimes.jax_train.JaxTrainStep`): fine-tune bf16 weights fully with care.
    """

    def __init__(self, transformer: torch.nn.Module, *, trainable: str = "lora",
                 learning_rate: float | Callable[[int], float] = 1e-4, weight_decay: float = 0.01,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8, max_grad_norm: float = 1.0,
                 remat: bool = True, distributed: bool | None = None):
        self.trainable, self.max_grad_norm = trainable, float(max_grad_norm)
        self.schedule = learning_rate if callable(learning_rate) else LinearWarmup(learning_rate, 0)
        self.distributed = under_torchrun() if distributed is None else distributed
        trainable_parameters(transformer, trainable)
        if remat:
            transformer.enable_gradient_checkpointing()
        transformer.train()
        if self.distributed:
            shard_weights(transformer)  # starts the process group if needed
            self.device = mesh_device()
            self.rank, self.world = dist.get_rank(), dist.get_world_size()
        else:
            self.device = local_device()
            transformer.to(self.device)
            self.rank, self.world = 0, 1
            if trainable == "lora":  # fp32 adapter weights on a bf16 model: peft casts its input and output
                for name, param in transformer.named_parameters():
                    if "lora_" in name:
                        param.data = param.data.float()
        self.transformer = transformer
        self.params = [p for p in transformer.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=float(self.schedule(0)), betas=tuple(betas), eps=eps,
                                           weight_decay=weight_decay)
        self.steps = 0
        self.dtype = next(p.dtype for n, p in transformer.named_parameters() if "lora_" not in n)

    def _local(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """This rank's slice of the batch on the step's device: the target in fp32, the other floating tensors in the
        model's dtype (as the sampling loop passes them, the timestep too), integer and bool ones (masks) as int64."""
        missing = [key for key in BATCH_KEYS if key not in batch]
        if missing:
            raise ValueError(f"a train batch needs {', '.join(BATCH_KEYS)} and the conditioning; missing "
                             f"{', '.join(missing)}")
        size = len(batch["hidden_states"])
        if size % self.world:
            raise ValueError(f"batch size {size} does not divide over {self.world} ranks")
        part = size // self.world
        out = {}
        for key, tensor in batch.items():
            tensor = tensor[self.rank * part:(self.rank + 1) * part]
            if key == "target":
                tensor = tensor.float()
            elif tensor.is_floating_point():
                tensor = tensor.to(self.dtype)
            else:
                tensor = tensor.to(torch.int64)
            out[key] = tensor.to(self.device)
        return out

    def step(self, batch: dict[str, torch.Tensor], prior: dict[str, torch.Tensor] | None = None,
             prior_weight: float = 1.0, frozen_rows: torch.Tensor | None = None) -> float:
        """One update on ``batch`` (:data:`BATCH_KEYS`): forward, flow-matching loss, backward, clip, AdamW; returns
        the batch's loss (before the update). ``prior``: a second batch of the same shapes (its ``target`` unused),
        trained towards the frozen model's prediction for it (:meth:`frozen_prediction`), the loss
        ``(data + prior_weight * prior) / (1 + prior_weight)``; one forward runs both halves. ``frozen_rows`` (bool,
        one per clip of ``batch``): those clips are trained towards the frozen model's prediction too, in place of
        their ``target`` (a caption-dropped clip kept where the model was: the unconditional half of guidance)."""
        lr = float(self.schedule(self.steps))
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        inputs = self._local(batch)
        target = inputs.pop("target")
        rows = None
        if frozen_rows is not None:
            part = len(frozen_rows) // self.world
            rows = frozen_rows[self.rank * part:(self.rank + 1) * part].to(self.device)
            rows = rows if bool(rows.any()) else None
        extra = None
        if prior is not None:
            extra = self._local(prior)
            extra.pop("target")
        if rows is not None:  # one frozen forward for the kept clips and the prior half
            frozen = self.frozen_prediction(inputs if extra is None else
                                            {k: torch.cat([inputs[k], extra[k]]) for k in inputs})
            target = torch.where(rows.view(-1, *[1] * (target.dim() - 1)), frozen[:len(target)], target)
            frozen = frozen[len(target):]
        elif extra is not None:
            frozen = self.frozen_prediction(extra)
        if extra is None:
            prediction = self.transformer(**inputs, return_dict=False)[0]
            loss = flow_matching_loss(prediction, target)
        else:
            both = {k: torch.cat([inputs[k], extra[k]]) for k in inputs}
            prediction = self.transformer(**both, return_dict=False)[0]
            data, kept = prediction[:len(target)], prediction[len(target):]
            loss = (flow_matching_loss(data, target) + prior_weight * flow_matching_loss(kept, frozen)) / (
                1 + prior_weight)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.params, self.max_grad_norm)
        self.optimizer.step()
        self.steps += 1
        loss = loss.detach()
        if self.distributed:  # every rank's slice is the same size: the mean of the means is the batch's mean
            loss = loss.clone()
            dist.all_reduce(loss, op=dist.ReduceOp.SUM)
            loss = loss / self.world
        return float(loss)

    def frozen_prediction(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        """The model's prediction for ``inputs`` (this rank's, on its device) with its LoRA adapter switched off (peft's
        ``disable_adapters``), without gradients, in fp32: what the model did before training."""
        if self.trainable != "lora":
            raise ValueError("frozen_prediction needs a LoRA adapter to switch off (trainable='lora')")
        self.transformer.disable_adapters()
        try:
            with torch.no_grad():
                return self.transformer(**inputs, return_dict=False)[0].float()
        finally:
            self.transformer.enable_adapters()

    def _options(self, **kwargs):
        from torch.distributed.checkpoint.state_dict import StateDictOptions

        return StateDictOptions(full_state_dict=True, cpu_offload=self.distributed, **kwargs)

    def state_dict(self) -> dict[str, Any]:
        """``{"params": trainable weights by name, "optimizer": AdamW's state by parameter name, "step": updates
        done}``, whole (unsharded) CPU tensors. Under FSDP every rank must call it and only rank 0 gets the tensors."""
        from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

        params = get_model_state_dict(self.transformer, options=self._options(ignore_frozen_params=True))
        optimizer = get_optimizer_state_dict(self.transformer, self.optimizer, options=self._options())
        cpu = lambda tree: _map_tensors(tree, lambda t: t.detach().cpu())  # noqa: E731
        return {"params": cpu(params), "optimizer": cpu(optimizer), "step": self.steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned (every rank passes the whole state)."""
        from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

        set_model_state_dict(self.transformer, state["params"],
                             options=self._options(strict=False, ignore_frozen_params=True))
        # strict=False: a parameter that never had a gradient (the last block's text-stream output) has no AdamW state
        set_optimizer_state_dict(self.transformer, self.optimizer, state["optimizer"],
                                 options=self._options(strict=False))
        self.steps = int(state["step"])

    def trained_transformer(self) -> torch.nn.Module | None:
        """The transformer with the trained weights, in eval mode, unsharded (a LoRA adapter still attached). One
        process: the module trained in place. Under FSDP every rank must call it (the weights are gathered) and rank
        0 gets a new unsharded CPU module; the other ranks get None."""
        if not self.distributed:
            self.transformer.eval()
            return self.transformer
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        whole = get_model_state_dict(self.transformer, options=self._options())
        if self.rank != 0:
            return None
        with torch.device("meta"):
            module = type(self.transformer).from_config(self.transformer.config)
        for name, config in (getattr(self.transformer, "peft_config", None) or {}).items():
            module.add_adapter(copy.deepcopy(config), adapter_name=name)
        module.load_state_dict(whole, strict=True, assign=True)
        return module.eval().requires_grad_(False)


def _map_tensors(tree: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    if isinstance(tree, torch.Tensor):
        return fn(tree)
    if isinstance(tree, dict):
        return {k: _map_tensors(v, fn) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(_map_tensors(v, fn) for v in tree)
    return tree

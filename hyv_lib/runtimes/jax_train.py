"""The DiT's train step on JAX through torchax: loss and gradients of the flow-matching objective, optax AdamW, FSDP."""

from __future__ import annotations

import functools
import logging
import time
from typing import Any

import torch

from ..base.errors import HyvInputError
from ..models.adapter import ModelAdapter, RopeTables
from ..models.flow_matching import flow_matching_loss
from ..models.registry import adapter_for
from ..parallel.mesh import active_mesh, head_split, make_mesh, parse_mesh
from ..parallel.sharding import gather_whole, plan_fsdp, shard_tokens
from ..parallel.transfer import jax_to_torch, place
from .block_stack import STACKED, block_groups, first_block_name, same_blocks, stack_blocks, unstack_blocks

logger = logging.getLogger(__name__)

#: What ``trainable`` may be: the LoRA factors only (an adapter attached with :func:`hyv_lib.models.lora.add_lora`),
#: or every parameter.
TRAINABLE = ("lora", "full")
#: The batch keys :meth:`JaxTrainStep.step` reads besides the adapter's conditioning keywords.
BATCH_KEYS = ("hidden_states", "timestep", "target")
class _Block(torch.nn.Module):
    """One block called through the adapter, as a module whose parameters are the block's (``block.<name>``)."""

    def __init__(self, adapter: ModelAdapter, block: torch.nn.Module):
        super().__init__()
        self.adapter, self.block = adapter, block

    def forward(self, video, context, temb, inputs, rope):
        return self.adapter.run_block(self.block, video, context, temb, inputs, rope)


class _Objective(torch.nn.Module):
    """The adapter's forward (:meth:`hyv_lib.models.adapter.ModelAdapter.forward`) and the flow-matching loss, written
    for a train step: each block recomputed in the backward pass (``jax.checkpoint``, ``remat``) and, on a mesh, its
    weights all-gathered whole right before it runs (FSDP: the gather is recomputed too, so whole weights live for
    one block at a time) and the video tokens kept split over ``sequence`` between blocks.

    ``stacked`` (a group's prefix -> its weights by name after the prefix, [blocks, ...]) runs that group of blocks
    (:func:`~hyv_lib.runtimes.block_stack.block_groups`) as one ``jax.lax.scan`` over the group's first module with
    each block's weights in turn: the compiler sees one block per group, not 54 (HunyuanVideo-1.5) or 60
    (HunyuanVideo: one dual- and one single-stream block). A group not in ``stacked`` runs block by block."""

    def __init__(self, model, adapter: ModelAdapter, remat: bool, gather: bool, dtype: torch.dtype):
        super().__init__()
        self.model, self.adapter, self.remat, self.gather, self.dtype = model, adapter, remat, gather, dtype
        self.groups = block_groups(model, adapter)
        self.traces = 0

    def _block_fn(self, block):
        """A torch function (block weights as ``block.<name>``, tokens, temb, inputs, rope) -> (video, context)."""
        adapter, gather, dtype = self.adapter, self.gather, self.dtype

        def run(weights, video, context, temb, inputs, rope):
            # fp32 master weights become compute-dtype copies one block at a time, before the gather
            weights = {name: w.to(dtype) if w.is_floating_point() else w for name, w in weights.items()}
            if gather:
                weights = {name: gather_whole(w) for name, w in weights.items()}
            out_video, out_context = torch.func.functional_call(_Block(adapter, block), weights,
                                                                (video, context, temb, inputs, rope))
            return shard_tokens(out_video.to(video.dtype)), out_context.to(context.dtype)

        return run

    def _run_block(self, block, video, context, temb, inputs, rope):
        run = self._block_fn(block)
        if self.remat:
            from torchax.interop import gradient_checkpoint

            run = gradient_checkpoint(run)
        weights = {f"block.{name}": w for name, w in block.named_parameters()}
        return run(weights, video, context, temb, inputs, rope)

    def _scan_blocks(self, block, stacked, video, context, temb, inputs, rope):
        import jax
        from torchax.interop import call_jax, jax_view

        run = jax_view(self._block_fn(block))

        def body(carry, weights):
            return tuple(run(weights, *carry, temb, inputs, rope)), None

        if self.remat:
            body = jax.checkpoint(body)
        temb, inputs, rope = jax_view((temb, inputs, rope))
        weights = {f"block.{name}": w for name, w in stacked.items()}
        return call_jax(lambda carry, xs: jax.lax.scan(body, carry, xs)[0], (video, context), weights)

    def forward(self, hidden_states, timestep, prepared, rope, target, stacked=None):
        self.traces += 1
        a, m = self.adapter, self.model
        inputs = a.block_inputs(prepared)
        temb = a.condition_embedding(m, a.time_embedding(m, timestep), inputs)
        video = shard_tokens(a.embed_video(m, hidden_states))
        context = a.embed_context(m, timestep, prepared)
        for prefix, blocks in self.groups:
            if stacked and prefix in stacked:
                video, context = self._scan_blocks(blocks[0], stacked[prefix], video, context, temb, inputs, rope)
            else:
                for block in blocks:
                    video, context = self._run_block(block, video, context, temb, inputs, rope)
        prediction = a.unpatchify(a.output_tokens(m, video, temb), hidden_states.shape)
        return flow_matching_loss(prediction, target)


class JaxTrainStep:
    """One optimizer update of a diffusers video transformer on JAX (through torchax): the flow-matching loss, its
    gradients (``jax.value_and_grad`` over the trainable parameters only), ``optax.clip_by_global_norm`` then
    ``optax.adamw``, all in one jitted function whose parameters and optimizer state are donated.

    ``transformer``: the host module (CPU; or on the ``meta`` device for a compile-only instance, see :meth:`lower`),
    with a LoRA adapter attached (:func:`hyv_lib.models.lora.add_lora`) for ``trainable="lora"``: then only the
    ``lora_`` parameters train. ``trainable="full"`` trains every parameter.

    Hyper-parameters as ``torch.optim.AdamW`` takes them (``learning_rate``, ``betas``, ``eps``, ``weight_decay``)
    and the gradient norm clipped to ``max_grad_norm`` first, as ``torch.nn.utils.clip_grad_norm_`` does:
    the same steps as a torch loop. ``learning_rate`` may also be a schedule, ``count -> rate`` on the update count
    from 0 (an optax schedule, e.g. :class:`hyv_lib.runtimes.torch_train.LinearWarmup`).

    ``param_dtype`` (default: the module's dtype) is what the forward and backward compute in. The optimizer state is
    fp32; with bf16 parameters the trainable ones are also kept as fp32 master weights (``master_weights``; bf16
    alone would round a 1e-5 learning rate's updates away), cast to bf16 for the forward. ``remat`` recomputes each
    transformer block in the backward pass instead of keeping its activations (``jax.checkpoint`` per block).

    ``mesh`` (a jax Mesh, or its axes as a string such as ``"data=2,sequence=4"``): FSDP. Every parameter, its
    master copy and optimizer state are split over all the mesh's devices (the model's ``fsdp`` rule set for the
    blocks, :func:`hyv_lib.parallel.sharding.plan_fsdp` for the rest), each block's weights are gathered whole right
    before it runs; samples go on ``data``, video tokens on ``sequence`` and attention heads on ``tensor`` x
    ``sequence``. ``placement`` holds the per-rule report.

    ``attention``: as :class:`hyv_lib.runtimes.jax_step.JaxTransformer` takes it (``auto``: Splash on a TPU, whose
    kernel has its own backward; the XLA kernel elsewhere). ``scan_blocks`` runs each group of consecutive blocks of
    one container whose blocks hold the same weights (names, shapes, dtypes) as one ``jax.lax.scan`` over weights
    stacked per name (``transformer_blocks.*.<name>``, [blocks, ...]; HunyuanVideo's single-stream blocks as a second
    loop over ``single_transformer_blocks.*.<name>``): one block per group for the compiler instead of 54, the same
    numbers; :attr:`scan` lists the scanned groups' prefixes. ``compiler_options``:
    XLA options for the update's compilation (``jax.jit``'s; ``{"xla_backend_optimization_level": 0}`` compiles a
    CPU test about twice as fast).
    """

    def __init__(self, transformer, *, mesh=None, trainable: str = "lora", learning_rate: float = 1e-4,
                 weight_decay: float = 0.01, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 max_grad_norm: float = 1.0, remat: bool = True, param_dtype: torch.dtype | None = None,
                 master_weights: bool = True, attention: str = "auto",
                 attention_options: dict[str, Any] | None = None, adapter: ModelAdapter | None = None,
                 compiler_options: dict[str, Any] | None = None, scan_blocks: bool = True):
        import jax
        import optax
        import torchax
        from torchax.ops.mappings import t2j_dtype

        if trainable not in TRAINABLE:
            raise HyvInputError("trainable", f"must be one of {', '.join(TRAINABLE)}, got {trainable!r}")
        if isinstance(mesh, str):
            mesh = make_mesh(**parse_mesh(mesh))
        self.adapter = adapter = adapter_for(transformer, adapter)
        adapter.check(transformer, "JaxTrainStep")
        self.model, self.mesh, self.trainable = transformer, mesh, trainable
        self.abstract = any(p.device.type == "meta" for p in transformer.parameters())
        if self.abstract and mesh is None:
            raise ValueError("a model on the meta device (compile only) needs a mesh to place its abstract weights")
        if mesh is not None and transformer.config.num_attention_heads % head_split(mesh):
            raise ValueError(f"{transformer.config.num_attention_heads} attention heads cannot be split over the "
                             f"mesh's tensor x sequence axes of size {mesh.shape['tensor']} x {mesh.shape['sequence']}")
        self.dtype = param_dtype or next(transformer.parameters()).dtype
        self.master_dtype = torch.float32 if master_weights else self.dtype
        self._compute_dtype = t2j_dtype(self.dtype)
        self.env = torchax.default_env()
        self._processors = dict(transformer.attn_processors)  # diffusers' own: trained_transformer() puts them back
        self._attention = (attention, dict(attention_options or {}))
        adapter.use_attention(transformer, attention, **self._attention[1])

        params = dict(transformer.named_parameters())
        names = [n for n in params if "lora_" in n] if trainable == "lora" else list(params)
        if not names:
            raise HyvInputError("trainable", "'lora' needs a LoRA adapter on the transformer "
                                             "(hyv_lib.models.lora.add_lora) first; or train 'full'")
        tensors = dict(params, **dict(transformer.named_buffers()))
        specs: dict[str, tuple] = {}
        self.placement: list[dict] = []
        if mesh is not None:
            shapes = {n: tuple(t.shape) for n, t in tensors.items()}
            specs, self.placement = plan_fsdp(shapes, adapter.rules("fsdp"), mesh)
        self.num_blocks = len(adapter.blocks(transformer))
        groups = {prefix: len(blocks) for prefix, blocks in block_groups(transformer, adapter)}
        #: The block groups' name prefixes (every block weight starts with one), and those run as a scan.
        self.block_prefixes = tuple(groups)
        self.scan = tuple(p for p, count in groups.items() if scan_blocks and same_blocks(tensors, p, count))
        if self.scan:  # one [blocks, ...] array per block weight of a group, placed like a block's: split on its dims
            tensors, specs = stack_blocks(tensors, specs, {p: groups[p] for p in self.scan})
            trained = set(names)
            names = [n for n in tensors if first_block_name(n, self.scan) in trained]
        self.trainable_names, self.specs = names, specs

        def to_jax(name, dtype):
            tensor = tensors[name]
            return place(tensor, mesh, specs.get(name, ()), dtype if tensor.is_floating_point() else None,
                         self.abstract)

        trained = set(names)
        self.params = {n: to_jax(n, self.master_dtype) for n in names}
        self.frozen = {n: to_jax(n, self.dtype) for n in tensors if n not in trained}
        self.optimizer = optax.chain(optax.clip_by_global_norm(max_grad_norm),
                                     optax.adamw(learning_rate, b1=betas[0], b2=betas[1], eps=eps,
                                                 weight_decay=weight_decay))
        self.hyperparameters = dict(learning_rate=learning_rate, weight_decay=weight_decay, betas=tuple(betas),
                                    eps=eps, max_grad_norm=max_grad_norm)
        self._objective = _Objective(transformer, adapter, remat, gather=mesh is not None, dtype=self.dtype)
        self._rope = RopeTables(adapter, transformer, lambda *tables: tuple(
            place(t, mesh, (), None, self.abstract) for t in tables))
        self.step_count = 0
        self._restored = False
        self._gradients = None
        shapes = jax.eval_shape(self._init_state, self.params)
        self._state_shardings = None if mesh is None else self._shardings(shapes)
        if self.abstract:
            self.opt_state = shapes if mesh is None else jax.tree.map(
                lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), shapes, self._state_shardings)
        else:
            self.opt_state = jax.jit(self._init_state, out_shardings=self._state_shardings)(self.params)
        self._update = jax.jit(self._update_fn, donate_argnums=(0, 1), compiler_options=compiler_options,
                               out_shardings=None if mesh is None else (
                                   self._param_shardings(), self._state_shardings, self._replicated()))

    # ------------------------------------------------------------------------------------------ layout
    def _replicated(self):
        from jax.sharding import NamedSharding
        from jax.sharding import PartitionSpec as P

        return NamedSharding(self.mesh, P())

    def _param_shardings(self) -> dict:
        from jax.sharding import NamedSharding
        from jax.sharding import PartitionSpec as P

        return {n: NamedSharding(self.mesh, P(*self.specs.get(n, ()))) for n in self.trainable_names}

    def _shardings(self, state):
        """The optimizer state's shardings: a per-parameter leaf (under the parameter's name) like its parameter,
        scalars (the step count) replicated."""
        import jax

        by_name = self._param_shardings()

        def sharding(path, _):
            keys = [k.key for k in path if isinstance(k, jax.tree_util.DictKey)]
            return by_name[keys[-1]] if keys and keys[-1] in by_name else self._replicated()

        return jax.tree_util.tree_map_with_path(sharding, state)

    # ------------------------------------------------------------------------------------------ the program
    def _init_state(self, params):
        import jax
        import jax.numpy as jnp

        return self.optimizer.init(jax.tree.map(lambda p: p.astype(jnp.float32), params))

    def _loss(self, params, frozen, batch):
        """The flow-matching loss (fp32) of the forward on ``params`` (cast to the compute dtype) and ``frozen``."""
        import jax
        from jax.sharding import NamedSharding
        from jax.sharding import PartitionSpec as P
        from torchax.interop import call_torch

        prefixes = self.block_prefixes
        # the blocks' trainable weights are cast per block inside it (no compute-dtype copy of them all at once)
        weights = dict(frozen, **{n: p if n.startswith(prefixes) else p.astype(self._compute_dtype)
                                  for n, p in params.items()})
        if self.mesh is not None:  # the small weights outside the blocks: gathered whole once per step
            whole = NamedSharding(self.mesh, P())
            weights = {n: w if n.startswith(prefixes) else jax.lax.with_sharding_constraint(w, whole)
                       for n, w in weights.items()}

        stacked = {}
        for prefix in self.scan:
            marker = f"{prefix}{STACKED}."
            stacked[prefix] = {n[len(marker):]: w for n, w in weights.items() if n.startswith(marker)}
            weights = {n: w for n, w in weights.items() if not n.startswith(marker)}

        def objective(weights, stacked, batch):
            return torch.func.functional_call(self._objective, {f"model.{n}": w for n, w in weights.items()},
                                              (batch["hidden_states"], batch["timestep"], batch["prepared"],
                                               batch["rope"], batch["target"], stacked), strict=False)

        with active_mesh(self.mesh):
            return call_torch(objective, weights, stacked, batch)

    def _update_fn(self, params, opt_state, frozen, batch):
        import jax
        import jax.numpy as jnp

        loss, grads = jax.value_and_grad(self._loss)(params, frozen, batch)
        f32 = functools.partial(jax.tree.map, lambda x: x.astype(jnp.float32))
        updates, opt_state = self.optimizer.update(f32(grads), opt_state, f32(params))
        params = jax.tree.map(lambda p, u: (p.astype(jnp.float32) + u).astype(p.dtype), params, updates)
        return params, opt_state, loss

    def _batch(self, batch: dict[str, torch.Tensor]) -> dict[str, Any]:
        """The jitted update's inputs from a host batch: prompt-only work in eager torch (the adapter's ``prepare``),
        RoPE tables per latent shape, per-sample tensors on ``data``."""
        if self._restored:  # trained_transformer() put diffusers' processors back: a new trace needs ours
            self.adapter.use_attention(self.model, self._attention[0], **self._attention[1])
            self._restored = False
        missing = [k for k in BATCH_KEYS if k not in batch]
        if missing:
            raise HyvInputError("batch", f"needs {', '.join(BATCH_KEYS)} and the conditioning keywords; "
                                         f"missing {', '.join(missing)}")
        hidden = batch["hidden_states"]
        if self.mesh is not None and hidden.shape[0] % self.mesh.shape["data"]:
            raise HyvInputError("batch", f"batch {hidden.shape[0]} cannot be split over the mesh's data axis of "
                                         f"size {self.mesh.shape['data']}")
        conditioning = {k: batch[k].detach().to("cpu") for k in self.adapter.conditioning
                        if batch.get(k) is not None}
        with torch.no_grad():
            prepared = self.adapter.prepare(self.model, **conditioning)

        def data(tensor, dtype=None):
            return place(tensor.detach().to("cpu"), self.mesh, ("data",) if tensor.ndim and self.mesh is not None else (),
                         dtype if tensor.is_floating_point() else None, self.abstract)

        timestep = torch.as_tensor(batch["timestep"]).reshape(-1).expand(hidden.shape[0])
        return dict(hidden_states=data(hidden, self.dtype), timestep=data(timestep, self.dtype),
                    target=data(batch["target"], torch.float32),
                    prepared={k: data(v, self.dtype) for k, v in prepared.items()},
                    rope=self._rope(tuple(hidden.shape)))

    # ------------------------------------------------------------------------------------------ public
    @property
    def compilations(self) -> int:
        """How many times the update was traced (and so compiled) so far."""
        return self._objective.traces

    def step(self, batch: dict[str, torch.Tensor]) -> float:
        """One optimizer update on ``batch`` (``hidden_states``, ``timestep``, ``target`` and the conditioning
        keywords, host tensors as :mod:`hyv_lib.models.flow_matching` builds them); returns the loss before it."""
        if self.abstract:
            raise RuntimeError("this JaxTrainStep was built from a meta-device model (compile only): use lower()")
        inputs = self._batch(batch)
        traces, start = self.compilations, time.perf_counter()
        self.params, self.opt_state, loss = self._update(self.params, self.opt_state, self.frozen, inputs)
        loss = float(loss)
        if self.compilations > traces:
            logger.info("jax train step: compiled in %.1f s", time.perf_counter() - start)
        self.step_count += 1
        return loss

    def gradients(self, batch: dict[str, torch.Tensor]) -> tuple[float, dict[str, torch.Tensor]]:
        """The loss on ``batch`` and its gradients with respect to the trainable parameters (host tensors, by
        parameter name) at the current parameters, without an update: what :meth:`step` hands the optimizer."""
        import jax

        self._check_concrete()
        if self._gradients is None:
            self._gradients = jax.jit(jax.value_and_grad(self._loss))
        loss, grads = self._gradients(self.params, self.frozen, self._batch(batch))
        return float(loss), unstack_blocks({n: jax_to_torch(g) for n, g in grads.items()}, self.scan)

    def lower(self, batch: dict[str, torch.Tensor]):
        """``jax.jit(update).lower(...)`` for a batch of these shapes (tensors, or meta tensors for a compile-only
        instance): ``.compile()`` runs the compiler of the mesh's devices, ``.memory_analysis()`` and
        ``.cost_analysis()`` of the result give per-device bytes and FLOPs."""
        return self._update.lower(self.params, self.opt_state, self.frozen, self._batch(batch))

    def state_dict(self) -> dict[str, Any]:
        """The trainable parameters (``params``, at their master precision), the optimizer state (``optimizer``:
        ``<path>`` -> tensor, the optax state flattened) and ``step``, as host torch tensors, in the step's own layout
        (with ``scan_blocks``, a scanned group's block weights stacked under ``<prefix>*.<name>``)."""
        import jax

        self._check_concrete()
        leaves = jax.tree_util.tree_flatten_with_path(self.opt_state)[0]
        return {"step": self.step_count,
                "params": {n: jax_to_torch(p) for n, p in self.params.items()},
                "optimizer": {jax.tree_util.keystr(path): jax_to_torch(leaf) for path, leaf in leaves}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned (same trainable parameters and hyper-parameters): the next
        :meth:`step` continues exactly where that state was taken."""
        import jax

        self._check_concrete()
        params, optimizer = state.get("params", {}), state.get("optimizer", {})
        if set(params) != set(self.params):
            raise HyvInputError("state", f"holds {len(params)} trainable parameters, this step trains "
                                         f"{len(self.params)} (another model, LoRA rank or trainable mode?)")
        leaves, tree = jax.tree_util.tree_flatten_with_path(self.opt_state)
        keys = [jax.tree_util.keystr(path) for path, _ in leaves]
        if set(keys) != set(optimizer):
            raise HyvInputError("state", "its optimizer state does not match this step's optax state")
        self.params = {n: self._replace(p, params[n]) for n, p in self.params.items()}
        self.opt_state = jax.tree_util.tree_unflatten(tree, [self._replace(leaf, optimizer[k])
                                                             for (_, leaf), k in zip(leaves, keys)])
        self.step_count = int(state.get("step", 0))

    def _replace(self, current, tensor: torch.Tensor):
        """``tensor`` as an array of ``current``'s shape, dtype and sharding."""
        from torchax.ops.mappings import j2t_dtype

        if tuple(tensor.shape) != tuple(current.shape):
            raise HyvInputError("state", f"a tensor of shape {list(tensor.shape)} where {list(current.shape)} "
                                         "was expected")
        spec = tuple(current.sharding.spec) if self.mesh is not None else ()
        return place(tensor, self.mesh, spec, j2t_dtype(current.dtype))

    def _check_concrete(self) -> None:
        if self.abstract:
            raise RuntimeError("this JaxTrainStep was built from a meta-device model (compile only)")

    def trained_transformer(self) -> torch.nn.Module:
        """The host module with the trained weights copied in (in its own dtype; a LoRA adapter stays attached)
        and diffusers' attention processors back: ready for ``save_lora`` or ``save_pretrained``."""
        self._check_concrete()
        named = dict(self.model.named_parameters())
        with torch.no_grad():
            trained = unstack_blocks({n: jax_to_torch(p) for n, p in self.params.items()}, self.scan)
            for name, tensor in trained.items():
                named[name].copy_(tensor.to(named[name].dtype))
        self.model.set_attn_processor(self._processors)
        self._restored = True
        return self.model


#: The name this class had while the runtime was called ``tpu`` (it runs on any JAX backend); kept for old code.
TpuTrainStep = JaxTrainStep

"""Run a video DiT (HunyuanVideo-1.5 first) on JAX through torchax: prompt-only work in eager, one jitted step."""

from __future__ import annotations

import logging
import time
from typing import Any

import torch

from ..models.adapter import ModelAdapter, RopeTables
from ..models.registry import adapter_for
from ..parallel.jax_env import jax_devices
from ..parallel.mesh import active_mesh, default_mesh, head_split, make_mesh, mesh_text, parse_mesh
from ..parallel.sharding import DEFAULT_STRATEGY, GATHERED_RULE_SETS, gather_whole, plan
from ..parallel.transfer import jax_to_torch, torch_to_numpy

logger = logging.getLogger(__name__)


class _BlockCall(torch.nn.Module):
    """One block called through the adapter, as a module whose parameters are the block's (``block.<name>``), so
    ``torch.func.functional_call`` can run it on substituted (all-gathered) weights."""

    def __init__(self, adapter: ModelAdapter, block: torch.nn.Module):
        super().__init__()
        self.adapter, self.block = adapter, block

    def forward(self, video, context, temb, inputs, rope):
        return self.adapter.run_block(self.block, video, context, temb, inputs, rope)


class _Step(torch.nn.Module):
    """The per-step part of a model's forward, written with static shapes from the adapter's pieces.

    Everything data-dependent was decided outside by :meth:`ModelAdapter.prepare` (for HunyuanVideo-1.5: t2v vs i2v
    as a 0/1 scale, the valid-first reorder as gather indices) and the RoPE tables, so this traces once per input
    shape. ``prepared`` is the adapter's dict of prompt-only tensors, ``rope`` its tables for the latent shape.
    """

    def __init__(self, model, adapter: ModelAdapter, mesh=None, gather_weights: bool = False):
        super().__init__()
        self.model = model
        self.adapter = adapter
        self.mesh = mesh
        self.gather_weights = gather_weights  # FSDP: all-gather each block's weights right before it runs
        self.traces = 0  # Python here runs only while JAX traces: one trace = one compilation

    def _shard_sequence(self, tokens):
        """On a mesh with a sequence axis, keep the video tokens split along the sequence between blocks."""
        if self.mesh is None or self.mesh.shape["sequence"] == 1:
            return tokens
        import jax
        from jax.sharding import NamedSharding
        from jax.sharding import PartitionSpec as P
        from torchax.interop import call_jax

        spec = NamedSharding(self.mesh, P("data", "sequence", None))
        return call_jax(jax.lax.with_sharding_constraint, tokens, spec)

    def _embed(self, hidden_states, timestep, prepared, timestep_r):
        """The modulation vector (timestep, MeanFlow's ``timestep_r``, the model's other conditioning), video tokens
        and the context tokens before the first block."""
        a, m = self.adapter, self.model
        temb = a.condition_embedding(m, a.time_embedding(m, timestep, timestep_r), a.block_inputs(prepared))
        video = self._shard_sequence(a.embed_video(m, hidden_states))
        return temb, video, a.embed_context(m, timestep, prepared)

    def _blocks(self, blocks, video, context, temb, inputs, rope):
        for block in blocks:
            if self.gather_weights:
                whole = {f"block.{name}": gather_whole(p) for name, p in block.named_parameters()}
                video, context = torch.func.functional_call(_BlockCall(self.adapter, block), whole,
                                                            (video, context, temb, inputs, rope))
            else:
                video, context = self.adapter.run_block(block, video, context, temb, inputs, rope)
            video = self._shard_sequence(video)
        return video, context

    def _head(self, video, temb, latent_shape):
        return self.adapter.unpatchify(self.adapter.output_tokens(self.model, video, temb), latent_shape)

    def _split(self, no_cache_blocks: int) -> tuple:
        blocks = self.adapter.blocks(self.model)
        split = len(blocks) - no_cache_blocks
        return blocks[:split], blocks[split:]

    def forward(self, hidden_states, timestep, prepared, rope, timestep_r=None):
        self.traces += 1
        temb, video, context = self._embed(hidden_states, timestep, prepared, timestep_r)
        video, _ = self._blocks(self.adapter.blocks(self.model), video, context, temb,
                                self.adapter.block_inputs(prepared), rope)
        return self._head(video, temb, hidden_states.shape)

    def forward_and_cache(self, hidden_states, timestep, prepared, rope, timestep_r=None, no_cache_blocks=1):
        """DeepCache's full step: the forward, plus the video and context tokens entering the last
        ``no_cache_blocks`` blocks (what the cached steps start from)."""
        self.traces += 1
        temb, video, context = self._embed(hidden_states, timestep, prepared, timestep_r)
        deep, tail = self._split(no_cache_blocks)
        inputs = self.adapter.block_inputs(prepared)
        video, context = self._blocks(deep, video, context, temb, inputs, rope)
        cache = (video, context)
        video, _ = self._blocks(tail, video, context, temb, inputs, rope)
        return self._head(video, temb, hidden_states.shape), cache

    def forward_from_cache(self, hidden_states, timestep, video, context, inputs, rope, timestep_r=None,
                           no_cache_blocks=1):
        """DeepCache's cached step: a fresh timestep embedding, the last ``no_cache_blocks`` blocks on the
        cached tokens (``inputs``: the adapter's block inputs), and the output layer (``hidden_states`` only gives
        the output shape)."""
        self.traces += 1
        a = self.adapter
        temb = a.condition_embedding(self.model, a.time_embedding(self.model, timestep, timestep_r), inputs)
        video, _ = self._blocks(self._split(no_cache_blocks)[1], video, context, temb, inputs, rope)
        return self._head(video, temb, hidden_states.shape)


class JaxTransformer:
    """A diffusers video transformer on JAX via torchax, callable like the model's forward.

    ``adapter`` (a :class:`hyv_lib.models.adapter.ModelAdapter`; default: the registered one for the model's class,
    :data:`hyv_lib.models.hunyuan_video15.adapter.HUNYUAN_VIDEO_15` for HunyuanVideo-1.5) says how the model's forward splits into
    prompt-only work, embeddings, blocks and head. Prompt-only work runs once per conditioning in eager torch
    (HunyuanVideo-1.5: t2v vs i2v decided in Python from the concrete image embeddings, the valid-first reorder as
    gather indices), RoPE tables once per latent shape. The per-step function is jitted once and reused. Returns the
    noise prediction as a CPU torch tensor.

    ``attention``: a backend of :func:`hyv_lib.kernels.dispatch.attention` that runs on torchax tensors
    (``splash``, ``xla``, ``host_sdpa`` on the CPU backend) or ``auto`` (Splash when the program targets a TPU,
    XLA elsewhere); ``attention_options`` are its options (Splash block sizes and compute dtype, XLA's
    ``block_kv``).

    ``mesh`` (a jax Mesh from :func:`hyv_lib.parallel.mesh.make_mesh`, or its axes as a string such as
    ``"data=2,tensor=4"``) and ``sharding`` (a strategy of :data:`hyv_lib.parallel.sharding.STRATEGIES`, default
    ``tp_replicated_out`` as for the CLI): weights are placed by the adapter's rule set for it, the CFG batch
    goes on the ``data`` axis, video tokens on the ``sequence`` axis between blocks, and attention runs
    per shard with heads on ``tensor`` x ``sequence``. ``placement`` holds the per-rule report. Arrays are
    placed shard by shard from the host copy (``jax.make_array_from_callback``) and read back with a
    cross-process gather when needed, so the same code runs when each process of a multi-host slice sees only
    its own devices.

    A model on the ``meta`` device (no weights) gives a *compile-only* instance: its parameters are abstract
    (``jax.ShapeDtypeStruct`` with the rules' shardings) and only :meth:`lower` works, e.g. on a mesh of a
    deviceless TPU topology (:mod:`hyv_lib.planning.tpu_compile`). It lowers the very jitted functions a runtime
    instance calls.
    """

    def __init__(self, model, *, mesh=None, sharding=None, attention: str = "auto",
                 attention_options: dict[str, Any] | None = None, adapter: ModelAdapter | None = None):
        import torchax
        from torchax.interop import JittableModule

        if sharding is not None and mesh is None:
            raise ValueError("sharding needs a mesh (hyv_lib.parallel.mesh.make_mesh)")
        if isinstance(mesh, str):
            mesh = make_mesh(**parse_mesh(mesh))
        config = model.config
        self.adapter = adapter = adapter_for(model, adapter)
        adapter.check(model, "JaxTransformer")
        self.model = model
        self.mesh = mesh
        self.abstract = any(p.device.type == "meta" for p in model.parameters())
        if self.abstract and mesh is None:
            raise ValueError("a model on the meta device (compile only) needs a mesh to place its abstract weights")
        self.placement: list[dict] = []
        self.env = torchax.default_env()
        self.dtype = next(model.parameters()).dtype
        # RoPE depends only on the latent shape: once per shape in eager torch, then to JAX
        self._rope = RopeTables(adapter, model, lambda *tables: tuple(self._to_jax(t) for t in tables))
        self._prepared: tuple[tuple, dict] | None = None  # ((input tensors, versions), prepared inputs)
        self._jits: dict[tuple[str, int | None], Any] = {}  # one jax.jit per step method (run and lower share it)
        # Installs hyv_lib's masked processors on `model` (callers comparing with the oracle keep a copy).
        adapter.use_attention(model, attention, **(attention_options or {}))
        specs: dict[str, tuple] = {}
        if mesh is not None:
            if config.num_attention_heads % head_split(mesh):
                raise ValueError(f"{config.num_attention_heads} attention heads cannot be split over the mesh's "
                                 f"tensor x sequence axes of size {mesh.shape['tensor']} x {mesh.shape['sequence']}")
            shapes = {name: tuple(p.shape) for name, p in model.named_parameters()}
            specs, self.placement = plan(shapes, adapter.rules(sharding or DEFAULT_STRATEGY), mesh)
            element = torch.empty((), dtype=self.dtype).element_size()
            for row in self.placement:
                row["bytes_per_device"] = row.pop("per_device") * element

        with self.env:
            self.step_module = _Step(model, adapter, mesh,
                                     gather_weights=mesh is not None and sharding in GATHERED_RULE_SETS)
            self.jitted = JittableModule(self.step_module)
            # JittableModule names tensors "model.<diffusers name>"; frozen weights land in `buffers`.
            for store in ("params", "buffers"):
                setattr(self.jitted, store, {k: self._to_jax(v, specs.get(k.removeprefix("model."), ()))
                                             for k, v in getattr(self.jitted, store).items()})

    @property
    def compilations(self) -> int:
        """How many times the step was traced (and so compiled) so far."""
        return self.step_module.traces

    def _to_jax(self, tensor: torch.Tensor, spec: tuple | None = None):
        """To a torchax tensor; on a mesh, placed with PartitionSpec(*spec) (None: replicated).

        Compile-only instances return a ``jax.ShapeDtypeStruct`` carrying that sharding instead.
        """
        if self.mesh is None:
            if tensor.device.type != "jax":
                with self.env:
                    tensor = tensor.detach().to("cpu").to("jax")
            return tensor
        import jax
        from jax.sharding import NamedSharding
        from jax.sharding import PartitionSpec as P
        from torchax.interop import jax_view, torch_view

        sharding = NamedSharding(self.mesh, P(*(spec or ())))
        if self.abstract:
            from torchax.ops.mappings import t2j_dtype

            return jax.ShapeDtypeStruct(tuple(tensor.shape), t2j_dtype(tensor.dtype), sharding=sharding)
        if tensor.device.type == "jax":
            return torch_view(jax.device_put(jax_view(tensor), sharding))

        host = torch_to_numpy(tensor)
        # Each process builds only its own devices' shards from the (identical) host copy: no transfer of a
        # global array, which a process that does not see every device of the mesh could not do.
        return torch_view(jax.make_array_from_callback(host.shape, sharding, lambda index: host[index]))

    @torch.no_grad()
    def prepare(self, **conditioning) -> dict[str, torch.Tensor]:
        """The prompt-only inputs of the jitted step from the forward's conditioning keywords (the adapter's
        :meth:`~hyv_lib.models.adapter.ModelAdapter.prepare` on CPU copies), cached for the last conditioning seen."""
        # The cache holds the tensors themselves (so their ids cannot be reused) and their versions
        # (so an in-place edit invalidates it): the denoising loop passes the same conditioning each step.
        names = tuple(sorted(conditioning))
        tensors = tuple(conditioning[n] for n in names)
        versions = tuple(getattr(t, "_version", 0) for t in tensors)
        if self._prepared is not None:
            (cached_names, cached, cached_versions), prepared = self._prepared
            if (cached_names == names and all(a is b for a, b in zip(cached, tensors))
                    and cached_versions == versions):
                return prepared
        # concrete CPU tensors here, so data-dependent decisions (t2v vs i2v) are ordinary Python branches
        cpu = {n: t.detach().to("cpu") if isinstance(t, torch.Tensor) else t for n, t in conditioning.items()}
        prepared = self.adapter.prepare(self.model, **cpu)
        # Per-sample inputs go on the data axis (one CFG prompt per data shard); scalars are replicated.
        prepared = {k: self._to_jax(v, ("data",) if v.ndim else ()) for k, v in prepared.items()}
        self._prepared = ((names, tensors, versions), prepared)
        return prepared

    def _step_args(self, hidden_states, timestep, timestep_r=None, **conditioning) -> dict[str, Any]:
        prepared = self.prepare(**conditioning)
        rope = self._rope(tuple(hidden_states.shape))
        if self.mesh is not None and hidden_states.shape[0] % self.mesh.shape["data"]:
            raise ValueError(f"batch {hidden_states.shape[0]} cannot be split over the mesh's data axis "
                             f"of size {self.mesh.shape['data']}")
        return dict(self._latent_args(hidden_states, timestep, timestep_r), prepared=prepared, rope=rope)

    def _latent_args(self, hidden_states, timestep, timestep_r=None) -> dict[str, Any]:
        """The per-step inputs: latents, timesteps and MeanFlow's ``timestep_r`` (None for other models), on the data
        axis. ``timestep_r`` is a traced input like ``timestep``: a new value is data, not a new program."""
        self.adapter.check_timestep_r(self.model, timestep_r)

        def per_sample(t):
            t = torch.as_tensor(t).reshape(-1).expand(hidden_states.shape[0])
            return self._to_jax(t.to(self.adapter.timestep_dtype or self.dtype), ("data",))

        return dict(hidden_states=self._to_jax(hidden_states.to(self.dtype), ("data",)), timestep=per_sample(timestep),
                    timestep_r=None if timestep_r is None else per_sample(timestep_r))

    def _jit(self, name: str, no_cache_blocks: int | None = None):
        """The ``jax.jit`` of one step method, shared by the runtime calls and :meth:`lower`.

        ``forward`` is the plain step; DeepCache's ``forward_and_cache`` / ``forward_from_cache`` get one jit per
        (method, uncached block count), the count being static.
        """
        key = (name, no_cache_blocks)
        if key not in self._jits:
            import functools

            import jax
            from torchax.interop import jax_view

            method = name if no_cache_blocks is None else functools.partial(getattr(_Step, name),
                                                                             no_cache_blocks=no_cache_blocks)
            self._jits[key] = jax.jit(jax_view(functools.partial(self.jitted.functional_call, method)))
        return self._jits[key]

    def _run(self, name: str, no_cache_blocks: int | None, *args, **kwargs):
        """Call a jitted step method on torchax tensors (under the mesh, for per-shard attention)."""
        from torchax.interop import jax_view, torch_view

        if self.abstract:
            raise RuntimeError("this JaxTransformer was built from a meta-device model (compile only): use lower()")
        traces, start = self.compilations, time.perf_counter()
        with self.env, torch.no_grad(), active_mesh(self.mesh):
            out = self._jit(name, no_cache_blocks)(jax_view(self.jitted.params), jax_view(self.jitted.buffers),
                                                    *jax_view(args), **jax_view(kwargs))
            if self.compilations > traces:  # this call traced (and compiled) a new program
                logger.info("jax runtime: compiled the %s program (%d so far) in %.1f s", name, self.compilations,
                            time.perf_counter() - start)
            return torch_view(out)

    def lower(self, hidden_states, timestep, *, method: str = "forward", no_cache_blocks: int = 1, cache=None,
              **conditioning):
        """``jax.jit(...).lower(...)`` of the step for these inputs: ``.compile()`` runs the compiler of the mesh's
        devices, ``.cost_analysis()`` gives XLA's FLOP and byte counts, ``.memory_analysis()`` the per-device
        bytes, ``.as_text()`` the HLO.

        ``method``: ``forward`` (the step), or DeepCache's ``forward_and_cache`` (full step; ``no_cache_blocks``
        trailing blocks) and ``forward_from_cache`` (cached step; ``cache`` = the (video, context) tokens that
        the full step returns, arrays or ``jax.ShapeDtypeStruct``; see :meth:`cache_spec`).
        """
        from torchax.interop import jax_view

        methods = ("forward", "forward_and_cache", "forward_from_cache")
        if method not in methods:
            raise ValueError(f"method must be one of {', '.join(methods)}, got {method!r}")
        args = self._step_args(hidden_states, timestep, **conditioning)
        if method == "forward":
            jitted, call = self._jit("forward"), args
        elif method == "forward_and_cache":
            jitted, call = self._jit(method, no_cache_blocks), args
        else:
            if cache is None:
                raise ValueError("forward_from_cache needs cache=(video, context), e.g. from cache_spec()")
            jitted = self._jit(method, no_cache_blocks)
            call = dict(hidden_states=args["hidden_states"], timestep=args["timestep"], timestep_r=args["timestep_r"],
                        video=cache[0], context=cache[1], inputs=self.adapter.block_inputs(args["prepared"]),
                        rope=args["rope"])
        with self.env, torch.no_grad(), active_mesh(self.mesh):
            return jitted.lower(jax_view(self.jitted.params), jax_view(self.jitted.buffers), **jax_view(call))

    @staticmethod
    def cache_spec(compiled_full) -> tuple:
        """(video, context) ``jax.ShapeDtypeStruct`` of the cache a compiled ``forward_and_cache`` returns, with
        the shardings XLA chose for them: what the cached program is compiled for."""
        import jax

        _, cache = compiled_full.out_info
        shardings = compiled_full.output_shardings[1]
        return tuple(jax.ShapeDtypeStruct(o.shape, o.dtype, sharding=s) for o, s in zip(cache, shardings))

    def run_and_cache(self, no_cache_blocks: int, hidden_states, timestep, **conditioning):
        """DeepCache's full step on JAX: (noise prediction on the CPU, cache left on the device)."""
        args = self._step_args(hidden_states, timestep, **_conditioning(conditioning))
        out, cache = self._run("forward_and_cache", no_cache_blocks, **args)
        return to_cpu(out), (cache, self.adapter.block_inputs(args["prepared"]), args["rope"])

    def run_from_cache(self, cache, no_cache_blocks: int, hidden_states, timestep, timestep_r=None, **_):
        """DeepCache's cached step on JAX: only the timestep embedding, the last blocks and the output layer."""
        (video, context), inputs, rope = cache
        return to_cpu(self._run("forward_from_cache", no_cache_blocks, video=video, context=context,
                                 inputs=inputs, rope=rope,
                                 **self._latent_args(hidden_states, timestep, timestep_r)))

    def __call__(self, hidden_states, timestep, timestep_r=None, attention_kwargs=None, return_dict: bool = False,
                 **conditioning) -> torch.Tensor:
        """The model's forward: latents, timestep(s) and the conditioning keywords of the adapter (HunyuanVideo-1.5:
        ``encoder_hidden_states``, ``encoder_attention_mask``, ``encoder_hidden_states_2``,
        ``encoder_attention_mask_2``, ``image_embeds``)."""
        args = self._step_args(hidden_states, timestep, timestep_r, **conditioning)
        out = to_cpu(self._run("forward", None, **args))
        if return_dict:  # as diffusers' forward returns it
            from diffusers.models.modeling_outputs import Transformer2DModelOutput

            return Transformer2DModelOutput(sample=out)
        return out


#: The name this class had while the runtime was called ``tpu`` (it runs on any JAX backend); kept for old code.
TpuTransformer = JaxTransformer


class DefaultMeshTransformer(JaxTransformer):
    """The jax runtime without a mesh (:func:`hyv_lib.runtimes.step.make_step` with ``mesh=None``): a
    :class:`JaxTransformer` over every JAX device, laid out by :func:`hyv_lib.parallel.mesh.default_mesh` (the CFG pair
    on ``data``, the rest on ``tensor`` as far as the heads split; the rule ``python -m hyv_lib compile`` defaults to)
    at the first call, when the batch of a step is known (2 with CFG, 1 with CFG off). The weights are placed then;
    a call with the other batch places them again for its own layout (an in-memory pipeline whose videos switch CFG on
    and off). Logs the layout (``mesh: data=2,tensor=4 (all 8 devices; --mesh 1 for one)``) on the ``hyv_lib`` logger.
    ``layout``: the mesh string in use (``1``: one device), None before the first call."""

    def __init__(self, model, *, sharding: str | None = None, attention: str = "auto",
                 attention_options: dict[str, Any] | None = None, adapter: ModelAdapter | None = None):
        self.model, self.adapter = model, adapter_for(model, adapter)
        self.adapter.check(model, "JaxTransformer")
        self.adapter.use_attention(model, attention, **(attention_options or {}))  # a bad option fails here, now
        self.sharding = sharding or DEFAULT_STRATEGY
        self.options = dict(attention=attention, attention_options=attention_options)
        self.mesh, self.placement, self.layout, self.batch, self._earlier_traces = None, [], None, None, 0

    @property
    def compilations(self) -> int:
        """How many times the step was traced (and so compiled) so far, over every layout it has had."""
        return self._earlier_traces + (self.step_module.traces if self.batch is not None else 0)

    def lay_out(self, batch: int) -> None:
        """Place the weights on the default layout for steps of ``batch`` samples, unless they are already."""
        if batch == self.batch:
            return
        axes, why = default_mesh(self.model.config.num_attention_heads, batch, self.sharding)
        used = axes["data"] * axes["tensor"] * axes["sequence"]
        mesh = None if used == 1 else make_mesh(**axes, devices=jax_devices()[:used])
        earlier = self.compilations
        JaxTransformer.__init__(self, self.model, mesh=mesh, sharding=None if mesh is None else self.sharding,
                                adapter=self.adapter, **self.options)
        self.batch, self.layout, self._earlier_traces = batch, mesh_text(axes), earlier
        logger.info("mesh: %s (%s)", self.layout, why)

    def _step_args(self, hidden_states, timestep, timestep_r=None, **conditioning) -> dict[str, Any]:
        self.lay_out(hidden_states.shape[0])
        return super()._step_args(hidden_states, timestep, timestep_r, **conditioning)


def _conditioning(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The forward's conditioning keyword arguments (``timestep_r`` included), minus the ones JaxTransformer
    ignores."""
    kwargs.pop("attention_kwargs", None)
    kwargs.pop("return_dict", None)
    return kwargs


def to_cpu(tensor: torch.Tensor) -> torch.Tensor:
    """torchax tensor -> CPU torch tensor (a writable copy of the JAX array).

    An array that this process does not hold whole (multi-host: other processes own some shards) is first
    gathered from every process, so each process gets the full result.
    """
    from torchax.interop import jax_view

    return jax_to_torch(jax_view(tensor))

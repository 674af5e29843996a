# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 1. Migrating PyTorch to JAX with torchax
#
# TPUs are programmed through {term}`XLA`, and the usual way to reach XLA is JAX. HunyuanVideo-1.5, however, exists
# as PyTorch code: diffusers' `HunyuanVideo15Transformer3DModel`, the {term}`DiT`. {term}`torchax`
# (<https://github.com/google/torchax>) runs PyTorch code on JAX arrays. No rewrite is needed, but only code that JAX can trace will compile. This chapter
# follows the migration step by step:
#
# 1. torchax in five minutes;
# 2. how much memory the weights need, and why real presets load once, in bf16;
# 3. diffusers' forward run naively: each failure shown live and caught;
# 4. the fixes in `hyv_lib.runtimes.jax_step.JaxTransformer`, and why each one is exact;
# 5. {term}`jit`, recompilation, and the persistent compile cache;
# 6. numerics against the {term}`oracle`, and eager against jit timings measured here.
#
# :::{figure} ../book/figures/01_torch_to_xla.svg
# :name: fig-01-torch-to-xla
# The migration path. `JaxTransformer` splits diffusers' forward into prompt-only work, done once in eager
# torch, and a static-shaped per-step module; torchax turns that module's weights into a pytree of JAX arrays and
# its torch ops into JAX ops; `jax.jit` compiles it into one XLA program per latent shape. To the denoising loop
# both runtimes are the same *transformer step*.
# :::
#
# With the default settings JAX runs on this machine's CPU. The same code runs on a TPU VM, where
# `jax.devices()` lists TPU chips, and with a real preset it loads the 8.3B model once, in bf16.

# %% tags=["parameters"]
import os

PRESET = os.environ.get("HYV_PRESET", "tiny_trained")   # tiny_trained | tiny | 480p_t2v | 720p_t2v
MODEL_PATH = os.environ.get("HYV_MODEL_PATH") or None  # diffusers folder / hub id for real presets
MESH = os.environ.get("HYV_MESH") or None  # for the whole model's jitted step, e.g. tensor=8 on a v5e-8 (chapter 3)
# Latent size of the experiments (frames, height, width in latent pixels): small, even for real weights.
LATENT = (2, 6, 10)
RUN_BENCHMARK = os.environ.get("HYV_RUN_BENCHMARK", "1") == "1"  # compile-cache demo + bench-size timing
from hyv_lib.notebook.display import settings_not_used  # noqa: E402

_ = settings_not_used({
    "HYV_RUNTIME": "the chapter builds the JAX runtime step by step and compares it with eager torch",
    "HYV_ATTENTION": "attention is 'auto' (Splash on TPU, XLA elsewhere), plus host_sdpa in the CPU timing",
    "HYV_HEIGHT": "the experiments run at the small latent size LATENT", "HYV_WIDTH": "see HYV_HEIGHT",
    "HYV_VIDEO_LENGTH": "see HYV_HEIGHT", "HYV_STEPS": "single forwards, no denoising loop",
})

# %%
import copy
import time
import warnings

warnings.filterwarnings("ignore", message="IProgress not found")  # tqdm.auto without ipywidgets
warnings.filterwarnings("ignore", message="The given NumPy array is not writable")  # torchax's jax->torch views
warnings.filterwarnings("ignore", message="Explicitly requested dtype int64")  # JAX runs without x64 here

import diffusers
import jax
import jax.numpy as jnp
import torch
import torchax
from torchax.interop import JittableModule, call_jax, jax_jit, jax_view

import hyv_lib
import hyv_lib.parallel.jax_env  # noqa: F401  (before JAX starts: hides libtpu's no-TPU warnings, see TPU setup)
from hyv_lib.models.components import first_blocks_copy, load_components, quiet_loading
from hyv_lib.notebook.display import html_table

diffusers.utils.logging.set_verbosity_error()  # quiet diffusers' advice about casting with .to()

print("jax", jax.__version__, "on", jax.default_backend(), "| torch", torch.__version__,
      "| torchax", torchax.__version__)

# %% [markdown]
# ## torchax in five minutes
#
# A torchax tensor is a `torch.Tensor` subclass that holds a `jax.Array`. Inside the torchax *environment*,
# every PyTorch operation on such tensors runs as the matching JAX operation. `.to("jax")` moves a tensor in.
# `jax_view` and `torch_view` expose the same data to the other library without copying it.

# %%
env = torchax.default_env()
with env:
    x = torch.arange(6.0).reshape(2, 3).to("jax")
    y = torch.nn.functional.gelu(x @ x.T)  # dispatched to jax.numpy / lax
    print(type(y).__name__, y.device, y.dtype)
    print("the jax.Array inside:", type(jax_view(y)).__name__, jax_view(y).shape)
    # call_jax: run a JAX function on torch tensors (arguments and results are converted by view)
    z = call_jax(jnp.linalg.norm, y)
    print("norm via JAX:", float(jax_view(z)))

# %% [markdown]
# Compilation works the same way. `jax_jit` wraps a *torch* function: JAX traces it once per input
# shape, while torchax turns each torch op into JAX ops, and XLA compiles the resulting graph.
# `JittableModule` does this for an `nn.Module`, passing its parameters as jit arguments.

# %%
with env:
    traces = []

    def f(a, b):
        traces.append(1)  # Python side effects run only while JAX traces
        return torch.sin(a) * b + 1

    jf = jax_jit(f)
    a = torch.randn(4).to("jax")
    for i in range(3):
        jf(a, torch.tensor(float(i)).to("jax"))
    print("3 calls, traces:", len(traces))
    jf(torch.randn(5).to("jax"), torch.tensor(1.0).to("jax"))
    print("new shape, traces:", len(traces))

# %% [markdown]
# ## The weights: load once, in bf16
#
# Before anything runs, the model has to fit. The parameter count $P$ of the 720p transformer follows from its
# config alone (`hyv_lib.planning.costs` builds the diffusers class on PyTorch's `meta` device, which allocates nothing),
# and the weights take $P$ times the $x$ bytes of one element (notation: {doc}`../book/notation`):
#
# $$
# P = 8{,}326{,}608{,}160, \qquad P \cdot 2\ \text{B} = 15.5\ \text{GiB in bf16}, \qquad
# P \cdot 4\ \text{B} = 31.0\ \text{GiB in fp32}.
# $$
#
# A TPU v5e chip has 16 GiB of {term}`HBM` and a v6e chip 32 GiB, as JAX reports them (Google's documentation says
# 16 GB and 32 GB; the figures and their sources are in `hyv_lib.planning.hardware.CHIPS`). Not all of it is a
# program's: the TPU compiler lets one program use 15.75 GiB of a v5e chip and 31.25 GiB of a v6e chip (read from
# the compiler's own limit, in the compile reports chapter 3 saves). In fp32 the weights alone overflow a v5e chip
# and leave a v6e chip 0.98 GiB of its HBM, 0.23 GiB of what the compiler allows, for the activations, the compiled
# program and everything else. In bf16 they leave 15.74 GiB of a v6e chip's allowance, and of a v5e chip's they
# leave 0.24 GiB, which is why a v5e needs the weights sharded over its chips (chapter 3; set `HYV_MESH`, a device
# {term}`mesh`). The real presets therefore load in bf16, their `default_dtype`; the tiny ones in fp32. The table
# computes the same numbers:

# %%
import json

from hyv_lib.planning.costs import dtype_bytes, param_bytes
from hyv_lib.planning.hardware import CHIPS

n_720p = param_bytes("720p_t2v", "bf16")["params"]
print(f"720p transformer: {n_720p:,} parameters")
# What the TPU compiler lets one program use per device kind, as the saved compile reports recorded it
with open(os.path.join(os.path.dirname(hyv_lib.__file__), "compiled", "tpu_compile.json")) as f:
    allowed = {r["device_kind"]: r["hbm_available_per_device"] for r in json.load(f).values()
               if isinstance(r, dict) and "hbm_available_per_device" in r}
rows = []
for dtype in ("bf16", "fp32"):
    weights = n_720p * dtype_bytes(dtype) / 2**30
    row = {"dtype": dtype, "weights (GiB)": round(weights, 2)}
    for chip in ("v5e", "v6e"):
        hbm, usable = CHIPS[chip].hbm_bytes / 2**30, allowed[CHIPS[chip].device_kind] / 2**30
        row[f"{chip}: left of {hbm:.0f} GiB HBM"] = round(hbm - weights, 2)
        row[f"{chip}: left of {usable:.2f} GiB allowed"] = round(usable - weights, 2)
    rows.append(row)
html_table(rows)

# %% [markdown]
# The notebook loads the transformer of `PRESET` once, in that preset's dtype, and never copies it. Each
# experiment that needs diffusers' eager fp32 forward (the oracle) or a throwaway copy runs on a small *probe*
# instead (next section).

# %%
preset = hyv_lib.get_preset(PRESET)
dtype = preset.default_dtype
with quiet_loading():
    model = load_components(preset, MODEL_PATH, ["transformer"], dtype=dtype)["transformer"]
n_loaded = sum(p.numel() for p in model.parameters())
print(f"{PRESET}: {n_loaded:,} parameters in {dtype}, {n_loaded * dtype_bytes(dtype) / 2**30:.3f} GiB"
      + (" (the 720p count above)" if n_loaded == n_720p else ""))

# %% [markdown]
# :::{admonition} Takeaway
# :class: tip
# $8.33 \times 10^9$ parameters are 15.5 GiB in bf16 and 31.0 GiB in fp32. Serve the real model in bf16,
# load it once, and keep fp32 comparisons with the oracle for tiny models or for a small piece of the real one.
# :::

# %% [markdown]
# ## diffusers' forward, naively
#
# The experiments of this section and of the numerics section compare with the oracle, diffusers' eager forward
# in fp32, and wrap throwaway copies of the model. They run on the **probe**: for a tiny preset the whole loaded
# model, in fp32; for a real preset the same transformer cut to its first **two** blocks (embedders, token
# refiner, two real dual-stream blocks and the output head, copied in fp32: 1.8 GiB at 720p against 31.0 GiB for
# a whole fp32 copy). Two blocks are enough: every failure below happens in the embedders or in the first
# block, and the second block is the one the NaN of the first reaches. The whole model comes back, once and
# without a copy, when it is jitted.
#
# The inputs are a CFG batch of two prompts with real padding (different text lengths) and no quoted text.
# Moved into the torchax environment and called as PyTorch would call it, the forward goes wrong in three ways.

# %%
probe = first_blocks_copy(model, None if preset.is_tiny else 2)  # fp32
n_probe = sum(p.numel() for p in probe.parameters())
print(f"probe: {len(probe.transformer_blocks)} of {len(model.transformer_blocks)} blocks, {n_probe:,} parameters, "
      f"{n_probe * 4 / 2**30:.3f} GiB in fp32")

c = preset.latent_channels
# Widths from the loaded model (equal to the preset's for real weights; a real-layout tiny folder has tiny ones).
text_dim, byt5_dim, image_dim = (model.config.text_embed_dim, model.config.text_embed_2_dim,
                                 model.config.image_embed_dim)
g = torch.Generator().manual_seed(0)
text_lengths = torch.tensor([[14], [40]])
inputs = dict(
    hidden_states=torch.randn(2, 2 * c + 1, *LATENT, generator=g),
    timestep=torch.tensor([700.0, 700.0]),
    encoder_hidden_states=torch.randn(2, preset.text_len, text_dim, generator=g),
    encoder_attention_mask=(torch.arange(preset.text_len)[None] < text_lengths).long(),
    encoder_hidden_states_2=torch.zeros(2, preset.byt5_len, byt5_dim),
    encoder_attention_mask_2=torch.zeros(2, preset.byt5_len, dtype=torch.long),
    image_embeds=torch.zeros(2, preset.image_tokens, image_dim),  # text-to-video
)
i2v_inputs = {**inputs, "image_embeds": torch.randn(2, preset.image_tokens, image_dim, generator=g)}
with torch.no_grad():  # diffusers' own forward in eager torch: the oracle
    oracle = probe(**inputs).sample
    oracle_i2v = probe(**i2v_inputs).sample
print("oracle output", tuple(oracle.shape), "finite:", bool(torch.isfinite(oracle).all()))

# %% [markdown]
# **Failure 1: eager torchax gives NaN.** The op-by-op run follows the same code path as PyTorch,
# including the dense `[B, 1, S, S]` mask. The padded text tokens are queries with no valid key, and JAX's
# softmax of an all-masked row is `0/0`. The next block reads those rows as values, and the NaN spreads to every
# token (chapter 2 shows the mechanism).

# %%
with env, torch.no_grad():
    naive = copy.deepcopy(probe).to("jax")
    out = naive(**{k: v.to("jax") for k, v in inputs.items()}).sample
    print("NaN in the output:", bool(jax_view(torch.isnan(out).any())))

# %% [markdown]
# **Failure 2: `jit` cannot trace the data-dependent Python.** The forward decides text-to-video vs
# image-to-video with `if torch.all(image_embeds == 0):`. Under `jit`, `image_embeds` is an abstract tracer,
# so its truth value is unknown at trace time:

# %%
with env, torch.no_grad():
    try:
        JittableModule(naive)(**{k: v.to("jax") for k, v in inputs.items()})
    except Exception as err:  # jax.errors.ConcretizationTypeError
        print(type(err).__name__ + ":", str(err).splitlines()[0])
del naive

# %% [markdown]
# **Failure 3, waiting behind it: boolean indexing.** The valid-first reorder does `text[text_mask]`, whose
# *shape* depends on the data. XLA needs every shape when it compiles, so this fails the same way:

# %%
with env:
    def take_valid(tokens, mask):
        return tokens[mask]

    try:
        jax_jit(take_valid)(torch.randn(6, 4).to("jax"), torch.tensor([1, 1, 0, 1, 0, 0]).bool().to("jax"))
    except Exception as err:  # jax.errors.NonConcreteBooleanIndexError
        print(type(err).__name__ + ":", str(err).splitlines()[0])

# %% [markdown]
# ## The fixes, and why each is exact
#
# `hyv_lib.runtimes.jax_step.JaxTransformer` splits the forward in two. Anything that depends only on the prompt or the
# latent *shape* is computed once, eagerly, on concrete data. The per-step part is traced once and has static
# shapes.
#
# | problem | fix | why the result is unchanged |
# |---|---|---|
# | `if torch.all(image_embeds == 0)` | decided in Python on the concrete embeddings; the step receives `image_scale` = 0 or 1 and an image mask as *data* | the step computes `image_embedder(x) * 0` exactly as diffusers does for t2v, and `* 1` for i2v |
# | `text[text_mask]` reorder | `hyv_lib.models.hunyuan_video15.layout.valid_first_order`: a stable argsort of the masks gives gather indices; the step does `torch.gather` | same permutation as the boolean indexing (a test compares with diffusers' own reorder bit for bit) |
# | dense mask, NaN rows | the processors of chapter 2: a `[B, S]` key-padding mask, padded rows exactly 0 | valid tokens never read padded ones, so their values are unchanged; padded rows no longer produce NaN |
# | {term}`RoPE` tables per call | computed once per latent shape, outside `jit`, and passed in | they depend only on the shape |
#
# The timestep-dependent parts (time embedding, token refiner) stay inside the step. Everything else in the
# step is diffusers' own submodules.
#
# The split is written once per model, not once per runtime: a *model adapter*
# (`hyv_lib.models.adapter.ModelAdapter`) names the prompt-only part (`prepare`), the embeddings, the blocks and how
# one is called, the output head and the RoPE tables. `hyv_lib.models.hunyuan_video15.adapter` is HunyuanVideo-1.5's adapter and the
# only place that restates diffusers' glue; the JAX runtime, Ulysses, DeepCache, the sharding rules and the compile
# path all take an adapter (the one for the model's class by default), so a second video transformer is one more
# adapter.

# %%
from hyv_lib.models.hunyuan_video15.layout import valid_first_order

order, reordered_mask = valid_first_order(
    torch.zeros(2, preset.image_tokens), inputs["encoder_attention_mask_2"], inputs["encoder_attention_mask"])
print("gather indices", tuple(order.shape), "| valid context tokens per sample:", reordered_mask.sum(1).tolist())

# %% [markdown]
# ## `jit` once, reuse for every step
#
# Now the whole loaded model, in its own dtype (bf16 for a real preset) and without a copy: `JaxTransformer`
# takes it as it is, installs `hyv_lib`'s attention processors on it in place, and hands its weights to JAX
# (`attention="auto"`: {term}`Splash` on a TPU, XLA elsewhere; with `HYV_MESH`, sharded over the mesh as in chapter 3).

# %%
from hyv_lib.runtimes.jax_step import JaxTransformer

step = JaxTransformer(model, mesh=MESH)
t0 = time.perf_counter()
out = step(**inputs)
first = time.perf_counter() - t0
times = []
for t in (650.0, 500.0, 250.0, 10.0):  # later steps: new timesteps, same shapes
    t0 = time.perf_counter()
    step(**{**inputs, "timestep": torch.tensor([t, t])})
    times.append(time.perf_counter() - t0)
print(f"{PRESET} in {dtype} on {jax.default_backend()}: output {tuple(out.shape)} {out.dtype}, "
      f"finite: {bool(torch.isfinite(out).all())}")
print(f"first call (trace + compile): {first:.2f} s; next calls: {min(times) * 1e3:.1f} ms; "
      f"compilations: {step.compilations}")

# %% [markdown]
# A new prompt, a new timestep or an image-to-video input are new *data*, so they reuse the program.
# A new latent *shape* (resolution or frame count) is a new program:

# %%
step(**{**inputs, "encoder_attention_mask": (torch.arange(preset.text_len)[None] < 3).long().repeat(2, 1)})
print("after a new prompt mask:", step.compilations)
step(**i2v_inputs)
print("after image-to-video inputs:", step.compilations)
bigger = torch.randn(2, 2 * c + 1, LATENT[0] + 1, *LATENT[1:], generator=g)
step(**{**inputs, "hidden_states": bigger})
print("after one more latent frame:", step.compilations)

# %% [markdown]
# This is why the denoising loop keeps shapes fixed: 50 steps at one resolution compile once. It is
# also why warmup steps exist: on a TPU, the first step of a run pays for the compile. `hyv_lib`'s warmup calls
# the step without touching the scheduler, so warmup never changes the latents. A test checks this on both
# runtimes.
#
# ## The persistent compile cache
#
# A compiled XLA program can be stored on disk and loaded by the next *process*.
# `hyv_lib.parallel.jax_env.enable_compile_cache()` turns on JAX's persistent compilation cache (default
# `~/.cache/hyv_lib/jax`), and `stage2 --runtime jax` enables it by itself. Below, two fresh processes share one
# cache folder, and each times the first call of a jitted step larger than tiny (the configuration of
# `benchmarks/jit_step.py`, printed below). The second process loads the program instead of compiling it, though
# it still traces the Python. The child processes run JAX on the CPU when this notebook holds an accelerator: a
# TPU's chips belong to one process at a time.

# %%
import json
import math
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join("..", "benchmarks"))
import jit_step  # noqa: E402  (the benchmark script's model and inputs)

bench = jit_step.__file__
if RUN_BENCHMARK:
    jit_step.LATENT[0] = 2  # its latent: 2 x 24 x 40
    bench_model, bench_inputs = jit_step.bench_model(), jit_step.bench_inputs()
    width = bench_model.config.num_attention_heads * bench_model.config.attention_head_dim
    print(f"bench step: width {width}, {len(bench_model.transformer_blocks)} blocks, "
          f"{math.prod(bench_inputs['hidden_states'].shape[2:]):,} video tokens, CFG batch of 2, fp32")
    child_env = dict(os.environ, **({} if jax.default_backend() == "cpu" else {"JAX_PLATFORMS": "cpu"}))
    first_calls = []
    with tempfile.TemporaryDirectory() as cache:
        for _ in range(2):  # the script's compile probe: enable the cache, build the step, time its first call
            child = subprocess.run([sys.executable, bench, "--frames", "2", "--compile-probe", cache],
                                   capture_output=True, text=True, check=True, env=child_env)
            first_calls.append(json.loads(child.stdout.splitlines()[-1])["first_call_s"])
    print(f"first call, process 1 (empty cache, trace + compile): {first_calls[0]:.2f} s")
    print(f"first call, process 2 (same cache, trace + load):     {first_calls[1]:.2f} s, "
          f"{first_calls[0] / first_calls[1]:.1f}x faster")
else:
    print("skipped (HYV_RUN_BENCHMARK=0)")

# %% [markdown]
# ## Numerics against the oracle
#
# The probe, jitted in fp32 and in bf16, against the oracle computed above. Each `JaxTransformer` wraps its own
# copy of the probe, because it installs its processors on the model it is given and the probe must stay
# diffusers' own.

# %%
tpu32 = JaxTransformer(copy.deepcopy(probe))
rows = []
for name, kwargs, expected in (("t2v, real padding", inputs, oracle),
                               ("i2v (non-zero image embeddings)", i2v_inputs, oracle_i2v)):
    got = tpu32(**kwargs)
    rows.append({"input": name, "dtype": "fp32", "max |jit - oracle|": f"{(got - expected).abs().max():.1e}",
                 "relative": f"{(got - expected).abs().max() / expected.abs().max():.1e}"})
tpu16 = JaxTransformer(copy.deepcopy(probe).to(torch.bfloat16))
relative32 = float((tpu32(**inputs) - oracle).abs().max() / oracle.abs().max())
got = tpu16(**inputs).float()
relative16 = float((got - oracle).abs().max() / oracle.abs().max())
rows.append({"input": "t2v, real padding", "dtype": "bf16 weights and activations",
             "max |jit - oracle|": f"{(got - oracle).abs().max():.1e}", "relative": f"{relative16:.1e}"})
del tpu16
html_table(rows)

# %% [markdown]
# The jitted step agrees with diffusers' eager forward to the rounding of its dtype, for both text-to-video
# and image-to-video. A float32 operation rounds to a relative $2^{-24} \approx 6\times10^{-8}$; bf16 keeps 8
# significant bits, a relative $2^{-8} \approx 3.9\times10^{-3}$. After a whole forward the error is a small
# multiple of that unit:

# %%
print(f"fp32: relative error {relative32:.1e} = {relative32 / 2**-24:.0f} x 2^-24")
print(f"bf16: relative error {relative16:.1e} = {relative16 / 2**-8:.1f} x 2^-8")

# %% [markdown]
# ## Eager against jit, timed here
#
# The probe, and (unless `HYV_RUN_BENCHMARK=0`) the larger configuration of the compile-cache demo, each run
# by diffusers' eager forward and by the jitted step. The jitted step is timed with every attention backend
# that can run on this JAX backend: `auto` (Splash on a TPU, XLA elsewhere) and, on the CPU only, `host_sdpa`
# (`hyv_lib.kernels.host`), which hands q, k and v from inside the jitted program to torch's fused CPU
# attention kernel through `jax.pure_callback`. That works only where JAX and torch share the host's memory.
# XLA:CPU has no fused attention kernel of its own: `auto` runs a blockwise online softmax in XLA
# (`hyv_lib.kernels.xla`), which `benchmarks/jit_step.py` also times alone against torch's kernel. Each time
# below is the best of three calls after one untimed call (which compiles).

# %%
from hyv_lib.kernels.dispatch import available_backends, resolve_backend

auto = resolve_backend("auto", torch.device("jax"))  # splash on a TPU, xla elsewhere
backends = [auto] + [b for b in ("host_sdpa",) if b != auto and available_backends()[b] is None]


def best_of(fn, repeats=3):
    fn()  # untimed: compiles a jitted step
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def eager_vs_jit(name, fp32_model, kwargs, built=None):
    """Best times of diffusers' eager forward and of the jitted step per backend (`built`: steps already made)."""
    with torch.no_grad():
        eager = best_of(lambda: fp32_model(**kwargs))
    row = {"model": name, "video tokens": math.prod(kwargs["hidden_states"].shape[2:]),
           "eager torch (ms)": round(eager * 1e3, 1)}
    for backend in backends:
        jitted = (built or {}).get(backend) or JaxTransformer(copy.deepcopy(fp32_model), attention=backend)
        seconds = best_of(lambda: jitted(**kwargs))
        row[f"jit, {backend} (ms)"] = round(seconds * 1e3, 1)
        row[f"eager / jit, {backend}"] = round(eager / seconds, 2)
    return row


timings = [eager_vs_jit(f"probe ({PRESET})", probe, inputs, built={auto: tpu32})]
if RUN_BENCHMARK:
    timings.append(eager_vs_jit(f"bench (width {width})", bench_model, bench_inputs))
html_table(timings)

# %%
where = ("both on this CPU" if jax.default_backend() == "cpu"
         else f"eager on the host CPU, jit on {jax.default_backend()}")
for row in timings:
    ratios = ", ".join(f"{b}: {row[f'eager / jit, {b}']:.2f}x" for b in backends)
    print(f"{row['model']}: eager time / jitted time = {ratios} (above 1: the jitted step is faster; {where})")

# %% [markdown]
# All these numbers come from this machine and this run; compare them only with each other. On a CPU, XLA
# fuses the work around attention (norms, modulation, RoPE, gating) that eager torch runs op by op, while
# attention itself is XLA's blockwise loop against torch's fused kernel. `host_sdpa` uses torch's kernel inside
# the jitted step, at the price of a round trip out of the compiled program for every attention call, a fixed
# cost that weighs most when the step is small. Attention's share of the step grows with the token count, so
# the ranking of the columns can change between the two rows. On a TPU the eager column is the host CPU's and the
# jit columns the TPU's, so the ratio compares two processors, not two runtimes. The reason to compile is the
# TPU anyway: there, torchax's op-by-op eager mode would dispatch every operator separately (and gives NaN, as
# shown above), while the jitted step is one XLA program that can be sharded across chips.
#
# ## Using it
#
# ```python
# import hyv_lib
#
# hyv_lib.enable_compile_cache()                # JAX's persistent compile cache (~/.cache/hyv_lib/jax)
#
# step = hyv_lib.JaxTransformer(transformer)   # callable with the forward's keyword arguments
# noise = step(hidden_states=..., timestep=..., encoder_hidden_states=..., ...)   # torch tensor on CPU
# ```
#
# or from the command line: `python -m hyv_lib stage2 --input_dir out --runtime jax --warmup_steps 2`.
#
# ## Summary
#
# - torchax runs PyTorch code on JAX arrays. Ops dispatch to JAX, and `jax_jit`/`JittableModule` compile whole
#   torch functions with XLA.
# - The 720p transformer's 8,326,608,160 parameters are 15.5 GiB in bf16 and 31.0 GiB in fp32: real presets load
#   once, in bf16, and fp32 oracle checks run on a two-block probe of the model (or the whole tiny model).
# - diffusers' forward fails in three ways under torchax: NaN in eager mode (fully masked softmax rows), a
#   concretization error under `jit` (`torch.all(...)` in an `if`), and boolean indexing, whose output shape is
#   data-dependent.
# - `JaxTransformer` decides t2v/i2v in Python, turns the reorder into a gather, uses exact 1-D-mask
#   attention, and precomputes RoPE. Each fix is exact, and the step matches the oracle to float32 rounding.
# - One compilation serves every step, prompt and timestep. A new latent shape compiles again, and the
#   persistent cache lets a second process load the program instead of compiling it.
#
# ## Exercises
#
# Marked ★ (easy) to ★★★ (hard), and *open* where no one has the answer yet ({ref}`notation-exercises`).
#
# 1. ★ Why is `image_scale` passed as a tensor rather than as a Python bool argument marked static?
# 2. ★★ The scheduler's `step` advances an internal step index. What goes wrong if warmup calls run through the
#    scheduler, and how does `hyv_lib` avoid it?
# 3. ★ Predict the number of compilations for a 50-step run at 720p after a 2-step warmup, then for a second run
#    at 480p in the same process, and a third at 720p in a new process with the compile cache enabled.
# 4. ★★ On 8 chips (`tensor=8`), how many GiB of bf16 weights does each chip hold at 720p with the
#    {term}`rule sets <rule set>` `tp_replicated_out`, `tp` and `fsdp` of chapter 3? Which of them leave at least half of a 16 GiB v5e chip
#    free? Use `hyv_lib.planning.costs.param_bytes("720p_t2v", "bf16", rules, 8)["bytes_per_device"]`.
# 5. ★★ The probe of a real preset keeps the embedders, the token refiner, the output head and the first two of the
#    54 blocks. From `hyv_lib.planning.costs.parameter_shapes("720p_t2v")`, count the parameters outside
#    `transformer_blocks` and those of one block; how many GiB is the probe in fp32, and what fraction of the
#    whole model is it?
# 6. ★★★ *Open.* torchax traces the 54 blocks one after another, so the program XLA compiles repeats the block's
#    operations 54 times, and the TPU compiler took minutes per layout on this project's CPU (chapter 3's `compile s`
#    column). Would a loop over the blocks (`jax.lax.scan` over stacked block weights) compile much faster and give a
#    smaller program, at what cost in step time, and does it still shard the same way? No one has tried it for this
#    model.
#
# :::{admonition} Answers
# :class: dropdown
# 1. A static bool would compile two programs, one for t2v and one for i2v. As data, one program serves both
#    cases, because multiplying by 0.0 or 1.0 costs nothing. Static arguments are for values that change the
#    *structure* of the computation, such as shapes. A value that only changes the numbers can be data.
# 2. After `w` warmup steps, the real loop would start at sigma index `w`. Every Euler update would then use the
#    wrong `dt`, and the loop would run past the end of the sigma table. gpu-tpu-pedia's torchax stage-2 script
#    (`generate_hunyuan_torchax_staged/stage2_transformer.py`, {doc}`../book/references`) runs its warmup steps
#    through `scheduler.step` on the scheduler that the real loop then reuses. `hyv_lib.models.hunyuan_video15.sampling.denoise` runs
#    warmup calls on the first input and discards the result without calling the scheduler. A test checks that
#    `--warmup_steps 2` gives bitwise the same latents as 0, on both runtimes.
# 3. One for the first run: the warmup pays for it, and the steps reuse it. One more for 480p, a new shape. In a
#    new process the step is *traced* again, because the in-memory cache is per process, but XLA loads the
#    executable from the persistent cache instead of compiling it.
# 4. 10.34 GiB with `tp_replicated_out` (the row-parallel linears stay whole on every chip), 6.65 GiB with `tp` and
#    2.22 GiB with `fsdp`, against 15.51 GiB replicated. `tp` and `fsdp` leave more than 8 GiB of a v5e chip free;
#    `tp_replicated_out`, the faster rule set on v6e in the gpu-tpu-pedia numbers cited in chapter 3, leaves
#    5.66 GiB.
# 5. 169,535,776 parameters outside the blocks and 151,056,896 per block, so the probe has
#    $169{,}535{,}776 + 2 \cdot 151{,}056{,}896 = 471{,}649{,}568$ parameters: 1.76 GiB in fp32, 5.7% of the
#    model's 8,326,608,160. The 54 blocks hold $54 \cdot 151{,}056{,}896 = 8{,}157{,}072{,}384$ parameters, 98% of
#    the model.
# 6. *Where to start.* `hyv_lib.models.adapter.ModelAdapter` already names the blocks and how one is called, which is what a scan needs:
#    stack the blocks' weights along a new leading axis and call one block inside `jax.lax.scan`. Compare compile
#    time and the compiled code size (`compile_step(...)`'s `code` bytes, as in chapter 3) at a small latent first,
#    then for `720p_t2v` on a v6e slice with `python -m hyv_lib compile`; the outputs must still match the oracle.
#    XLA may unroll or pipeline differently inside a loop, so the step time needs a TPU.
# :::

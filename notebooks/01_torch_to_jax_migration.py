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
# # Migrating PyTorch to JAX with torchax
#
# TPUs are programmed through XLA, and the usual way to reach XLA is JAX. HunyuanVideo-1.5, however, exists as
# PyTorch code: diffusers' `HunyuanVideo15Transformer3DModel`. [torchax](https://github.com/google/torchax) runs
# PyTorch code on JAX arrays. No rewrite is needed, but only code that JAX can trace will compile. This chapter
# follows the migration step by step:
#
# 1. torchax in five minutes;
# 2. diffusers' forward run naively: each failure shown live and caught;
# 3. the fixes in `hyv_lib.tpu.TpuTransformer`, and why each one is exact;
# 4. `jit`, recompilation, and the persistent compile cache;
# 5. numerics against the oracle, and eager against jit timings measured here.
#
# On this machine JAX runs on the CPU. The same code runs on a TPU VM, where `jax.devices()` lists TPU chips.

# %% tags=["parameters"]
import os

PRESET = os.environ.get("HYV_PRESET", "tiny_trained")   # tiny_trained | tiny | 480p_t2v | 720p_t2v
MODEL_PATH = os.environ.get("HYV_MODEL_PATH") or None  # diffusers folder / hub id for real presets
# Latent size of the experiments (frames, height, width in latent pixels): small, even for real weights.
LATENT = (2, 6, 10)
RUN_BENCHMARK = os.environ.get("HYV_RUN_BENCHMARK", "1") == "1"  # the bench-size timing (about two minutes)
from hyv_lib.display import settings_not_used  # noqa: E402

settings_not_used({
    "HYV_RUNTIME": "the chapter builds the JAX runtime step by step and compares it with eager torch",
    "HYV_MESH": "one device here; meshes are chapter 3's subject",
    "HYV_ATTENTION": "each attention backend is compared in turn",
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

import jax
import jax.numpy as jnp
import torch
import torchax
from torchax.interop import JittableModule, call_jax, jax_jit, jax_view, torch_view

import diffusers

import hyv_lib
from hyv_lib.display import html_table

diffusers.utils.logging.set_verbosity_error()  # quiet diffusers' advice about casting with .to()
from hyv_lib.models import load_components

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
# ## diffusers' forward, naively
#
# Load the transformer, move it into the torchax environment, and call it as PyTorch would. The inputs are a CFG
# batch of two prompts with real padding: different text lengths, and no quoted text. Two things go wrong.

# %%
preset = hyv_lib.get_preset(PRESET)
model = load_components(preset, MODEL_PATH, ["transformer"], dtype="fp32")["transformer"]
oracle_model = copy.deepcopy(model)  # diffusers' own forward in eager torch: the oracle
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
with torch.no_grad():
    oracle = oracle_model(**inputs).sample
print("oracle output", tuple(oracle.shape), "finite:", bool(torch.isfinite(oracle).all()))

# %% [markdown]
# **Failure 1: eager torchax gives NaN.** The op-by-op run follows the same code path as PyTorch,
# including the dense `[B, 1, S, S]` mask. The padded text tokens are queries with no valid key, and JAX's
# softmax of an all-masked row is `0/0`. The next block reads those rows as values, and the NaN spreads to every
# token (the attention chapter shows the mechanism).

# %%
with env, torch.no_grad():
    naive = copy.deepcopy(oracle_model).to("jax")
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
# `hyv_lib.tpu.TpuTransformer` splits the forward in two. Anything that depends only on the prompt or the
# latent *shape* is computed once, eagerly, on concrete data. The per-step part is traced once and has static
# shapes.
#
# | problem | fix | why the result is unchanged |
# |---|---|---|
# | `if torch.all(image_embeds == 0)` | decided in Python on the concrete embeddings; the step receives `image_scale` = 0 or 1 and an image mask as *data* | the step computes `image_embedder(x) * 0` exactly as diffusers does for t2v, and `* 1` for i2v |
# | `text[text_mask]` reorder | `hyv_lib.layout.valid_first_order`: a stable argsort of the masks gives gather indices; the step does `torch.gather` | same permutation as the boolean indexing (a test compares with diffusers' own reorder bit for bit) |
# | dense mask, NaN rows | the processors from the attention chapter: a `[B, S]` key-padding mask, padded rows exactly 0 | valid tokens never read padded ones, so their values are unchanged; padded rows no longer produce NaN |
# | RoPE tables per call | computed once per latent shape, outside `jit`, and passed in | they depend only on the shape |
#
# The timestep-dependent parts (time embedding, token refiner) stay inside the step. Everything else in the
# step is diffusers' own submodules.

# %%
from hyv_lib.layout import valid_first_order

order, reordered_mask = valid_first_order(
    torch.zeros(2, preset.image_tokens), inputs["encoder_attention_mask_2"], inputs["encoder_attention_mask"])
print("gather indices", tuple(order.shape), "| valid context tokens per sample:", reordered_mask.sum(1).tolist())

# %% [markdown]
# ## `jit` once, reuse for every step

# %%
from hyv_lib.tpu import TpuTransformer

tpu = TpuTransformer(copy.deepcopy(oracle_model))  # attention="auto": Splash on TPU, XLA elsewhere
t0 = time.perf_counter()
out = tpu(**inputs)
first = time.perf_counter() - t0
times = []
for t in (650.0, 500.0, 250.0, 10.0):  # later steps: new timesteps, same shapes
    t0 = time.perf_counter()
    tpu(**{**inputs, "timestep": torch.tensor([t, t])})
    times.append(time.perf_counter() - t0)
print(f"first call (trace + compile): {first:.2f} s; next calls: {min(times) * 1e3:.1f} ms; "
      f"compilations: {tpu.compilations}")

# %% [markdown]
# A new prompt, a new timestep or an image-to-video input are new *data*, so they reuse the program.
# A new latent *shape* (resolution or frame count) is a new program:

# %%
tpu(**{**inputs, "encoder_attention_mask": (torch.arange(preset.text_len)[None] < 3).long().repeat(2, 1)})
print("after a new prompt mask:", tpu.compilations)
bigger = torch.randn(2, 2 * c + 1, LATENT[0] + 1, *LATENT[1:], generator=g)
tpu(**{**inputs, "hidden_states": bigger})
print("after one more latent frame:", tpu.compilations)

# %% [markdown]
# This is why the denoising loop keeps shapes fixed: 50 steps at one resolution compile once. It is
# also why warmup steps exist: on a TPU, the first step of a run pays for the compile. `hyv_lib`'s warmup calls
# the step without touching the scheduler, so warmup never changes the latents. A test checks this on both
# runtimes.
#
# ## The persistent compile cache
#
# A compiled XLA program can be stored on disk and loaded by the next *process*.
# `hyv_lib.tpu.enable_compile_cache()` turns on JAX's persistent compilation cache (default
# `~/.cache/hyv_lib/jax`), and `stage2 --runtime tpu` enables it by itself. The benchmark below runs the first
# call of a larger step in two fresh processes that share one cache folder. The second process loads the
# program instead of compiling it, though it still traces the Python.

# %%
import subprocess
import sys

bench = os.path.join("..", "benchmarks", "jit_step.py")
if RUN_BENCHMARK:
    result = subprocess.run([sys.executable, bench, "--repeats", "2", "--frames", "2", "4"],
                            capture_output=True, text=True, check=True)
    print(result.stdout)
else:
    print("skipped (HYV_RUN_BENCHMARK=0)")

# %% [markdown]
# The same benchmark compares eager diffusers with the jitted step on a configuration larger than
# tiny (width 256, 4 blocks, 2,000 to 4,000 tokens); it prints attention's share of the step. XLA fuses
# the rest of the block (norms, modulation, RoPE, gating) and runs it faster than eager torch does, but
# XLA:CPU has no fused attention kernel: its blockwise online softmax (`hyv_lib.xla_attention`) is slower than
# torch's fused CPU flash kernel. So the benchmark times two jitted steps. `xla` keeps attention in XLA.
# `host_sdpa` (`hyv_lib.host_attention`) hands q, k and v from inside the jitted program to torch's kernel
# through `jax.pure_callback`; on the CPU backend both share host memory. Only on a CPU is that worth doing. On
# a TPU the step runs the Splash kernel instead, and the later chapters estimate that cost with the planner.
#
# ## Numerics against the oracle

# %%
rows = []
for name, kwargs in (("t2v, real padding", inputs),
                     ("i2v (non-zero image embeddings)",
                      {**inputs, "image_embeds": torch.randn(2, preset.image_tokens, image_dim, generator=g)})):
    with torch.no_grad():
        expected = oracle_model(**kwargs).sample
    got = tpu(**kwargs)
    rows.append({"input": name, "dtype": "fp32", "max |jit - oracle|": f"{(got - expected).abs().max():.1e}",
                 "relative": f"{(got - expected).abs().max() / expected.abs().max():.1e}"})
tpu16 = TpuTransformer(copy.deepcopy(oracle_model).to(torch.bfloat16))
got = tpu16(**inputs).float()
rows.append({"input": "t2v, real padding", "dtype": "bf16 weights and activations",
             "max |jit - oracle|": f"{(got - oracle).abs().max():.1e}",
             "relative": f"{(got - oracle).abs().max() / oracle.abs().max():.1e}"})
html_table(rows)


# %% [markdown]
# In fp32 the jitted step agrees with diffusers' eager forward to float32 rounding, for both
# text-to-video and image-to-video. In bf16 the error is that of bf16 arithmetic, about 8 bits of mantissa.
#
# ## Eager against jit, timed here

# %%
def best_of(fn, repeats=5):
    fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best

with torch.no_grad():
    eager = best_of(lambda: oracle_model(**inputs))
jitted = best_of(lambda: tpu(**inputs))
html_table([{"runtime": "diffusers eager (torch)", "ms per call": round(eager * 1e3, 1)},
            {"runtime": "TpuTransformer (torchax jit)", "ms per call": round(jitted * 1e3, 1)},
            {"runtime": "ratio eager / jit", "ms per call": round(eager / jitted, 2)}])

# %% [markdown]
# Both numbers come from this machine and this run; compare them only with each other. On a CPU, PyTorch's eager
# kernels are already good, so `jit` gains little by itself. The reason to compile is the TPU. There, the
# op-by-op torchax eager mode would dispatch every operator separately (and gives NaN, as shown above), while the
# jitted step is one XLA program that can be sharded across chips.
#
# ## Using it
#
# ```python
# from hyv_lib.tpu import TpuTransformer, enable_compile_cache
#
# enable_compile_cache()
# step = TpuTransformer(transformer)        # callable with the forward's keyword arguments
# noise = step(hidden_states=..., timestep=..., encoder_hidden_states=..., ...)   # torch tensor on CPU
# ```
#
# or from the command line: `python -m hyv_lib stage2 --input_dir out --runtime tpu --warmup_steps 2`.
#
# ## Summary
#
# - torchax runs PyTorch code on JAX arrays. Ops dispatch to JAX, and `jax_jit`/`JittableModule` compile whole
#   torch functions with XLA.
# - diffusers' forward fails in three ways under torchax: NaN in eager mode (fully masked softmax rows), a
#   concretization error under `jit` (`torch.all(...)` in an `if`), and boolean indexing, whose output shape is
#   data-dependent.
# - `TpuTransformer` decides t2v/i2v in Python, turns the reorder into a gather, uses exact 1-D-mask
#   attention, and precomputes RoPE. Each fix is exact, and the step matches the oracle to float32 rounding.
# - One compilation serves every step, prompt and timestep. A new latent shape compiles again, and the
#   persistent cache lets a second process load the program instead of compiling it.
#
# ## Exercises
#
# 1. Why is `image_scale` passed as a tensor rather than as a Python bool argument marked static?
#
# :::{admonition} Answer
# :class: dropdown
# A static bool would compile two programs, one for t2v and one for i2v. As data, one program serves both
# cases, because multiplying by 0.0 or 1.0 costs nothing. Static arguments are for values that change the
# *structure* of the computation, such as shapes. A value that only changes the numbers can be data.
# :::
#
# 2. The scheduler's `step` advances an internal step index. What goes wrong if warmup calls run through the
#    scheduler, and how does `hyv_lib` avoid it?
#
# :::{admonition} Answer
# :class: dropdown
# After `w` warmup steps, the real loop would start at sigma index `w`. Every Euler update would then use the
# wrong `dt`, and the loop would run past the end of the sigma table. gpu-tpu-pedia's TPU script has this
# bug, found by code reading. `hyv_lib.pipeline.denoise` runs warmup calls on the first input and discards the
# result without calling the scheduler. A test checks that `--warmup_steps 2` gives bitwise the same latents
# as 0, on both runtimes.
# :::
#
# 3. Predict the number of compilations for a 50-step run at 720p after a 2-step warmup, then for a second run
#    at 480p in the same process, and a third at 720p in a new process with the compile cache enabled.
#
# :::{admonition} Answer
# :class: dropdown
# One for the first run: the warmup pays for it, and the steps reuse it. One more for 480p, a new shape. In a
# new process the step is *traced* again, because the in-memory cache is per process, but XLA loads the
# executable from the persistent cache instead of compiling it.
# :::

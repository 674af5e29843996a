"""The GPU memory model (hyv_lib.planning.gpu_memory) against a hand count of the weights, the live tensor bytes of the
real classes measured on the CPU at tiny widths, and the peaks measured on one H200."""

import dataclasses
import json
import pathlib
import re

import pytest
import torch
from memory_probe import live_peak_bytes, output_peak_bytes

from hyv_lib.base.errors import HyvInputError
from hyv_lib.models.families import get_preset
from hyv_lib.models.hunyuan_video15.presets import real_layout_tiny
from hyv_lib.parallel.distributed import run_distributed
from hyv_lib.planning import gpu_memory as gm
from hyv_lib.planning.costs import model_dims, token_counts
from hyv_lib.runtimes.vae_memory import VAE_TILE_COPIES

ROOT = pathlib.Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
GIB = 2**30


def h200_row(run: int, section: str, name: str) -> dict:
    data = json.loads((RESULTS / f"gpu_check_2026-11-26_H200_run{run}.json").read_text())
    return next(r for r in data["sections"][section]["rows"] if r["name"] == name)


def three_then_free(x):
    a = x * 2
    b = a + 1
    c = b.view(-1) * 3  # a, b and c alive: 12 MB (a view of b adds nothing)
    del a, b
    return c.sum()


@pytest.mark.parametrize("probe", [live_peak_bytes, output_peak_bytes])
def test_both_probes_count_what_is_alive_at_once(probe):
    x = torch.ones(1000, 1000)  # 4 MB, allocated before
    assert probe(lambda: three_then_free(x)) == pytest.approx(3 * 4_000_000, abs=64)  # + the sum's few bytes


@pytest.mark.filterwarnings("ignore:TF32 acceleration on top of oneDNN:UserWarning")  # mkldnn.flags sets it back
def test_the_output_probe_leaves_out_a_kernels_own_scratch():
    """A 3-d convolution through torch's im2col kernel (oneDNN off) holds a column buffer of in-channels x 27 x the
    output inside the kernel: the profiler sees it, the outputs do not (input, weight and output are the rest)."""
    x, conv = torch.randn(1, 4, 8, 16, 16), torch.nn.Conv3d(4, 4, 3, padding=1, bias=False).requires_grad_(False)
    output = 4 * 8 * 16 * 16 * 4
    with torch.backends.mkldnn.flags(enabled=False):
        assert output_peak_bytes(lambda: conv(x)) == output
        assert live_peak_bytes(lambda: conv(x)) >= output + 4 * 27 * 8 * 16 * 16 * 4


# ---------------------------------------------------------------------------------------------- weights
def test_weights_by_hand_replicated_fsdp_and_offload():
    """Per block from the config by hand (h = 2048, f = 4h, head dim 128): two streams of q, k, v, out (4 (h^2 + h))
    and an MLP (2 h f + f + h), two AdaLN linears h -> 6h, four QK norms; the total from the H200 run's count."""
    h, f, hd, blocks = 2048, 8192, 128, 54
    block = (2 * (4 * (h * h + h) + 2 * h * f + f + h) + 2 * (6 * h * h + 6 * h) + 4 * hd) * 2
    total = json.loads((RESULTS / "gpu_check_2026-11-26_H200_run2.json").read_text())[
        "sections"]["model"]["parameters"] * 2
    outside = total - blocks * block
    layout = gm.weight_layout("720p_t2v")
    assert (layout["block"], layout["total"], layout["blocks_count"]) == (block, total, blocks)
    size = ("720p_t2v", 720, 1280, 121)
    assert gm.step_memory(*size)["weights"] == total
    # fsdp on 4 GPUs: every block dimension divides by 4 (no padding); the root's parameters gathered for the step;
    # the running block gathered and the next one's all-gather buffer
    assert gm.step_memory(*size, gpus=4, weights="fsdp", ulysses=True)["weights"] == blocks * block // 4 + outside \
        + 2 * block
    assert gm.step_memory(*size, offload="block")["weights"] == outside + 2 * block
    assert gm.step_memory(*size, offload="model")["weights"] == total


# ------------------------------------------------------------------------------------- H200 measurements
H200 = [  # (run, section, row name, what the model computes: step layout or the VAE decode)
    (2, "step", "hyv_lib 480p", dict(offload="none")),
    (3, "step", "hyv_lib 720p", dict(offload="none")),
    (1, "step", "hyv_lib 720p", dict(offload="none")),  # torch_varlen's run: the attention phase is not the peak
    (2, "offload", "block offload 480p", dict(offload="block")),
    (2, "vae", "vae decode 720x1280x121", None),
]


@pytest.mark.parametrize("run, section, name, layout", H200, ids=[f"run{r}-{n}" for r, _, n, _ in H200])
def test_peaks_match_the_h200(run, section, name, layout):
    """torch's allocated peak on one H200 (random bf16 weights, batch 2 CFG) against the model's ``allocated`` (the
    CUDA context is outside torch's peaks). Errors: -0.015 (480p), -0.006 (720p), -0.016 (run 1's 720p), -0.006
    (block offload), -0.11 GiB (VAE decode, 0.7%): 0.05 GiB for the steps (the JSON rounds to 0.01), 0.3 for the VAE."""
    row = h200_row(run, section, name)
    height, width, frames = row["size"] if "size" in row else (720, 1280, 121)
    if layout is None:
        model = gm.vae_decode_memory("720p_t2v", height, width, frames, vae_dtype=row["dtype"])
        tolerance = 0.3
    else:
        model = gm.step_memory("720p_t2v", height, width, frames, **layout)
        tolerance = 0.05
    assert model["allocated"] / GIB == pytest.approx(row["peak_allocated_gib"], abs=tolerance)


def test_attention_call_matches_the_h200():
    """The 720p attention call on the H200 (SDPA, q, k, v made first): its peak holds the model's attention
    temporaries plus one more output, which the timing loop keeps from the previous call: 4.77 vs 4.80 GiB."""
    row = h200_row(2, "attention", "sdpa")
    model = gm.step_memory("720p_t2v", 720, 1280, 121)
    tokens = token_counts("720p_t2v", 720, 1280, 121)["joint"]
    previous_output = 2 * tokens * model_dims(get_preset("720p_t2v"))["hidden"] * 2
    assert (model["attention"] + previous_output) / GIB == pytest.approx(row["peak_allocated_gib"], abs=0.1)
    assert row["largest_tensor_elements"] == 2 * 16 * tokens * 128  # q: no S x S tensor


# ------------------------------------------------------------------- live bytes on the CPU at tiny widths
def tiny_preset(heads=2, layers=2):
    """The tiny classes at the 720p preset's layout (1,985 context tokens)."""
    preset = real_layout_tiny(get_preset("720p_t2v"))
    return dataclasses.replace(preset, transformer=dict(preset.transformer, num_attention_heads=heads,
                                                        num_layers=layers))


def tiny_step(height, width, frames, heads=2, layers=2):
    """:func:`tiny_preset`'s transformer in bf16 and a CFG batch of its inputs."""
    from hyv_lib.models.registry import get_adapter

    preset = tiny_preset(heads, layers)
    adapter = get_adapter(preset.model)
    torch.manual_seed(0)
    model = adapter.build(preset.transformer).to(torch.bfloat16).eval().requires_grad_(False)
    kwargs = adapter.example_inputs(preset, height, width, frames, batch=2, dtype=torch.bfloat16)
    kwargs["hidden_states"] = torch.randn_like(kwargs["hidden_states"])
    kwargs["timestep"] = kwargs["timestep"].to(torch.bfloat16)
    return preset, adapter, model, kwargs


def test_step_activations_match_live_bytes_on_the_cpu():
    """diffusers' forward with hyv_lib's attention at tiny widths, where the blocks' tensors dominate (7,950 video
    tokens): the model's activations and RoPE tables against the measured peak (0.1% apart; 1% allowed)."""
    size = (480, 848, 17)
    preset, adapter, model, kwargs = tiny_step(*size)
    adapter.use_attention(model, "sdpa")
    with torch.no_grad():
        measured = live_peak_bytes(lambda: model(**kwargs, return_dict=False))
    m = gm.step_memory(preset, *size)
    rope = 2 * token_counts(preset, *size)["video"] * model_dims(preset)["head_dim"] * 4
    assert m["peak_phase"] == "mlp"
    assert m["activations"] + rope == pytest.approx(measured, rel=0.01)


def ulysses_live_peak(height, width, frames):
    """One rank's peak live bytes in a Ulysses step of one block (module level: run_distributed's ranks import it):
    the least of three calls, each after a barrier and a pause. gloo's worker thread can release a collective's
    buffers some time after the call that used them returns; a busy machine then adds them to a later phase's peak
    (seen: up to 4 more copies of the local stream), never takes any away."""
    import time

    import torch.distributed as dist

    from hyv_lib.runtimes.ulysses import UlyssesTransformer

    _, _, model, kwargs = tiny_step(height, width, frames, heads=4, layers=1)
    step = UlyssesTransformer(model, attention_backend="sdpa")
    with torch.no_grad():
        step(**kwargs)  # the RoPE tables are cached on the first call
        peaks = []
        for _ in range(3):
            dist.barrier()
            time.sleep(0.3)
            peaks.append(live_peak_bytes(lambda: step(**kwargs)))
        return min(peaks)


def test_ulysses_activations_match_live_bytes_on_two_cpu_ranks():
    """Rank 0 of 2 gloo ranks: q, k, v going from sequence to head shards hold 17 local copies of the video stream and
    2 of the replicated context (measured 17.58, modelled 17.55 copies: 0.2% apart; 1% allowed)."""
    size = (480, 848, 33)
    measured = run_distributed(ulysses_live_peak, 2, *size, timeout=240)
    m = gm.step_memory(tiny_preset(heads=4, layers=1), *size, gpus=2, ulysses=True)
    assert m["peak_phase"] == "all_to_all"
    assert m["activations"] == pytest.approx(measured, rel=0.01)


def test_vae_tile_copies_match_live_bytes_on_the_cpu():
    """diffusers' VAE decoder on one tile (a frame no larger than a tile is decoded whole) at tiny widths (c0 = 8):
    7 + 2 / c0 copies of c0 x F x H x W at its peak (measured 7.255: 0.07% apart; 1% allowed). Counted from the
    operators' outputs, not the profiler: the profiler also sees a CPU kernel's own scratch, and on a CPU without
    oneDNN's bf16 convolution torch's im2col path holds 4.45 times as much (measured), which a GPU does not."""
    import diffusers

    from hyv_lib.runtimes.vae import decode_latents

    size = (128, 128, 9)
    preset = real_layout_tiny(get_preset("720p_t2v"))
    torch.manual_seed(0)
    vae = diffusers.AutoencoderKLHunyuanVideo15(**preset.vae).to(torch.bfloat16).eval().requires_grad_(False)
    _, c, t, h, w = preset.latent_shape(*size)
    z = torch.randn(1, c, t, h, w, dtype=torch.bfloat16)
    measured = output_peak_bytes(lambda: decode_latents(vae, z, tiling=True))
    m = gm.vae_decode_memory(preset, *size)
    assert m["tiles"] == 1
    assert m["decode"] == pytest.approx(measured, rel=0.01)


# ------------------------------------------------------------------------------------------- consistency
SIZES = [("480p_t2v", 480, 848, 121), ("720p_t2v", 720, 1280, 121), ("720p_t2v", 720, 1280, 33)]


@pytest.mark.parametrize("size", SIZES)
def test_more_gpus_never_need_more_memory_under_ulysses(size):
    for weights in gm.WEIGHTS:
        steps = [gm.step_memory(*size, gpus=n, weights=weights, ulysses=True)["total"] for n in (1, 2, 4, 8, 16)]
        assert steps == sorted(steps, reverse=True), (weights, steps)
        decodes = [gm.gpu_memory(*size, n, weights, True)["decode"] for n in (2, 4, 8, 16)]
        assert decodes == sorted(decodes, reverse=True)


@pytest.mark.parametrize("size", SIZES)
def test_fsdp_needs_less_than_replicated_on_several_gpus(size):
    for n in (2, 4, 8):
        for ulysses in (True, False):
            fsdp = gm.gpu_memory(*size, n, "fsdp", ulysses)
            replicated = gm.gpu_memory(*size, n, "replicated", ulysses)
            assert fsdp["step"] < replicated["step"] and fsdp["pipeline"] < replicated["pipeline"], (n, ulysses)


@pytest.mark.parametrize("size", SIZES)
def test_offload(size):
    resident, block, model = (gm.gpu_memory(*size, offload=o) for o in ("none", "block", "model"))
    assert block["step"] < resident["step"] == model["step"]  # model offload keeps the whole DiT for the step ...
    assert model["pipeline_decode"] == model["decode"] < resident["pipeline_decode"]  # ... and frees it for the VAE
    assert resident["pipeline_decode"] - resident["decode"] == pytest.approx(gm.weight_layout("720p_t2v")["total"] / GIB)


def test_fits_uses_the_cards_reported_memory_and_the_headroom():
    card = gm.CARDS[80].usable_bytes
    assert gm.fits(0.9 * card, 80) and not gm.fits(0.9 * card + 1, 80)
    assert gm.fits(card, 80, headroom=0.0)
    assert gm.CARDS[24].usable_bytes == 24 * 10**9  # the vendor's GB, nothing subtracted
    environment = json.loads((RESULTS / "gpu_check_2026-11-26_H200_run2.json").read_text())["sections"]["environment"]
    assert gm.CARDS[141].usable_bytes == environment["memory_mib"] * 2**20


def test_table_rows_and_markdown():
    rows = gm.gpu_memory_table(presets=("720p_t2v",), gpus=(1, 4), cards_gb=(24, 141))
    assert [r["layout"] for r in rows] == ["one GPU", "one GPU, offload block", "one GPU, offload model", "Ulysses",
                                           "Ulysses + fsdp", "fsdp (no Ulysses)"]
    one = rows[0]
    assert one["fits"] == {24: "no", 141: "yes"}  # 26.5 GiB for the step alone
    assert rows[2]["fits"][141] == "yes" and rows[1]["step_gib"] < one["step_gib"]
    text = gm.gpu_memory_markdown(rows)
    assert text.count("\n") == len(rows) + 4 and "| 24 GB | 141 GB |" in text
    assert text.startswith("**720p_t2v, 720x1280, 121 frames** (GiB per GPU, modelled)\n\n| Layout | GPUs |")


def test_bad_input_names_the_argument():
    size = ("720p_t2v", 720, 1280, 121)
    for kwargs, argument in [(dict(gpus=0), "gpus"), (dict(gpus=3, ulysses=True), "gpus"),
                             (dict(weights="tp"), "weights"), (dict(offload="disk"), "offload"),
                             (dict(ulysses="yes"), "ulysses"), (dict(gpus=2, ulysses=True, offload="block"), "offload"),
                             (dict(gpus=2, weights="fsdp", offload="model"), "offload")]:
        with pytest.raises(HyvInputError) as err:
            gm.step_memory(*size, **kwargs)
        assert err.value.argument == argument, kwargs
    with pytest.raises(HyvInputError) as err:
        gm.step_memory("720p_t2v", 720, 1280, 120)  # frames must be 4n + 1
    assert err.value.argument == "video_length"
    with pytest.raises(HyvInputError) as err:
        gm.vae_decode_memory(*size, vae_dtype="fp8")
    assert err.value.argument == "vae_dtype"
    for call, argument in [(lambda: gm.gpu_memory_table(cards_gb=(40,)), "cards_gb"),
                           (lambda: gm.fits(1, 80, headroom=1.5), "headroom")]:
        with pytest.raises(HyvInputError) as err:
            call()
        assert err.value.argument == argument


# ------------------------------------------------------------------------------------------------ the book
PAGE = ROOT / "book" / "setup_gpu.md"


def test_the_gpu_setup_page_shows_the_functions_table():
    """book/setup_gpu.md's static tables are exactly what the command it names prints (so they cannot drift)."""
    shown = re.search(r"% gpu_memory_table: begin\n(.*?)% gpu_memory_table: end", PAGE.read_text(), re.S).group(1)
    assert shown == gm.gpu_memory_markdown(gm.gpu_memory_table())


def test_the_gpu_setup_page_numbers():
    """The page's measured-against-modelled table (measured: the H200 JSON; modelled: ``allocated``) and its other
    numbers."""
    page = PAGE.read_text()
    rows = {
        "one step, 480p": (h200_row(2, "step", "hyv_lib 480p"), gm.step_memory("720p_t2v", 480, 848, 121)),
        "one step, 720p": (h200_row(3, "step", "hyv_lib 720p"), gm.step_memory("720p_t2v", 720, 1280, 121)),
        "one step, 480p, `--offload block`": (h200_row(2, "offload", "block offload 480p"),
                                              gm.step_memory("720p_t2v", 480, 848, 121, offload="block")),
        "tiled VAE decode, 720p, bf16": (h200_row(2, "vae", "vae decode 720x1280x121"),
                                         gm.vae_decode_memory("720p_t2v", 720, 1280, 121)),
    }
    for label, (row, model) in rows.items():
        line = f"| {label} | {row['peak_allocated_gib']:.2f} | {model['allocated'] / GIB:.2f} |"
        assert line in page, line
    one = gm.step_memory("720p_t2v", 720, 1280, 121)
    vae = gm.vae_decode_memory("720p_t2v", 720, 1280, 121)
    unit = 128 * 121 * 256 * 256 * 2
    r480, r720 = h200_row(2, "step", "hyv_lib 480p"), h200_row(3, "step", "hyv_lib 720p")
    for text in [f"{one['attention'] / GIB:.1f} GiB at 720p",
                 f"the whole VAE ({vae['weights'] / GIB:.1f} GiB in bf16)", f"= {unit / GIB:.1f} GiB",
                 f"{gm.STEP_STREAM_COPIES + 2 * 4} copies of the video tokens",
                 f"{gm.BLOCK_CONTEXT_COPIES + gm.FORWARD_CONTEXT_COPIES} of the 1,985 context tokens",
                 f"{gm.ULYSSES_HELD_COPIES + gm.ULYSSES_ALL_TO_ALL_COPIES} copies of a GPU's share",
                 f"and {gm.ULYSSES_CONTEXT_COPIES} of the context", f"{VAE_TILE_COPIES} copies of its last up block",
                 f"{gm.ALLOCATOR_WORKSPACE / GIB:.2f} GiB that torch's allocator",
                 f"CUDA context outside torch's allocator, {gm.CUDA_CONTEXT / GIB:.1f} GiB",
                 f"leaves {gm.HEADROOM:.0%} of the card free",
                 f"by {r480['peak_reserved_gib'] / r480['peak_allocated_gib'] - 1:.0%} at 480p and "
                 f"{r720['peak_reserved_gib'] / r720['peak_allocated_gib'] - 1:.0%} at 720p"]:
        assert text in " ".join(page.split()), text

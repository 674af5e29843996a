"""The training memory model (hyv_lib.planning.train_memory) against peft's LoRA parameter count, a hand count of the
real 8.3B model's state, the tensors one block saves for its backward (torch's saved_tensors_hooks), the live tensor
bytes of real train steps measured on the CPU at tiny widths and the TPU compiler's reports of the real step."""

import collections
import dataclasses
import json
import pathlib

import pytest
import torch
from memory_probe import live_peak_bytes
from peft.utils import get_peft_model_state_dict

from hyv_lib.base.errors import HyvInputError
from hyv_lib.models.families import get_preset
from hyv_lib.models.hunyuan_video15.presets import real_layout_tiny
from hyv_lib.models.flow_matching import flow_matching_loss
from hyv_lib.models.lora import add_lora
from hyv_lib.models.registry import get_adapter
from hyv_lib.planning import gpu_memory as gm
from hyv_lib.planning import train_check
from hyv_lib.planning import train_memory as tm

ROOT = pathlib.Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
GIB = 2**30


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def tiny_model(kind: str, heads: int = 2, head_dim: int = 16, layers: int = 2, rank: int = 4):
    """The tiny classes at the 720p preset's layout (1,985 context tokens), bf16, hyv_lib's SDPA attention, set up to
    train ``kind``: ``full`` (every weight), ``lora`` (bf16 factors) or ``lora_fp32`` (fp32 factors on the bf16
    weights, as hyv_lib.runtimes.torch_train keeps them in one process)."""
    preset = real_layout_tiny(get_preset("720p_t2v"))
    preset = dataclasses.replace(preset, transformer=dict(preset.transformer, num_attention_heads=heads,
                                                          attention_head_dim=head_dim, num_layers=layers))
    adapter = get_adapter(preset.model)
    torch.manual_seed(0)
    model = adapter.build(preset.transformer).to(torch.bfloat16)
    adapter.use_attention(model, "sdpa")
    model.requires_grad_(kind == "full")
    if kind != "full":
        add_lora(model, rank)
        for name, param in model.named_parameters():
            if "lora_" in name and kind == "lora_fp32":
                param.data = param.data.float()
    return preset, adapter, model


# ------------------------------------------------------------------------------------------------- LoRA
def test_lora_parameters_equal_peft_on_the_tiny_transformer():
    """add_lora (peft through diffusers) on the tiny model: its trainable parameters, counted by peft, are the model's
    count, on the default targets (both streams' attention projections) and on a list of names."""
    for rank, targets in ((4, None), (3, ["to_q", "to_v"])):
        preset, _, model = tiny_model("lora", rank=rank) if targets is None else tiny_model("full")
        if targets is not None:
            model.requires_grad_(False)
            add_lora(model, rank, target_modules=targets)
        counted = tm.lora_parameters(preset, rank, targets)
        adapter_weights = get_peft_model_state_dict(model)
        assert counted["params"] == sum(t.numel() for t in adapter_weights.values())
        assert counted["modules"] == len(adapter_weights) // 2
    # to_q and to_v also name the token refiner's attention: peft's suffix rule takes them, outside the blocks
    assert counted["block_params"] < counted["params"]


def test_real_model_state_by_hand():
    """The 8.3B model (parameter count of the H200 run's build): bf16 weights 2 bytes each; a rank-16 LoRA on the 8
    attention projections of each of the 54 blocks (2048 x 2048 each): 54 x 8 x 16 x (2048 + 2048) parameters;
    recipes: full fine-tuning with fp32 master, gradient and moments 16 bytes per parameter (``mixed``), torch's
    bf16 weights, gradients and moments 8 (``torch``), fp32 LoRA factors 16; FSDP over 8 an eighth of each."""
    params = json.loads((RESULTS / "gpu_check_2026-11-26_H200_run2.json").read_text())["sections"]["model"][
        "parameters"]
    assert params == 8_326_608_160
    lora = 54 * 8 * 16 * (2048 + 2048)
    assert tm.lora_parameters("720p_t2v", 16) == dict(params=lora, modules=54 * 8, block_params=lora,
                                                      largest=16 * 2048)
    size = dict(height=720, width=1280, video_length=121)
    mixed = tm.train_step_memory("720p_t2v", **size, trainable="full", precision="mixed", device="tpu")
    assert (mixed["weights"], mixed["master"], mixed["gradients"], mixed["optimizer"]) == (0, 4 * params,
                                                                                          4 * params, 8 * params)
    assert mixed["buffers"] == 2 * params  # the bf16 copy the forward uses
    assert mixed["bytes_per_trained_param"] == 16
    # torch: no gradient reaches the last block's to_add_out and ff_context (its context output feeds nothing), so
    # torch.optim.AdamW keeps no moments for them: h^2 + h + 2 (h f) + f + h weights; their LoRA factors 16 x 2h
    h, f = 2048, 8192
    dead, dead_lora = h * h + h + 2 * h * f + f + h, 16 * 2 * h
    torch_full = tm.train_step_memory("720p_t2v", **size, trainable="full", precision="torch")
    live = params - dead
    assert (torch_full["weights"], torch_full["gradients"], torch_full["optimizer"],
            torch_full["optimizer_temporaries"]) == (2 * params, 2 * live, 4 * live, 2 * live)
    torch_lora = tm.train_step_memory("720p_t2v", **size)
    assert (torch_lora["weights"], torch_lora["gradients"], torch_lora["optimizer"]) == (
        2 * params + 4 * lora, 4 * (lora - dead_lora), 8 * (lora - dead_lora))
    # FSDP over 8: a rank holds an eighth of every parameter, padded along its first dimension: only cond_type_embed's
    # 3 rows of 2048 pad (to 8: 5 x 2048 bf16 = 20,480 bytes over the 8 ranks)
    shard = gm.fsdp_shard_bytes(get_preset("720p_t2v"), 8, "bf16")
    assert shard * 8 == 2 * params + 5 * 2048 * 2
    sharded = tm.train_step_memory("720p_t2v", **size, trainable="full", precision="mixed", fsdp=8, data_parallel=8,
                                   device="tpu")
    assert (sharded["master"], sharded["optimizer"]) == pytest.approx((2 * shard, 4 * shard))
    layout = gm.weight_layout("720p_t2v")
    assert sharded["buffers"] == pytest.approx(shard + layout["outside"] + 3 * layout["block"])


def test_real_model_activations_by_hand():
    """720p, 121 frames, LoRA with remat, one sample: 31 x 45 x 80 = 111,600 video and 1,985 context tokens; each of
    the 54 checkpoints keeps its inputs in bf16; the recomputed block keeps, per token of each stream (torch's fp32
    factors), 3 h + f bf16 and 6 h + 2 heads + 4 r fp32 plus 4 statistics, and per joint token 4 h bf16 and one
    log-sum-exp per head; the last block's backward adds its measured extra."""
    m = tm.train_step_memory("720p_t2v", height=720, width=1280, video_length=121)
    nv, nc, h, f, heads, r = 111_600, 1_985, 2048, 8192, 16, 16
    assert m["activation_parts"]["held"] == 54 * (nv + nc) * h * 2
    stream = (3 * h + f + 4) * 2 + (6 * h + 2 * heads + 4 * r) * 4
    joint = 4 * h * 2 + heads * 4
    assert m["activation_parts"]["block_saved"] == (nv + nc) * (stream + joint)
    assert m["peak_phase"] == "backward_start"
    extra = (nv * tm.LAST_BLOCK_EXTRA["lora"]["video"] + nc * tm.LAST_BLOCK_EXTRA["lora"]["context"]) * h * 2
    rope, prediction = 2 * nv * 128 * 4, nv * 32 * 2  # RoPE tables fp32; the step holds its bf16 output
    assert m["transient"] == pytest.approx(54 * (nv + nc) * h * 2 + (nv + nc) * (stream + joint) + extra + rope
                                           + prediction)
    # Ulysses over 8 splits the video tokens and the heads; the context stays whole on every rank
    u = tm.train_step_memory("720p_t2v", height=720, width=1280, video_length=121, sequence_parallel=8)
    assert u["activation_parts"]["held"] == 54 * (nv // 8 + nc) * h * 2
    assert u["activation_parts"]["block_saved"] == (nv // 8 + nc) * stream + (nv + nc) * (4 * h // 8 * 2 + 2 * 4)


# ----------------------------------------------------------------------------------- one block's census
def block_census(kind: str, heads: int, head_dim: int, video: int, context: int, rank: int = 5,
                 grad_in: bool = True) -> tuple[collections.Counter, int, int]:
    """Storages one block's forward saves for its backward that it allocated itself (its inputs, RoPE tables and
    weights excluded), counted by (stream, width class); and their bytes, those with a token dimension and the rest
    (per-sample modulation vectors)."""
    _, _, model = tiny_model(kind, heads, head_dim, layers=1, rank=rank)
    block = model.transformer_blocks[0]
    h = heads * head_dim
    x = torch.randn(1, video, h, dtype=torch.bfloat16, requires_grad=grad_in)
    c = torch.randn(1, context, h, dtype=torch.bfloat16, requires_grad=grad_in)
    temb, mask = torch.randn(1, h, dtype=torch.bfloat16), torch.ones(1, context, dtype=torch.bool)
    rope = (torch.randn(video, head_dim), torch.randn(video, head_dim))
    before = {t.untyped_storage().data_ptr() for t in [*model.parameters(), x, c, temb, mask, *rope]}
    seen = {}

    def pack(t):
        key = t.untyped_storage().data_ptr()
        if key not in before:
            seen.setdefault(key, t.untyped_storage().nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        block(x, c, temb, mask, rope)
    widths = {2 * h: "h", 2 * 4 * h: "f", 4 * h: "h_fp32", 4 * heads: "heads_fp32", 2: "stats", 2 * rank: "rank",
              4 * rank: "rank_fp32"}
    counts, tokens, other = collections.Counter(), 0, 0
    for nbytes in seen.values():
        for n, stream in ((video + context, "joint"), (video, "video"), (context, "context")):
            if nbytes % n == 0 and nbytes // n in widths:
                counts[(stream, widths[nbytes // n])] += 1
                tokens += nbytes
                break
        else:
            other += nbytes
    return counts, tokens, other


@pytest.mark.parametrize("kind", ["full", "lora", "lora_fp32"])
def test_block_saves_what_the_model_counts(kind):
    """saved_tensors_hooks on one block (3 heads x 20, 301 video and 67 context tokens: every width class distinct):
    the counts by stream and width are :data:`BLOCK_SAVED`'s, and the bytes :func:`block_saved_bytes`'s exactly;
    the per-sample tensors left out are under 0.3%. A LoRA's first block (inputs without gradient): 2 statistics
    fewer per token."""
    for grad_in in (True, False) if kind != "full" else (True,):
        counts, tokens, other = block_census(kind, 3, 20, 301, 67, grad_in=grad_in)
        saved = tm.BLOCK_SAVED[kind]
        expected = collections.Counter()
        for stream, spec in (("video", saved["stream"]), ("context", saved["stream"]), ("joint", saved["joint"])):
            for field in dataclasses.fields(spec):
                first = field.name == "stats" and stream != "joint" and not grad_in
                value = getattr(spec, field.name) - (tm.FIRST_BLOCK_STATS if first else 0)
                if value:
                    expected[(stream, field.name)] = value
        assert counts == expected, (grad_in, counts)
        model = tm.block_saved_bytes(kind, video_tokens=301, context_tokens=67, hidden=60, mlp=240, heads=3, rank=5,
                                     first=not grad_in)
        assert tokens == model
        assert other < 0.003 * tokens


def one_block_backward(kind: str, video: int, context: int, last: bool, heads: int = 3,
                       head_dim: int = 16) -> int:
    """Torch's peak of live tensor bytes over one block's forward and backward (the gradients of its outputs made
    beforehand; the last block's context output gets none), after a first call (the weights' gradients exist)."""
    _, _, model = tiny_model(kind, heads, head_dim, layers=1, rank=5)
    block = model.transformer_blocks[0]
    h = heads * head_dim
    x = torch.randn(1, video, h, dtype=torch.bfloat16, requires_grad=True)
    c = torch.randn(1, context, h, dtype=torch.bfloat16, requires_grad=True)
    temb, mask = torch.randn(1, h, dtype=torch.bfloat16), torch.ones(1, context, dtype=torch.bool)
    rope = (torch.randn(video, head_dim), torch.randn(video, head_dim))
    gx, gc = torch.randn_like(x), torch.randn_like(c)

    def forward_backward():
        out = block(x, c, temb, mask, rope)
        torch.autograd.backward(out[0], gx) if last else torch.autograd.backward(out, (gx, gc))

    forward_backward()
    return live_peak_bytes(forward_backward)


#: (what trains, the last block or not, the model's measured relative error)
BLOCKS = [("full", False, -0.011), ("full", True, -0.010), ("lora_fp32", False, -0.035), ("lora_fp32", True, -0.050)]


@pytest.mark.parametrize("kind, last, error", BLOCKS, ids=[f"{k}-{'last' if a else 'inner'}" for k, a, _ in BLOCKS])
def test_one_block_backward_peak_at_another_width(kind, last, error):
    """The saved tensors plus the measured :data:`BACKWARD_EXTRA` / :data:`LAST_BLOCK_EXTRA` (found at h = 60 to 64,
    head_dim 16 to 32) against one block's measured backward peak at h = 48 (3 heads x 16, 1,601 video and 317
    context tokens), where the extra itself is larger (6.15 video copies for full, 10.2 with fp32 LoRA factors;
    the context's -1.25 and +5 for the latter): the peak within 6%. Measured -1.0% to -5.0% on one machine; on
    another (avx512 with bf16 kernels) the full fine-tuning rows read -5.2%: torch's CPU kernels' workspaces differ
    by machine, so the test holds the model to the 6% it claims, not to one machine's error."""
    measured = one_block_backward(kind, 1601, 317, last)
    key = "full" if kind == "full" else "lora"
    copies = (tm.LAST_BLOCK_EXTRA if last else tm.BACKWARD_EXTRA)[key]
    model = tm.block_saved_bytes(kind, video_tokens=1601, context_tokens=317, hidden=48, mlp=192, heads=3, rank=5) \
        + (1601 * copies["video"] + 317 * copies["context"]) * 48 * 2
    assert abs(model / measured - 1) < 0.06, (model / measured - 1, error)


# ------------------------------------------------------------------------------ a whole train step, tiny
def live_train_step(kind: str, remat: bool) -> tuple[object, int]:
    """Torch's peak of live tensor bytes over one train step (forward, flow-matching loss, backward, gradient clipping,
    AdamW) of the 2-block tiny model at 480x848x17 (7,950 video tokens, one sample), after a first step, over the
    weights and AdamW's state."""
    preset, adapter, model = tiny_model(kind)
    if remat:
        model.enable_gradient_checkpointing()
    model.train()
    kwargs = adapter.example_inputs(preset, 480, 848, 17, batch=1, dtype=torch.bfloat16)
    g = torch.Generator().manual_seed(1)
    for key in ("hidden_states", "encoder_hidden_states", "encoder_hidden_states_2"):
        kwargs[key] = torch.randn(kwargs[key].shape, generator=g).to(torch.bfloat16)
    kwargs["timestep"] = kwargs["timestep"].to(torch.bfloat16)
    target = torch.randn(1, preset.latent_channels, *kwargs["hidden_states"].shape[2:], generator=g)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-4)

    def step():  # hyv_lib.runtimes.torch_train.TorchTrainStep.step's order (it holds the prediction to the end)
        prediction = model(**kwargs, return_dict=False)[0]
        loss = flow_matching_loss(prediction, target)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()

    step()
    for p in params:  # what a step keeps is the weights and AdamW's state; the last gradients go before it starts
        p.grad = None
    return preset, live_peak_bytes(step)


#: (what trains, remat, the measured relative error of the model's peak)
STEPS = [("lora_fp32", True, 0.042), ("lora_fp32", False, 0.006), ("lora", True, 0.049), ("full", True, 0.060),
         ("full", False, -0.032)]


@pytest.mark.parametrize("kind, remat, error", STEPS, ids=[f"{k}-{'remat' if r else 'no_remat'}" for k, r, _ in STEPS])
def test_train_step_peak_matches_live_bytes(kind, remat, error):
    """The model's ``transient`` (what a step allocates over the weights and optimizer state kept between steps) against
    torch's measured peak: within 7% (measured: LoRA +4.2% and +0.6% with fp32 factors, +4.9% bf16; full +6.0% and
    -3.2%, where the tiny model's embedders, 2048 wide at every size, weigh most). The saved tensors are exact (above);
    what is off is the backward's extra at this width (h = 32)."""
    preset, measured = live_train_step(kind, remat)
    precision = "torch" if kind == "lora_fp32" else "bf16"
    m = tm.train_step_memory(preset, height=480, width=848, video_length=17, trainable="full" if kind == "full" else
                             "lora", lora_rank=4, remat=remat, precision=precision, device="cpu")
    assert m["transient"] / measured - 1 == pytest.approx(error, abs=0.01)
    assert abs(m["transient"] / measured - 1) < 0.07


def test_optimizer_state_matches_torch_train_step():
    """hyv_lib.runtimes.torch_train.TorchTrainStep after one step on the tiny model: its parameters and AdamW state
    hold exactly the bytes of the ``torch`` recipe (fp32 LoRA factors, moments in each parameter's dtype)."""
    torch_step = pytest.importorskip("hyv_lib.runtimes.torch_train")
    for kind in ("lora", "full"):
        preset, adapter, model = tiny_model("lora" if kind == "lora" else "full")
        step = torch_step.TorchTrainStep(model, trainable=kind, remat=True)
        kwargs = adapter.example_inputs(preset, 64, 64, 5, batch=1, dtype=torch.float32)
        kwargs.pop("timestep_r", None)
        kwargs["target"] = torch.zeros(1, preset.latent_channels, *kwargs["hidden_states"].shape[2:])
        step.step(kwargs)
        state = tm.state_bytes(preset, kind, lora_rank=4, precision="torch")
        weights = sum(p.numel() * p.element_size() for p in model.parameters())
        moments = sum(t.numel() * t.element_size() for s in step.optimizer.state.values()
                      for k, t in s.items() if k != "step")
        assert (weights, moments) == (state["weights"], state["optimizer"]), kind


# ------------------------------------------------------------------------------------------ the TPU compiler
def compiled_reports() -> list[dict]:
    """The TPU compiler's train-step reports saved by benchmarks/train_compile.py (libtpu on this CPU) that compiled."""
    reports = []
    for path in sorted(RESULTS.glob("train_compile_*_cpu_libtpu.json")):
        reports += [r for r in json.loads(path.read_text())["runs"].values()
                    if (r.get("per_device_bytes") or {}).get("arguments")]
    return reports


def test_model_beside_the_tpu_compiler():
    """Each compiled 8.3B train step (FSDP over the slice, fp32 master weights and moments, remat, Splash): the model's
    state (frozen bf16 weights, fp32 masters and moments, the batch, the RoPE tables) against the compiler's arguments
    within 1.5% (measured at 480p/121f LoRA r8: 0.996 on v5p-8, 0.993 on v6e-8; 15.6 MB of the batch unaccounted).
    XLA's temporaries exceed the model's transient (8.1 vs 5.2 GiB on v5p-8, 4.4 vs 3.3 on v6e-8: its scan over the
    blocks keeps more per block than torch's checkpoints do, not modelled yet), so the model's total is a lower bound
    on a TPU: between 0.6 and 1.05 of the compiler's (measured 0.75 and 0.81)."""
    reports = compiled_reports()
    if not reports:
        pytest.skip("no benchmarks/results/train_compile_*_cpu_libtpu.json with a compiled run yet")
    for report in reports:
        m = train_check.model_of_compiled(report)
        if report["mesh"].get("data", 1) == 1 and report["batch"] > 1:
            # A batch no data axis splits (15 on v5p-8, 9 on v6e-8: sequence parallel only, the batch search's odd
            # sizes) runs unsplit; the model's state was 0.952 and 0.944 of the compiler's, its total 0.695 and 0.591.
            assert 0.93 < m["model_state_ratio"] <= 1.0 and 0.55 < m["model_total_ratio"] < 1.05, report["command"]
            continue
        assert m["model_state_ratio"] == pytest.approx(1, abs=0.015), report["command"]
        if report["train"] == "lora":  # full fine-tuning's temporaries (fp32 gradients, bf16 copies) not checked yet
            assert 0.6 < m["model_total_ratio"] < 1.05, report["command"]
    text = train_check.compiled_markdown(reports)
    assert text.count("\n") == len(reports) + 2
    assert "| v5p:2x2x1 480x848x121 b1 lora r8 | 4.0/8.0/12.1 | 4.0/5.2/9.1 | 0.76 |" in text


# ---------------------------------------------------------------------------------------------- the table
def test_table_rows_and_markdown():
    rows = tm.train_memory_table(presets=("720p_t2v",), video_lengths=(33, 121), cards_gb=(24, 141),
                                 chips=("v5e", "v5p"))
    assert [r["layout"] for r in rows[:5]] == [lay.name for lay in tm.TRAIN_LAYOUTS]
    by = {(r["video_length"], r["layout"]): r for r in rows}
    for layout in tm.TRAIN_LAYOUTS:  # more frames never need less memory
        assert by[(121, layout.name)]["gpu_gib"] >= by[(33, layout.name)]["gpu_gib"]
    assert by[(121, "full, FSDP over 8")]["gpu_gib"] < by[(121, "full, one device")]["gpu_gib"]
    assert by[(121, "LoRA, one device")]["gpu_gib"] < by[(121, "LoRA, one device, no remat")]["gpu_gib"]
    assert by[(121, "LoRA, one device, no remat")]["fits"] == {"24 GB": "no", "141 GB": "no", "v5e": "no", "v5p": "no"}
    text = tm.train_memory_markdown(rows)
    assert text.count("\n") == len(rows) + 2 * 4 + 1
    assert text.startswith("**720p_t2v, 720x1280, 33 frames** (train step, batch 1, GiB per device, modelled)\n\n"
                           "| Layout | Devices | GPU GiB | TPU GiB | 24 GB | 141 GB | v5e | v5p |")


def test_bad_input_names_the_argument():
    size = dict(height=720, width=1280, video_length=121)
    for kwargs, argument in [(dict(trainable="bias"), "trainable"), (dict(precision="fp8"), "precision"),
                             (dict(lora_rank=0), "lora_rank"), (dict(fsdp=3), "fsdp"),
                             (dict(sequence_parallel=3), "sequence_parallel"), (dict(batch_size=0), "batch_size"),
                             (dict(remat="yes"), "remat"), (dict(device="npu"), "device"),
                             (dict(lora_targets=["nothing_here"]), "target_modules"),
                             (dict(video_length=120), "video_length")]:
        with pytest.raises(HyvInputError) as err:
            tm.train_step_memory("720p_t2v", **{**size, **kwargs})
        assert err.value.argument == argument, kwargs
    for call, argument in [(lambda: tm.train_memory_table(cards_gb=(40,)), "cards_gb"),
                           (lambda: tm.train_memory_table(chips=("v9",)), "chip")]:
        with pytest.raises(HyvInputError) as err:
            call()
        assert err.value.argument == argument


def test_model_matches_the_h200_train_rows():
    """The model against the peaks measured on one H200 (benchmarks/results/gpu_check_*_run5_train.json: the 54-block
    DiT through TorchTrainStep, bf16, batch 1; nothing in the model was fitted to these rows). Measured: within 0.25%
    on all eight rows (full 480p/33f, LoRA r16 480p/720p at 33-121 frames, with and without remat)."""
    results = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "results"
    report = json.loads((results / "gpu_check_2026-11-26_H200_run5_train.json").read_text())
    section = report["sections"]["train"]
    rows = [r for r in section["rows"] if r["status"] == "ok"]
    assert len(rows) == 8
    preset = get_preset("720p_t2v")
    for row in rows:
        height, width, frames = row["size"]
        modelled = tm.train_step_memory(preset, height=height, width=width, video_length=frames,
                                        trainable=row["trainable"], lora_rank=section["lora_rank"],
                                        remat=row["remat"], precision="torch", device="gpu")
        error = modelled["allocated"] / 2**30 / row["peak_allocated_gib"] - 1
        assert abs(error) < 0.01, (row["name"], error)

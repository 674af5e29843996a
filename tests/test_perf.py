"""The analytic planner: FLOPs tied to the real classes and to XLA's counts, weight sharding, bounds, MFU."""


import pytest
import torch

from hyv_lib.models.families import get_preset
from hyv_lib.planning.costs import activation_bytes, collective_bytes, param_bytes, step_flops
from hyv_lib.planning.hardware import CHIPS, CITED_STEP_TIMES, cited_pair, layout_label, mfu
from hyv_lib.planning.hlo import xla_flops
from hyv_lib.planning.planner import bounds, device_plan, plan_table

TINY = get_preset("tiny")


def test_720p_step_flops_and_attention_share():
    f = step_flops("720p_t2v", 720, 1280, 121, batch=2)
    video_only = step_flops("720p_t2v", 720, 1280, 121, batch=2, valid_context=0)
    print(f"720p/121f CFG step: {f['total'] / 1e15:.2f} PFLOP, attention {f['attention_share']:.1%} "
          f"(S = {f['tokens']['joint']}); attending video tokens only: {video_only['total'] / 1e15:.2f} PFLOP")
    assert f["tokens"] == dict(video=31 * 45 * 80, context=1985, joint=113_585, text=1000, byt5=256, image=729,
                               batch=2, attended=113_585)
    # DESIGN.md: "about 12.6 PFLOP, about 90% attention"; anchors.md: ~12.2 PFLOP with 111,600 tokens [U].
    assert 12.2e15 <= f["total"] <= 12.7e15
    assert 0.88 <= f["attention_share"] <= 0.92
    assert 12.2e15 <= video_only["total"] < f["total"]
    assert sum(f["parts"].values()) == f["total"] == f["attention"] + f["linear"]


def test_block_linear_flops_match_the_meta_model_shapes():
    from diffusers import HunyuanVideo15Transformer3DModel

    preset = get_preset("720p_t2v")
    with torch.device("meta"):
        model = HunyuanVideo15Transformer3DModel(**preset.transformer)
    block = model.transformer_blocks[0]
    img = ("attn.to_q", "attn.to_k", "attn.to_v", "attn.to_out.0", "ff.net.0.proj", "ff.net.2")
    txt = ("attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj", "attn.to_add_out", "ff_context.net.0.proj",
           "ff_context.net.2")
    mod = ("norm1.linear", "norm1_context.linear")
    weights = {n[: -len(".weight")]: p.numel() for n, p in block.named_parameters() if p.ndim >= 2}
    assert set(weights) == set(img + txt + mod)  # every matmul of the block is counted exactly once
    w_img, w_txt, w_mod = (sum(weights[n] for n in names) for names in (img, txt, mod))

    f = step_flops(preset, 720, 1280, 121, batch=2)
    nv, nc, b, layers = f["tokens"]["video"], f["tokens"]["context"], 2, len(model.transformer_blocks)
    assert f["parts"]["blocks_linear"] + f["eager_extra"] == layers * 2 * b * (nv * w_img + nc * w_txt)
    assert f["parts"]["blocks_modulation"] == layers * 2 * b * w_mod
    assert f["eager_extra"] == 2 * b * nc * sum(weights[n] for n in txt[3:])  # last block: to_add_out + ff_context


def _tiny_kwargs(t, h, w, batch=2):
    g = torch.Generator().manual_seed(0)
    text_mask = (torch.arange(TINY.text_len)[None] < torch.tensor([14, 40])[:, None]).long()
    byt5_mask = (torch.arange(TINY.byt5_len)[None] < torch.tensor([0, 9])[:, None]).long()
    return dict(hidden_states=torch.randn(batch, 2 * TINY.latent_channels + 1, t, h, w, generator=g),
                timestep=torch.tensor([700.0] * batch),
                encoder_hidden_states=torch.randn(batch, TINY.text_len, TINY.text_dim, generator=g),
                encoder_attention_mask=text_mask,
                encoder_hidden_states_2=torch.randn(batch, TINY.byt5_len, TINY.byt5_dim, generator=g),
                encoder_attention_mask_2=byt5_mask, image_embeds=torch.zeros(batch, TINY.image_tokens, TINY.image_dim))


def test_tiny_analytic_flops_vs_xla_cost_analysis():
    pytest.importorskip("torchax")
    from hyv_lib.kernels.xla import DEFAULT_BLOCK_KV
    from hyv_lib.models.components import build_tiny_components
    from hyv_lib.runtimes.jax_step import JaxTransformer

    tpu = JaxTransformer(build_tiny_components(TINY, names=["transformer"])["transformer"], attention="xla")
    # Latent 2 x 12 x 14 -> 336 video + 176 context = 512 tokens: one key block of the XLA kernel, so its
    # lax.scan has one trip and cost_analysis sees the whole attention.
    results = {}
    for latent in ((2, 12, 14), (2, 20, 34)):
        t, h, w = latent
        x = xla_flops(tpu.lower(**_tiny_kwargs(*latent)).compile())
        f = step_flops(TINY, 16 * h, 16 * w, 4 * (t - 1) + 1, batch=2, kv_block=DEFAULT_BLOCK_KV)
        results[latent] = x, f
        print(f"tiny {latent} S={f['tokens']['joint']}: analytic {f['total'] / 1e6:.1f} MFLOP; XLA matmuls "
              f"{x['matmul'] / 1e6:.1f}; cost_analysis {x['cost_analysis'] / 1e6:.1f} "
              f"({x['cost_analysis'] / f['total'] - 1:+.2%}); transcendentals {x['transcendentals'] / 1e6:.2f} M")
        # Every dot XLA keeps is in the analytic count and nothing else is (dead last-block context dropped).
        assert x["matmul"] == f["total"] and x["unknown_trip_counts"] == 0
    x, f = results[2, 12, 14]
    # cost_analysis adds elementwise ops (1 FLOP per element: norms, GELU, modulation, bias adds, softmax).
    assert 0 < x["cost_analysis"] / f["total"] - 1 < 0.05
    # With 3 key blocks cost_analysis counts the scan body once: it undercounts, the HLO re-count does not.
    x, f = results[2, 20, 34]
    assert x["cost_analysis"] < 0.7 * f["total"]


def test_param_bytes_rules():
    from hyv_lib.parallel.sharding import Rule

    replicated = param_bytes("720p_t2v", "bf16", "replicated", 8)
    assert replicated["params"] == 8_326_608_160  # hunyuanvideo15_facts.md §1.5, meta-device count
    assert replicated["bytes_per_device"] == 2 * 8_326_608_160
    report = {}
    for rules in ("tp", "tp_replicated_out", "fsdp"):
        report[rules] = param_bytes("720p_t2v", "bf16", rules, 8)
        print(f"{rules} on 8 devices: {report[rules]['bytes_per_device'] / 1e9:.2f} GB per device "
              f"(replicated {replicated['bytes_per_device'] / 1e9:.2f} GB)")
        for row in report[rules]["rows"]:
            print(f"    {row['rule']:40s} {row['tensors']:5d} tensors {row['params'] / 1e9:6.3f} B params "
                  f"{row['bytes_per_device'] / 1e9:6.3f} GB/device")
    tp = report["tp"]
    split = [row for row in tp["rows"] if row["rule"].endswith(("column", "row"))]
    assert len(split) == 4  # q/k/v, MLP in (column); attention out, MLP out (row)
    for row in split:  # the block matmuls: exactly 1/8 of each on every device
        assert row["tensors"] > 0 and row["bytes_per_device"] * 8 == row["params"] * 2
        assert row["bytes_per_device"] < row["params"] * 2 / 4
    assert tp["bytes_per_device"] < report["tp_replicated_out"]["bytes_per_device"] < replicated["bytes_per_device"]
    # Replicating attention-out and MLP-out costs 7/8 of their 2.26 B params more per device: ~4.0 GB, as
    # gpu_tpu_pedia_facts.md §2.5 recomputes the extra HBM of gpu-tpu-pedia's fc2/proj-replicated rules.
    extra = report["tp_replicated_out"]["bytes_per_device"] - tp["bytes_per_device"]
    assert 3.9e9 < extra < 4.1e9
    assert report["fsdp"]["bytes_per_device"] < replicated["bytes_per_device"] / 6
    for rules in report.values():
        assert sum(r["params"] for r in rules["rows"]) == replicated["params"]

    with pytest.raises(ValueError, match="megatron"):
        param_bytes("720p_t2v", rules="megatron")
    with pytest.raises(ValueError, match="matched no parameter"):
        param_bytes(TINY, rules=[Rule("fused qkv", r".*\.to_qkv\.weight", ("tensor", None))], mesh_shape=2)


def test_cited_mfu_on_v6e_8():
    flops = step_flops("720p_t2v", 720, 1280, 121)["total"]
    for seconds in (7.29, 5.81):
        value = mfu(flops, seconds, "v6e", 8)
        print(f"cited (gpu-tpu-pedia, v6e-8, 720p/121f, unverified): {seconds} s/step -> MFU {value:.1%}")
        assert 0.20 <= value <= 0.40


def test_memory_collectives_bounds_and_plan_table():
    flash = activation_bytes("720p_t2v", 720, 1280, 121, mesh_shape=8, attention="flash")
    dense = activation_bytes("720p_t2v", 720, 1280, 121, mesh_shape=8, attention="dense")
    assert dense["parts"]["attention"] > CHIPS["v6e"].hbm_bytes > 100 * flash["parts"]["attention"]
    assert collective_bytes("720p_t2v", 720, 1280, 121, strategy="tp", mesh_shape=1)["bytes_per_device"] == 0
    uly = collective_bytes("720p_t2v", 720, 1280, 121, strategy="ulysses", mesh_shape=8)

    # Plain TP on tensor=8, worked by hand: 2 all-reduces per block and stream of [2, N, 2048] bf16 (the last
    # block's context stream is dead), ring factor 2 * 7/8 on the wire.
    plan = device_plan("720p_t2v", 720, 1280, 121, {"tensor": 8}, "tp")
    per_sample = 2 * 2048 * 2  # two samples, hidden 2048, bf16
    reduced = per_sample * (2 * 54 * 111_600 + 2 * 53 * 1_985)
    assert plan["collectives"]["all-reduce"] == reduced
    assert plan["sent_bytes"] == pytest.approx(reduced * 2 * 7 / 8 + plan["collectives"]["all-gather"] * 7 / 8)
    assert uly["bytes_per_device"] < plan["sent_bytes"]

    b = bounds("720p_t2v", 720, 1280, 121, "v6e", 8, "tp", mesh_shape={"tensor": 8})
    assert b["limit"] == "compute_s" and b["fits"]
    # bytes sent over half the published bidirectional ICI (800 GB/s on v6e)
    assert b["interconnect_s"] == pytest.approx(plan["sent_bytes"] / 400e9)
    assert bounds("720p_t2v", 720, 1280, 121, "v7x", 4)["interconnect_s"] is None  # no sourced figure
    assert b["compute_s"] < 5.81  # every cited time is above the compute bound
    with pytest.raises(ValueError, match="chip"):
        bounds("720p_t2v", 720, 1280, 121, "v3", 8)
    with pytest.raises(ValueError, match="heads"):
        device_plan("720p_t2v", 720, 1280, 121, {"tensor": 32}, "tp")


def test_plan_table_puts_a_cited_time_only_on_the_layout_it_was_measured_on():
    """gpu-tpu-pedia measured every v6e time on tensor=8 (its mesh is (tp, dp, sp) = (8, 1, 1)) and its H100 time with
    Ulysses over sequence=8: the table's default v6e layout, data=2,tensor=4, gets no cited time; the time sits on a
    row of its own layout, beside that layout's bounds (the old table put 5.81 s on data=2,tensor=4)."""
    assert {layout_label(c["mesh"]) for c in CITED_STEP_TIMES if c["chip"] == "v6e"} == {"tensor=8"}
    rows = plan_table()
    default = [r for r in rows if r["layout"] == "default"]
    assert len(default) == 2 * len(CHIPS) and {r["chip"] for r in default} == set(CHIPS)
    v6e = {layout_label(r["mesh"]): r for r in rows if r["preset"] == "720p_t2v" and r["chip"] == "v6e"}
    assert set(v6e) == {"data=2,tensor=4", "tensor=8"}
    assert v6e["data=2,tensor=4"]["layout"] == "default" and v6e["data=2,tensor=4"]["rules"] == "tp_replicated_out"
    assert v6e["data=2,tensor=4"]["cited_s"] is None and v6e["data=2,tensor=4"]["cited_mfu"] is None
    assert v6e["data=2,tensor=4"]["cited_source"] is None
    eight = v6e["tensor=8"]
    assert eight["layout"] == "cited" and eight["rules"] == "tp_replicated_out"
    assert eight["cited_s"] == 5.81 and 0.2 < eight["cited_mfu"] < 0.4 and "exp2" in eight["cited_source"]
    assert eight["bound_s"] == bounds("720p_t2v", 720, 1280, 121, "v6e", 8, mesh_shape={"tensor": 8})["step_s"]
    # plain TP on the same mesh carries plain TP's time; the default layout still none
    tp = plan_table(presets=("720p_t2v",), chips=("v6e",), rules="tp")
    assert {layout_label(r["mesh"]): r["cited_s"] for r in tp} == {"data=2,tensor=4": None, "tensor=8": 8.12}
    h100 = [r for r in rows if r["preset"] == "720p_t2v" and r["chip"] == "H100"]
    assert len(h100) == 1 and layout_label(h100[0]["mesh"]) == "sequence=8" and h100[0]["cited_s"] == 5.2
    assert all(r["cited_s"] is None for r in rows if r["preset"] == "480p_t2v" or r["chip"] not in ("v6e", "H100"))
    without = plan_table(presets=("720p_t2v",), chips=("v6e",), cited_layouts=False)
    assert len(without) == 1 and without[0]["cited_s"] is None


def test_cited_run_pairs_give_the_speed_ups_their_documents_state():
    """Each pair is two runs of one document; its ratio is the speed-up that document states (TORCHAX_MIGRATION_GUIDE.md:
    1.72x for DeepCache on v6e, about +24% time for segment ids; the GPU DeepCache document: 1.83x). The pair's own
    baseline is not the README's step time (350 s is 7.0 s/step, the README's stock Splash 7.29 s)."""
    tpu, gpu = cited_pair("deepcache", "v6e"), cited_pair("deepcache", "H100")
    assert round(tpu["before_s"] / tpu["after_s"], 2) == 1.72 and round(gpu["before_s"] / gpu["after_s"], 2) == 1.83
    assert round(cited_pair("segment_ids", "v6e")["after_s"] / 350 - 1, 2) == 0.24
    assert gpu["before_s"] / gpu["steps"] == next(c["seconds"] for c in CITED_STEP_TIMES if c["chip"] == "H100")
    assert tpu["before_s"] / tpu["steps"] != next(c["seconds"] for c in CITED_STEP_TIMES
                                                 if c["rules"] == "tp_replicated_out" and "stock" in c["label"])
    with pytest.raises(ValueError, match="deepcache on H100"):
        cited_pair("deepcache", "v5e")


def test_attention_hbm_traffic_follows_the_kernel_k_and_v_reread_per_query_block():
    """Splash streams all of K and V once per query block: worked by hand for 720p/121f on a v6e-8 (data=2,tensor=4,
    bf16, 2048-row blocks). Counting q, k, v and o once per block (the old roofline) gave ~48 GB and 0.023 s."""
    p = get_preset("720p_t2v")
    assert (p.transformer["num_layers"], p.transformer["num_refiner_layers"]) == (54, 2)
    joint = 31 * 45 * 80 + 729 + 256 + 1000  # 113,585 tokens, padded to 56 blocks of 2048 = 114,688
    padded, passes = 56 * 2048, 56
    assert -(-joint // 2048) == passes
    per_head = 2 * 16 * 128 * 2  # B x H x D x bf16 bytes
    blocks = 54 * per_head * (2 * padded + 2 * passes * padded)  # q read + o written once, k and v 56 times
    refiner = 2 * per_head * (2 * 1024 + 2 * 1 * 1024)  # 1,000 text tokens in one 1024-row block
    b = bounds(p, 720, 1280, 121, "v6e", 8)
    assert b["mesh"] == {"data": 2, "tensor": 4, "sequence": 1} and b["attention_passes"] == passes
    assert b["attention_hbm_bytes"] == (blocks + refiner) / 8  # 723 GB per chip
    assert b["hbm_traffic_bytes"] == b["weights_bytes"] + (blocks + refiner) / 8
    assert b["hbm_s"] == pytest.approx(b["hbm_traffic_bytes"] / 1638e9) and 0.4 < b["hbm_s"] < 0.5
    # the kernel's intensity ~ 2 block_q / 2 bytes FLOP/B: 3.5x the v6e ridge (918e12 / 1638e9 = 560), not 78x
    assert 1900 < b["attention_intensity"] < 2048
    # the lever: half the query block, twice the K/V traffic; v5e's Splash tiles are 1024 rows (VMEM limit)
    half = bounds(p, 720, 1280, 121, "v6e", 8, block_q=1024)
    assert half["attention_passes"] == 112 and half["attention_hbm_bytes"] > 1.9 * b["attention_hbm_bytes"]
    assert bounds(p, 720, 1280, 121, "v5e", 8)["attention_block_q"] == 1024


def test_fsdp_compute_splits_over_data_and_sequence_only():
    """FSDP gathers whole weights, but a tensor axis changes what XLA runs whole: Q/K/V are sliced to the local heads
    (never gathered), while to_out and the MLP run whole on each device; without a tensor axis the matmuls split by
    samples and tokens only. The fsdp planner's matmuls on a small HunyuanVideo-1.5 (16 x 128 heads, 2 blocks,
    data=2,tensor=4) are within 1.5% of the TPU compiler's (194 GFLOP per device; whole matmuls would be 242);
    tests/test_hunyuan_video_plan.py checks the same model against a compile."""
    seq = device_plan("720p_t2v", 720, 1280, 121, {"data": 2, "sequence": 4}, "fsdp")
    ten = device_plan("720p_t2v", 720, 1280, 121, {"data": 2, "tensor": 4}, "fsdp")
    tp = device_plan("720p_t2v", 720, 1280, 121, {"data": 2, "tensor": 4}, "tp")
    assert seq["flops"]["attention"] == ten["flops"]["attention"] == tp["flops"]["attention"]
    assert 3.1 < ten["flops"]["linear"] / tp["flops"]["linear"] < 3.4  # whole matmuls would be 4x; measured 3.25
    assert 0.95 < seq["flops"]["linear"] / tp["flops"]["linear"] < 1.1


def test_planner_agrees_with_the_tpu_compiler_on_v6e_8(compile_once):
    """The planner against the TPU compiler (libtpu, no TPU) on a small config for v6e:2x4, every layout the
    book prints, with real-width blocks (16 heads x 128): collective bytes per kind within 1% of the compiled
    HLO's (measured: equal), per-device memory within 3% of the compiler's total (measured: 0.2-1.6%, libtpu
    0.0.42.1)."""
    pytest.importorskip("libtpu", reason="the TPU compiler comes with libtpu (requirements.txt, Linux only)")
    import dataclasses

    small = dataclasses.replace(TINY, name="small", transformer=dict(
        TINY.transformer, num_attention_heads=16, attention_head_dim=128, num_layers=2, rope_axes_dim=[16, 56, 56]))
    for rules, mesh in (("tp", {"data": 2, "tensor": 4}), ("tp_replicated_out", {"data": 2, "tensor": 4}),
                        ("fsdp", {"data": 2, "sequence": 4}), ("tp", {"sequence": 2, "tensor": 4})):
        compiled = compile_once(small, "v6e:2x4", mesh=mesh, sharding=rules, height=256, width=256, video_length=13)
        plan = device_plan(small, 256, 256, 13, mesh, rules)
        kinds = {c["kind"]: c["bytes"] for c in compiled["collectives"]}
        total = compiled["per_device_bytes"]["total"]
        print(f"{rules} {mesh}: planner {plan['per_device_bytes']['total'] / 2**20:.1f} MiB vs compiled "
              f"{total / 2**20:.1f}; collectives planner {plan['collective_total'] / 2**20:.2f} MiB vs compiled "
              f"{sum(kinds.values()) / 2**20:.2f}")
        assert set(kinds) <= set(plan["collectives"]), (rules, kinds)
        for kind in plan["collectives"]:  # a kind carrying under 0.1% of the bytes (FSDP's 2 KiB all-reduce) may be 0
            assert plan["collectives"][kind] == pytest.approx(kinds.get(kind, 0), rel=0.01,
                                                              abs=1e-3 * sum(kinds.values())), (rules, mesh, kind)
        assert plan["per_device_bytes"]["total"] == pytest.approx(total, rel=0.03), (rules, mesh)


@pytest.mark.parametrize("change, name", [
    (dict(n_chips="8"), "n_chips"), (dict(n_chips=0), "n_chips"), (dict(n_chips=3), "n_chips"),
    (dict(height=545), "height"), (dict(width="1280"), "width"), (dict(video_length=0), "video_length"),
    (dict(video_length=120), "video_length"),
])
def test_planner_arguments_are_checked_and_named(change, name):
    """The planner's public entry point rejects what would otherwise give raw errors or meaningless numbers."""
    from hyv_lib.base.errors import HyvInputError

    kwargs = {**dict(preset="720p_t2v", height=720, width=1280, video_length=121, chip="v6e", n_chips=8), **change}
    with pytest.raises(HyvInputError) as err:
        bounds(**kwargs)
    assert err.value.argument == name


def test_device_plan_takes_the_mesh_string_and_refuses_a_data_axis_that_splits_a_sample():
    """The string form of make_step and the CLI gives the dict's plan; data=3 (or data=2 with CFG off) would split
    a sample, which the jax runtime and the TPU compiler refuse, so the planner does too instead of planning it."""
    from hyv_lib.base.errors import HyvInputError

    args = ("720p_t2v", 720, 1280, 121)
    assert device_plan(*args, "data=2,tensor=4", "tp") == device_plan(*args, {"data": 2, "tensor": 4}, "tp")
    assert bounds(*args, "v6e", 8, mesh_shape="data=2,tensor=4")["step_s"] == bounds(
        *args, "v6e", 8, mesh_shape={"data": 2, "tensor": 4})["step_s"]
    for mesh, batch in (({"data": 3, "tensor": 4}, 2), ({"data": 2, "tensor": 4}, 1), ("data:2", 2)):
        with pytest.raises(HyvInputError) as err:
            device_plan(*args, mesh, "tp", batch=batch)
        assert err.value.argument == "mesh_shape", mesh


def test_a_cfg_distilled_step_is_half_the_work_and_plans_without_a_data_axis():
    """480p_t2v_distilled runs CFG off: one sample per step instead of the pair, so every FLOP count of the step is
    exactly half of 480p_t2v's at the same size (the same DiT; all its matmuls are per sample). By hand: 848 x 480 px,
    121 frames -> 31 x 30 x 53 = 49,290 video tokens, S = 49,290 + 1,985 = 51,275; the joint blocks' attention is
    4 L B S^2 h = 4 x 54 x 1 x 51,275^2 x 2,048 = 1.16304e15 FLOP (twice that with the pair)."""
    distilled, base = (step_flops(name, 480, 848, 121) for name in ("480p_t2v_distilled", "480p_t2v"))
    assert distilled["tokens"]["joint"] == 51_275 and distilled["tokens"]["batch"] == 1
    assert distilled["parts"]["blocks_attention"] == 4 * 54 * 1 * 51_275**2 * 2048 == 1_163_041_044_480_000
    assert 2 * distilled["total"] == base["total"] and 2 * distilled["attention"] == base["attention"]
    assert all(2 * distilled["parts"][k] == v for k, v in base["parts"].items())
    assert step_flops("480p_t2v_distilled", 480, 848, 121, batch=2)["total"] == base["total"]  # an explicit batch wins
    # the planner: the default layout of 8 chips has no data axis (nothing to split), every device on tensor
    b = bounds("480p_t2v_distilled", 480, 848, 121, "v6e", 8)
    assert b["mesh"] == {"data": 1, "tensor": 8, "sequence": 1}
    assert b["flops"] * 2 == step_flops("480p_t2v", 480, 848, 121)["total"]
    plan, pair = (device_plan(name, 480, 848, 121, {"tensor": 8}) for name in ("480p_t2v_distilled", "480p_t2v"))
    assert plan["samples_per_device"] == 1 and pair["samples_per_device"] == 2
    assert plan["flops"]["total"] * 2 == pytest.approx(pair["flops"]["total"], rel=1e-12)
    from hyv_lib.base.errors import HyvInputError

    for call in (lambda: device_plan("720p_i2v_distilled", 720, 1280, 121, "data=2,tensor=4"),
                 lambda: bounds("480p_t2v_distilled", 480, 848, 121, "v6e", 8, mesh_shape="data=2,tensor=4")):
        with pytest.raises(HyvInputError) as err:
            call()
        assert err.value.argument == "mesh_shape" and "of no use with CFG off" in err.value.message
    row = plan_table(presets=("480p_t2v_distilled",), chips=("v6e",))
    assert len(row) == 1 and row[0]["batch"] == 1 and row[0]["cited_s"] is None
    assert row[0]["pflop_per_step"] * 2 == pytest.approx(base["total"] / 1e15, rel=1e-12)

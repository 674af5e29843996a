"""The planner counts SSTA: its tile density from the layout alone (window and text exact, top-k bounded), the step's
FLOPs and kernel bytes with it, and the plan command's SSTA figure beside the dense one."""

import json

import pytest
import torch

from hyv_lib.base.errors import HyvInputError
from hyv_lib.models.families import get_preset
from hyv_lib.kernels.ssta import SstaConfig, density, ssta_mask
from hyv_lib.planning.costs import attention_hbm_bytes, step_flops
from hyv_lib.planning.planner import bounds, device_plan
from hyv_lib.planning.sparse import ssta_config, tile_density
from hyv_lib.planning.ssta_plan import attention_rows

#: tiny's DiT (2 blocks, 2 heads x 16) at 128 x 320 px, 33 frames: a (9, 8, 20) token grid and 176 context tokens.
TINY_SIZE = (128, 320, 33)
TINY_SSTA = SstaConfig(tile=(2, 4, 4), window=(3, 3, 3), topk=8)


def test_density_by_hand_on_a_small_grid():
    """(9, 8, 20) in (2, 4, 4) tiles: (5, 2, 5) = 50 video tiles (t padded 9 -> 10), 32 tokens each; 176 context tokens
    -> 6 text tiles; T = 56. The clamped 3x3x3 window sees min(n, 3) tiles per axis: 3 x 2 x 3 = 18 per query tile,
    900 pairs. k = 8 halved to 4 (9 <= 31 frames): at most 22 per query tile, 1,100 pairs (at least 18: 900). Text, all
    valid: 50 x 6 both ways + 6 x 6 = 636. With 40 valid context tokens (2 tiles): 50 x 2 + 2 x 52 + 4 dead tiles on
    their own = 208."""
    d = tile_density((9, 8, 20), 176, TINY_SSTA)
    assert (d["video_tiles"], d["text_tiles"], d["tiles"], d["tile_tokens"], d["topk"]) == (50, 6, 56, 32, 4)
    assert (d["window_pairs"], d["topk_pairs"], d["text_pairs"], d["pairs"]) == (900, 200, 636, 1736)
    assert d["padded_length"] == 56 * 32 and d["density"] == 1736 / 56**2
    assert d["window"] == (900 + 636) / 56**2 and d["lower"] == d["window"] and not d["exact"]
    assert d["uniform"] == pytest.approx((900 + 50 * 4 * (50 - 18) / 50 + 636) / 56**2)
    cut = tile_density((9, 8, 20), 176, TINY_SSTA, text_valid=40)
    assert (cut["valid_text_tiles"], cut["text_pairs"], cut["pairs"]) == (2, 208, 1100 + 208)
    assert tile_density((9, 8, 20), 176, TINY_SSTA, text_valid=0)["valid_text_tiles"] == 1  # as the official: >= 1
    sta = tile_density((9, 8, 20), 176, SstaConfig(tile=(2, 4, 4), sparse_type="sta"))
    assert sta["exact"] and sta["pairs"] == 900 + 636 and sta["density"] == sta["window"]
    with pytest.raises(HyvInputError) as err:
        tile_density((9, 8, 20), 176, TINY_SSTA, text_valid=177)
    assert err.value.argument == "text_valid"


CASES = [  # grid, text tokens, valid text per sample, config
    ((3, 8, 10), 20, (20, 3), SstaConfig(tile=(1, 4, 4), topk=4)),
    ((5, 9, 11), 40, (40, 17), SstaConfig(tile=(2, 4, 4), window=(1, 3, 3), topk=6)),
    ((1, 8, 12), 10, (10, 10), SstaConfig(tile=(1, 4, 4), topk=3)),  # one frame: image tile, 1x1x1 window
    ((33, 8, 8), 24, (5, 24), SstaConfig(tile=(3, 4, 4), topk=5)),  # > 31 frames: k not halved
    ((6, 12, 12), 16, (16, 1), SstaConfig(tile=(2, 4, 4), topk=8, sampling="similarity", threshold=0.5)),
    ((6, 12, 12), 16, (16, 9), SstaConfig(tile=(2, 4, 4), sparse_type="sta")),
    ((6, 12, 12), 16, (16, 9), SstaConfig(tile=(2, 4, 4), topk=5, sparse_type="block_attn")),
]


@pytest.mark.parametrize("grid, text_len, valid, config", CASES)
def test_the_bound_holds_against_the_kernel_mask_on_random_inputs(grid, text_len, valid, config):
    """hyv_lib.kernels.ssta.ssta_mask on random q, k (3 seeds, 2 samples x 3 heads): every (sample, head) density lies
    between the estimator's lower and upper bounds; where the data choose nothing (window only) or the top-k alone
    decides (block_attn without a threshold), the estimate is exact."""
    s = grid[0] * grid[1] * grid[2] + text_len
    for seed in range(3):
        g = torch.Generator().manual_seed(seed)
        q, k = (torch.randn(2, 3, s, 8, generator=g) for _ in range(2))
        mask = ssta_mask(q, k, grid, text_len, torch.tensor(valid), config)
        for b, tv in enumerate(valid):
            est = tile_density(grid, text_len, config, text_valid=tv)
            assert mask.shape[-1] == est["tiles"]
            for h in range(3):
                got = int(mask[b, h].sum()) / est["tiles"] ** 2  # kernels.ssta.density, in float64
                assert got == pytest.approx(density(mask[b, h]), rel=1e-6)
                assert est["lower"] - 1e-12 <= got <= est["density"] + 1e-12, (seed, b, h, got, est["density"])
                if est["exact"]:
                    assert int(mask[b, h].sum()) == est["pairs"]
    if config.sparse_type in ("sta", "block_attn") and config.threshold == 0:
        assert est["exact"]


def test_estimates_against_the_densities_measured_on_an_h200():
    """benchmarks/results/gpu_check_2026-11-27_H200_run7_ssta.md (random bf16 q, k; each CFG sample's context under
    one 384-token tile): 720p/121f SSTA 0.1575, window only 0.078; 480p/121f 0.3101 and 0.1611. The window part is
    exact; the upper bound (planning figure) is 0.1640 and 0.3387; random q, k make the top-k a near-uniform choice,
    whose expectation gives the measured densities to 4 places."""
    for grid, measured, window in (((31, 45, 80), 0.1575, 0.078), ((31, 30, 53), 0.3101, 0.1611)):
        d = tile_density(grid, 1985, SstaConfig(), text_valid=172)
        assert round(d["window"], 4) == window and round(d["uniform"], 4) == measured
        assert measured <= d["density"] <= measured + 0.03
    assert round(tile_density((31, 45, 80), 1985)["density"], 4) == 0.1911  # every context token valid


def test_step_flops_with_ssta_by_hand_on_tiny():
    """tiny at 128x320x33, CFG pair (B = 2), 2 blocks, 2 heads x 16: SSTA's blocks count 4 B H D x pairs x 32^2 =
    the dense count over the tiled sequence (L = 1,792) times the density (1,736 / 56^2); every other part, the token
    refiner's attention included, is the dense step's."""
    dense = step_flops("tiny", *TINY_SIZE)
    sparse = step_flops("tiny", *TINY_SIZE, attention=TINY_SSTA)
    length, pairs, tiles = 1792, 1736, 56
    by_hand = 2 * 4 * 2 * 2 * length**2 * 16 * pairs // tiles**2
    assert by_hand == 2 * 4 * 2 * 2 * 16 * pairs * 32 * 32
    assert sparse["parts"]["blocks_attention"] == by_hand
    assert dense["parts"]["blocks_attention"] == 2 * 4 * 2 * 2 * (9 * 8 * 20 + 176) ** 2 * 16
    assert {k: v for k, v in sparse["parts"].items() if k != "blocks_attention"} == {
        k: v for k, v in dense["parts"].items() if k != "blocks_attention"}
    assert sparse["linear"] == dense["linear"] and sparse["total"] == dense["total"] - dense["parts"][
        "blocks_attention"] + by_hand
    assert sparse["ssta"]["pairs"] == pairs and sparse["ssta"]["sparse_blocks"] == 2 and dense["ssta"] is None
    # dense_every=2: the last of the 2 blocks runs dense, over the unpadded sequence
    hybrid = step_flops("tiny", *TINY_SIZE, attention=SstaConfig(tile=(2, 4, 4), topk=8, dense_every=2))
    assert hybrid["parts"]["blocks_attention"] == by_hand // 2 + dense["parts"]["blocks_attention"] // 2
    # the preset's own attention: the sparse presets count SSTA, the rest dense (unchanged)
    assert step_flops("720p_t2v_distilled_sparse", 720, 1280, 121)["attention"] == step_flops(
        "720p_t2v", 720, 1280, 121, batch=1, attention="ssta")["attention"]
    assert step_flops("720p_t2v", 720, 1280, 121) == step_flops("720p_t2v", 720, 1280, 121, attention="dense")
    for bad in ("sparse", "splash"):
        with pytest.raises(HyvInputError) as err:
            step_flops("tiny", *TINY_SIZE, attention=bad)
        assert err.value.argument == "attention"
    with pytest.raises(HyvInputError, match="SSTA runs on hunyuanvideo-1.5 only"):
        ssta_config(get_preset("cogvideox_tiny"), "ssta")


def test_ssta_kernel_bytes_and_the_planner():
    """The kernel's bytes per SSTA block: B H D x (2 L + 2 pairs x tile): q read and o written once over the tiled
    sequence, each query tile re-reading its attended K/V tiles; the refiner keeps the dense count. device_plan and
    bounds split SSTA's FLOPs as the dense ones."""
    dense = attention_hbm_bytes("tiny", *TINY_SIZE, block_q=128)
    sparse = attention_hbm_bytes("tiny", *TINY_SIZE, block_q=128, attention=TINY_SSTA)
    assert sparse["refiner"] == dense["refiner"]
    assert sparse["joint_blocks"] == 2 * (2 * 2 * 16 * 2 * (2 * 1792 + 2 * 1736 * 32))
    assert sparse["block_q"] == 32 and sparse["passes"] == 1736 / 56
    mesh = {"data": 2, "tensor": 2}
    plan = device_plan("tiny", *TINY_SIZE, mesh, "tp", attention=TINY_SSTA)
    assert plan["flops"]["attention"] == step_flops("tiny", *TINY_SIZE, attention=TINY_SSTA)["attention"] / 4
    assert plan["flops"]["linear"] == device_plan("tiny", *TINY_SIZE, mesh, "tp")["flops"]["linear"]
    b = bounds("720p_t2v", 720, 1280, 121, "v6e", 8, attention="ssta")
    assert b["flops"] == step_flops("720p_t2v", 720, 1280, 121, attention="ssta")["total"]
    assert b["ssta"]["density"] == pytest.approx(0.1911, abs=1e-4)
    assert bounds("720p_t2v", 720, 1280, 121, "v6e", 8) == bounds("720p_t2v", 720, 1280, 121, "v6e", 8,
                                                                  attention="flash")


def test_attention_rows_plan_the_v6e_8_step_with_and_without_ssta():
    """The chapter's table: 720p/121f CFG step on a v6e-8, dense then SSTA (upper-bound density 19.1%)."""
    dense, sparse = attention_rows("720p_t2v", "v6e", 8)
    assert (dense["attention"], sparse["attention"]) == ("dense", "ssta") and dense["density"] == 1.0
    assert dense["pflop_per_step"] == pytest.approx(step_flops("720p_t2v", 720, 1280, 121)["total"] / 1e15)
    assert sparse["attention_pflop"] < 0.3 * dense["attention_pflop"] and sparse["step_s"] < dense["step_s"]
    assert sparse["vs_dense"] == dense["step_s"] / sparse["step_s"] and dense["layout"] == sparse["layout"]
    print({r["attention"]: (round(r["pflop_per_step"], 2), round(r["step_s"], 3), r["limit"]) for r in (dense, sparse)})


def test_plan_command_prints_the_ssta_figure_beside_the_dense_one(capsys):
    from hyv_lib.cli.commands import run

    assert run(["plan", "--preset", "720p_t2v_distilled_sparse", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    a = report["attention"]
    assert a["kind"] == "ssta" and a["density"] == pytest.approx(0.1911, abs=1e-4) and a["tiles"] == 366
    assert a["flops"] < a["dense_flops"] and report["flops"] < a["dense_total"]
    assert a["config"]["tile"] == [6, 8, 8] and a["config"]["topk"] == 32
    assert run(["plan", "--preset", "720p_t2v", "--attention", "ssta"]) == 0
    out = capsys.readouterr().out
    assert "attention SSTA: tile density <= 19.1% of 366 x 366 tiles" in out and "dense" in out
    assert run(["plan", "--preset", "720p_t2v", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["attention"]["kind"] == "dense" and report["flops"] == step_flops("720p_t2v", 720, 1280, 121)["total"]
    for bad in (["--attention", "sparse"], ["--preset", "cogvideox1.5_5b", "--attention", "ssta"]):
        assert run(["plan", *bad]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: --attention: ") and err.count("\n") == 1

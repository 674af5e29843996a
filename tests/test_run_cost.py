"""The cost page's arithmetic and layout rule (hyv_lib.planning.run_cost) against hand-worked examples."""

import re

import pytest

from hyv_lib.base.errors import HyvInputError
from hyv_lib.planning.run_cost import PRICES, choose_layout, prices, run_dollars, run_seconds, wire_bytes


def test_run_seconds_adds_the_known_parts_and_names_the_missing():
    out = run_seconds({"load": None, "compile": 120.0, "50 steps": 50 * 6.061, "decode": None})
    assert out["known_s"] == pytest.approx(120.0 + 303.05)  # 50 x 6.061 = 303.05 by hand
    assert out["missing"] == ["load", "decode"]
    with pytest.raises(HyvInputError) as err:
        run_seconds({"steps": -1.0})
    assert err.value.argument == "parts"


def test_run_dollars_bills_by_the_second():
    assert run_dollars(3600, 9.60) == pytest.approx(9.60)
    assert run_dollars(1236.25 + 17.3, 10.9791) == pytest.approx(1253.55 / 3600 * 10.9791)  # 0.34821 h x 10.9791 $/h
    assert run_dollars(1253.55, 10.9791) == pytest.approx(3.8230, abs=5e-5)
    with pytest.raises(HyvInputError) as err:
        run_dollars(10, float("nan"))
    assert err.value.argument == "usd_per_hour"


def test_wire_bytes_counts_an_all_reduce_twice():
    assert wire_bytes([{"kind": "all-reduce", "bytes": 10}, {"kind": "all-gather", "bytes": 3},
                       {"kind": "all-to-all", "bytes": 2}]) == 25
    with pytest.raises(HyvInputError):
        wire_bytes([{"kind": "reduce-scatter", "bytes": 1}])


def test_choose_layout_by_hand():
    rows = [dict(name="A", fits=True, compute_s=1.00, wire_bytes=20, memory_bytes=5),
            dict(name="B", fits=True, compute_s=1.04, wire_bytes=15, memory_bytes=8),   # within 5%: fewer bytes
            dict(name="C", fits=False, compute_s=0.90, wire_bytes=1, memory_bytes=1),   # does not fit
            dict(name="D", fits=True, compute_s=1.20, wire_bytes=1, memory_bytes=1),    # 20% slower compute
            dict(name="E", fits=True, compute_s=1.01, wire_bytes=15, memory_bytes=6)]   # ties B on bytes, less memory
    chosen = choose_layout(rows)
    assert chosen["name"] == "E" and "4 of 5 fit; 3 within 5%" in chosen["reason"]
    assert choose_layout(rows, compute_tolerance=0.0)["name"] == "A"
    with pytest.raises(HyvInputError) as err:
        choose_layout([rows[2]])
    assert err.value.argument == "candidates"


def test_every_price_names_its_source_and_date():
    for p in PRICES:
        assert p.usd_per_hour > 0 and p.source.startswith("https://") and re.fullmatch(r"\d{4}-\d\d-\d\d", p.read)
    assert {p.system for p in PRICES} == {"v5e-8", "v5p-8", "v6e-8", "H100", "H200"}
    assert [p.usd_per_hour for p in prices("v6e-8")] == [21.60]
    with pytest.raises(HyvInputError) as err:
        prices("v7x-8")
    assert err.value.argument == "system"

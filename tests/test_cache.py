"""DeepCache schedule: the published 11/45/4 plan and its edge cases."""

import pytest

from hyv_lib.cache import DeepCacheSchedule


def test_default_schedule_has_25_full_steps_of_50():
    schedule = DeepCacheSchedule(50)
    assert schedule.full_steps == list(range(11)) + [11, 15, 19, 23, 27, 31, 35, 39, 43] + list(range(45, 50))
    assert len(schedule.full_steps) == 25
    assert [schedule.is_full(s) for s in (10, 11, 12, 14, 15, 44, 45)] == [True, True, False, False, True, False, True]


def test_block_count_speedup_bound():
    # 25 full steps x 54 blocks + 25 cached steps x 1 block, vs 50 x 54: the 1.96x of the issue
    assert DeepCacheSchedule(50).block_speedup(54, 1) == pytest.approx(50 * 54 / (25 * 54 + 25), rel=1e-12)
    assert round(DeepCacheSchedule(50).block_speedup(54), 2) == 1.96


def test_every_step_full_when_interval_is_one_or_range_empty():
    assert DeepCacheSchedule(20, start=5, end=15, interval=1).full_steps == list(range(20))
    assert DeepCacheSchedule(20, start=7, end=7).full_steps == list(range(20))


@pytest.mark.parametrize("kwargs", [dict(num_steps=0), dict(num_steps=10, interval=0),
                                    dict(num_steps=10, start=5, end=3), dict(num_steps=10, start=-1)])
def test_bad_schedules_raise(kwargs):
    with pytest.raises(ValueError):
        DeepCacheSchedule(**kwargs)


def test_step_outside_the_schedule():
    with pytest.raises(IndexError):
        DeepCacheSchedule(10).is_full(10)

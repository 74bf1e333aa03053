import math

import pytest

from pytest_spikecheck.scenario import ScheduleSpec
from pytest_spikecheck.training.schedule import lr_at


def test_warmup_is_linear_then_cosine_reaches_the_floor():
    spec = ScheduleSpec(name="cosine", warmup_steps=20, min_lr_ratio=0.1)
    lrs = [lr_at(s, base_lr=1e-2, total_steps=500, spec=spec) for s in range(1, 501)]
    assert lrs[0] == pytest.approx(5e-4)
    assert lrs[19] == pytest.approx(1e-2)
    assert lrs[-1] == pytest.approx(1e-3)
    assert all(a >= b for a, b in zip(lrs[19:], lrs[20:]))
    mid = lr_at(20 + 240, base_lr=1e-2, total_steps=500, spec=spec)
    assert mid == pytest.approx(1e-3 + 0.5 * 9e-3 * (1 + math.cos(math.pi * 0.5)))


def test_constant_schedule_and_bad_steps():
    spec = ScheduleSpec(name="constant", warmup_steps=0)
    assert lr_at(7, base_lr=3e-4, total_steps=10, spec=spec) == 3e-4
    with pytest.raises(ValueError, match="1-based"):
        lr_at(0, base_lr=1.0, total_steps=10, spec=spec)

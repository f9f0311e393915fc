"""The memory fit holds every phase to the usable bytes (the device's minus memory.headroom), not
to the device's bytes: the cases of test_fit.py with headroom > 0, on devices whose bytes
hold the phase while their usable bytes do not."""

import pytest
from test_fit import PROMPT, SHAPE, cfg

from sparrow.train.memory.fit import SLEEP, DeviceMemory, MemoryRefused, fit_memory
from sparrow.train.memory.plan import plan_memory

HEADROOM = 0.25


def fit(c, nbytes: int):
    device = DeviceMemory(nbytes, "test device", headroom=HEADROOM)
    return fit_memory(c, SHAPE, 1, False, device, frozenset(), PROMPT)


def test_an_engine_phase_over_the_usable_bytes_is_refused():
    c = cfg(num_pages=1 << 16)  # the KV pool makes the engine's resident phase large
    resident = plan_memory(c, SHAPE, 1, False, PROMPT).phases["resident"]
    nbytes = int(resident / (1 - HEADROOM / 2))  # holds the phase; its usable 75% does not
    device = DeviceMemory(nbytes, "test device", headroom=HEADROOM)
    assert device.usable < resident < device.bytes
    with pytest.raises(MemoryRefused, match=r"resident needs .*rollout.engine.num_pages"):
        fit(c, nbytes)


def test_the_whole_plan_is_held_to_the_usable_bytes():
    c = cfg()
    peak = plan_memory(c, SHAPE, 1, False, PROMPT).peak_phase()[1]
    fitted = fit(c, -(-peak * 4 // 3))  # usable 75% = the peak: left alone
    assert fitted.changes == () and fitted.device.usable >= peak
    sized = fit(c, peak + 1)  # the device's bytes hold the peak, the usable bytes do not
    assert sized.changes[:1] == (f"{SLEEP}=kv",)  # the fit's first knob
    assert sized.plan.peak_phase()[1] <= sized.device.usable < peak

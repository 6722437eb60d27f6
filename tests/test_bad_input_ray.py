"""Ray waits that expire say which worker did not come up and what Ray reports about it."""

from __future__ import annotations

import sys
import time
from typing import Any

import pytest

from actors import waits


class Sleepy:
    def endpoint(self, delay: float) -> tuple[str, int]:
        time.sleep(delay)
        return ("127.0.0.1", 1)


def test_stretch_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(waits.os, "getloadavg", lambda: (1000.0, 0.0, 0.0))
    assert waits.load_stretch() == waits.MAX_STRETCH
    monkeypatch.setattr(waits.os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    assert waits.stretched(10.0) == 10.0


def test_expired_wait_is_one_line_naming_the_stage(ray_session: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    ray = ray_session
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    monkeypatch.setattr(waits, "load_stretch", lambda: 1.0)
    actor = ray.remote(num_cpus=0.1)(Sleepy).remote()
    try:
        assert waits.get(actor.endpoint.remote(0.0), actor, "stage 0 (device 0)", "with its endpoint", 60.0) == ("127.0.0.1", 1)
        with pytest.raises(waits.StartTimeout, match=r"stage 1 \(device 3\) did not answer with its endpoint within 1s .*Ray reports: .*CPU") as info:
            waits.get(actor.endpoint.remote(30.0), actor, "stage 1 (device 3)", "with its endpoint", 1.0)
        assert "\n" not in str(info.value)
        ray.kill(actor, no_restart=True)
        with pytest.raises(waits.StartTimeout, match=r"stage 1 \(device 3\) died before answering"):
            waits.get(actor.endpoint.remote(0.0), actor, "stage 1 (device 3)", "with its endpoint", 30.0)
    finally:
        ray.kill(actor, no_restart=True)

"""Unit tests for hybrid_core.workers.faults: the fault tests' injection points (parsed, fired once, logged)."""
import time

import pytest

from hybrid_core.workers.faults import Fault, FaultPoints, InjectedFault, parse_faults


def test_faults_parse_and_malformed_entries_are_named():
    assert parse_faults("") == ()
    assert parse_faults("raise:2:rollout:written, sleep1.5:4:sync:committed") == (
        Fault(action="raise", step=2, stage="rollout", point="written"),
        Fault(action="sleep1.5", step=4, stage="sync", point="committed"))
    for bad in ("raise:2:rollout", "explode:1:reward:start", "raise:x:reward:start", "raise:1:reward:later"):
        with pytest.raises(ValueError, match=rf"HYBRID_FAULTS entry must be ACTION:STEP:STAGE:POINT .*got {bad!r}"):
            parse_faults(bad)


def test_a_fault_fires_once_at_its_point_and_is_logged_first():
    logged = []
    points = FaultPoints(parse_faults("raise:2:rollout:written,sleep0.2:3:train:start"),
                         lambda step, stage, event, **extra: logged.append((step, stage, event, extra)))
    points.reach(2, "rollout", "start")  # another point of the same stage: nothing
    with pytest.raises(InjectedFault, match="injected fault at written of rollout in step 2"):
        points.reach(2, "rollout", "written")
    points.reach(2, "rollout", "written")  # once per process: the retry gets past it
    started = time.perf_counter()
    points.reach(3, "train", "start")
    assert time.perf_counter() - started >= 0.2
    assert logged == [(2, "rollout", "fault", {"point": "written", "action": "raise"}),
                      (3, "train", "fault", {"point": "start", "action": "sleep0.2"})]


def test_a_hold_waits_for_its_release_file(tmp_path):
    import threading

    with pytest.raises(ValueError, match="set HYBRID_FAULTS_RELEASE"):
        parse_faults("hold:1:reward:start")
    release = tmp_path / "go"
    points = FaultPoints(parse_faults("hold:1:reward:start", str(release)))
    threading.Timer(0.3, release.touch).start()
    started = time.perf_counter()
    points.reach(1, "reward", "start")
    assert 0.3 <= time.perf_counter() - started < 5

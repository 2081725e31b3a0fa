"""Faults injected at named points of a step, for the fault tests: a worker raises, sleeps or exits there.

`HYBRID_FAULTS` (read by `placement`, passed to every worker) holds comma-separated `ACTION:STEP:STAGE:POINT` with
ACTION `raise`, `exit`, `sleep<seconds>` or `hold` (wait until the file HYBRID_FAULTS_RELEASE names exists) and POINT
`start` (the stage began), `written` (its dataset is written, not yet recorded) or `committed` (recorded). Each
fault fires once per worker process and logs a `fault` event first, so a test can act while the worker waits.
Unset, as outside tests, nothing happens.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass

POINTS = ("start", "written", "committed")
HOLD_LIMIT_S = 900.0


class InjectedFault(RuntimeError):
    """Raised at a `raise` fault: a transient failure that a retry of the stage gets past."""


@dataclass(frozen=True, kw_only=True)
class Fault:
    action: str
    step: int
    stage: str
    point: str
    release: str = ""  # `hold`: the file whose existence lets the worker go on


def parse_faults(spec: str, release: str = "") -> tuple[Fault, ...]:
    """`raise:2:rollout:written,sleep5:4:sync:committed` into faults; a malformed entry is an error naming it."""
    faults = []
    for item in filter(None, (part.strip() for part in spec.split(","))):
        parts = item.split(":")
        is_action = len(parts) == 4 and (parts[0] in ("raise", "exit", "hold") or parts[0].startswith("sleep"))
        if not (is_action and parts[1].isdigit() and parts[3] in POINTS):
            raise ValueError(f"HYBRID_FAULTS entry must be ACTION:STEP:STAGE:POINT (ACTION raise, exit or sleep<s>; "
                             f"POINT one of {POINTS}): got {item!r}")
        if parts[0] == "hold" and not release:
            raise ValueError(f"HYBRID_FAULTS entry {item!r} holds until a file exists: set HYBRID_FAULTS_RELEASE")
        faults.append(Fault(action=parts[0], step=int(parts[1]), stage=parts[2], point=parts[3], release=release))
    return tuple(faults)


class FaultPoints:
    """A worker's faults; `reach` is called at every point of every stage it serves."""

    def __init__(self, faults: tuple[Fault, ...], log_event=None):
        self.pending = list(faults)
        self.log_event = log_event

    def reach(self, step: int, stage: str, point: str) -> None:
        fault = next((f for f in self.pending if (f.step, f.stage, f.point) == (step, stage, point)), None)
        if fault is None:
            return
        self.pending.remove(fault)
        if self.log_event is not None:
            self.log_event(step, stage, "fault", point=point, action=fault.action)
        if fault.action == "raise":
            raise InjectedFault(f"injected fault at {point} of {stage} in step {step} (HYBRID_FAULTS)")
        if fault.action == "exit":
            os._exit(17)  # the process dies as a killed one would: no cleanup, no reply
        if fault.action == "hold":
            deadline = time.monotonic() + HOLD_LIMIT_S
            while not os.path.exists(fault.release) and time.monotonic() < deadline:
                time.sleep(0.1)
            return
        time.sleep(float(fault.action.removeprefix("sleep")))

"""Suite-wide rules: the repository root on sys.path, and a skipped test outside the `gpu` marker is a failure.

CI has no accelerator and deselects `gpu` tests (`-m "not gpu"`); any other skip would hide a missing component.
"""
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.skipped and "gpu" not in item.keywords:
        report.outcome = "failed"
        report.longrepr = f"skipped outside the gpu marker (treated as a failure): {report.longrepr}"

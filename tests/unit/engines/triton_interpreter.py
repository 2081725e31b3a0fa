"""Runs one of this folder's `*_interpreted.py` scripts in a child process under Triton's interpreter
(TRITON_INTERPRET=1: the interpreter is chosen when a module defines its kernels, so it cannot be switched on inside
the test process) and returns the finished process; the scripts print a line per case they checked."""
from __future__ import annotations

import os
import subprocess
import sys

from tests.conftest import REPO_ROOT


def run_interpreted(script_name: str) -> subprocess.CompletedProcess:
    env = os.environ | {"TRITON_INTERPRET": "1", "PYTHONPATH": str(REPO_ROOT)}
    script = REPO_ROOT / "tests" / "unit" / "engines" / script_name
    return subprocess.run([sys.executable, "-W", "ignore", str(script)], env=env, capture_output=True, text=True,
                          timeout=300)

"""The layout rules of DESIGN.md §1 / STYLE.md §2: import direction (import-linter), module docstrings, sizes."""
from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO_ROOT

PACKAGES = ("hybrid_core", "tasks", "flows")


def source_files() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (REPO_ROOT / pkg).rglob("*.py") if p.name != "__init__.py")


def test_import_contracts_are_kept():
    lint = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or "lint-imports"
    proc = subprocess.run([lint, "--no-cache"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 broken" in proc.stdout


def test_every_module_says_what_it_owns():
    missing = [str(p.relative_to(REPO_ROOT)) for p in source_files() if not ast.get_docstring(ast.parse(p.read_text()))]
    assert missing == []


def test_files_and_functions_stay_small():
    too_long = []
    for path in source_files():
        text = path.read_text()
        if len(text.splitlines()) > 400:
            too_long.append(f"{path.name}: {len(text.splitlines())} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= 60:
                too_long.append(f"{path.name}:{node.lineno} {node.name}")
    assert too_long == []


def test_package_inits_stay_empty():
    """Re-exports in __init__ pulled DeepSpeed into vLLM actors in OpenRLHF (e05487dd): keep them empty."""
    non_empty = [str(p) for pkg in PACKAGES for p in (REPO_ROOT / pkg).rglob("__init__.py") if p.read_text().strip()]
    assert non_empty == []

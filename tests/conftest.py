"""Puts the repository root on sys.path so tests import `hybrid_core` without installing it."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

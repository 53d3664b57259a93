"""GPU tests: each CUDA kernel against its NumPy reference. Skipped without CuPy and a usable device."""

from __future__ import annotations

import sys
from pathlib import Path

# The shared helpers (kv_helpers, the reference tests' batch builder) live one folder up.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

"""The benchmark scripts import their siblings by name, as they do when run as scripts."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

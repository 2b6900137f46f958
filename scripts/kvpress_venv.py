"""The separate virtualenv with the real kvpress, shared by the scripts that check against it.

kvpress 0.5.x pins transformers < 5.3 while polykv-search needs transformers 5.24, so kvpress runs in
its own virtual environment (``~/.cache/polykv-search/kvpress-venv`` by default, or
``$POLYKV_CACHE/kvpress-venv``), created on first use with ``pip install TORCH KVPRESS``. A check
writes a child script and runs it there with :func:`run_in_venv`; the child never sees this project
(``PYTHONPATH`` is dropped) and talks to the parent through files and its exit status.

Used by ``scripts/verify_kvpress_export.py`` and ``scripts/verify_kvpress_patterns.py``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

DEFAULT_VENV = Path(os.environ.get("POLYKV_CACHE", Path.home() / ".cache" / "polykv-search")) / "kvpress-venv"
#: kvpress 0.5.x; ``torch==2.13.0`` is the CPU build this machine image keeps on disk (a bare ``torch``
#: would download a CUDA build of several GB).
DEFAULT_KVPRESS = "kvpress>=0.5,<0.6"
DEFAULT_TORCH = "torch==2.13.0"


def ensure_venv(venv: Path, kvpress_spec: str = DEFAULT_KVPRESS, torch_spec: str = DEFAULT_TORCH) -> Path:
    """The virtualenv's Python, after creating it and installing torch and kvpress where missing."""
    python = venv / "bin" / "python"
    if not python.exists():
        print(f"creating virtualenv {venv}", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    probe = subprocess.run([str(python), "-c", "import kvpress, torch"], capture_output=True)
    if probe.returncode != 0:
        print(f"installing {torch_spec} and {kvpress_spec} into {venv} (minutes)", flush=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", torch_spec, kvpress_spec], check=True)
    return python


def run_in_venv(python: Path, code: str, script: Path, *args: str) -> int:
    """Write ``code`` (dedented) to ``script`` and run it with the virtualenv's ``python`` and ``args``,
    without this project's ``PYTHONPATH``; returns its exit status."""
    script.write_text(textwrap.dedent(code))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([str(python), str(script), *args], env=env).returncode

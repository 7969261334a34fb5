"""cadau/serve.py: Daphne with its reactor on uvloop. The servers the tests start (scale-out,
browser) and the benchmark run through it, so this only pins the loop it picks."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_daphnes_reactor_runs_on_uvloop():
    probe = "import cadau.serve, daphne.server; print(type(daphne.server.twisted_loop).__module__)"
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip().startswith("uvloop")


def test_the_launcher_takes_daphnes_options():
    out = subprocess.run(
        [sys.executable, "-m", "cadau.serve", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    assert "--fd" in out.stdout and "--proxy-headers" in out.stdout

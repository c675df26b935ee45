"""Killing a training subprocess mid-run, for the resume tests."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path


def kill_after_lines(proc: subprocess.Popen, metrics: Path, lines: int, timeout: float = 600) -> int:
    """SIGKILLs ``proc`` as soon as ``metrics`` (a metrics.jsonl) has ``lines`` lines (or it
    exits, or ``timeout`` seconds pass); returns the number of lines the file has then."""
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= lines:
            break
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    return len(metrics.read_text().splitlines()) if metrics.exists() else 0

"""Ctrl-C (SIGINT) stops a command cleanly: status 130, one line, no crash, the finished work
kept (issue 31). The commands run as real processes (``python -m dflash_jax ...``), signalled at
a known point of their run.

Before the fix, a Ctrl-C that came while XLA compiled a program ended in a segmentation fault
(status 139) after the friendly line: jaxlib leaves the interrupted compilation running in its
thread pool, and the interpreter's teardown destroyed the XLA client under it (see
``dflash_jax.cli.run_cli``). So the commands run with JAX's compile log on
(``JAX_LOG_COMPILES=1``), and the signal is sent a moment after JAX says it has lowered a
program, while XLA compiles it (about 1 s per program on a 2-core CPU): generate's prefill
program (its decode program follows, so generate cannot finish before the signal) and the DFlash
decode program of the bench's second prompt set (its warm-up and runs follow). These programs are
compiled by no other test (their shapes are this file's own: ``--datasets ... humaneval``,
``--max-len 320``), so the persistent compilation cache of the test run (tests/conftest.py)
cannot turn their compilation into a cache read. Without the fix both tests failed with status
-11 (SIGSEGV) in nearly every run.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

import dflash_jax as dj

pytestmark = pytest.mark.slow

CRASHES = ("Segmentation fault", "Fatal Python error", "core dumped", "Aborted")

LOWERED_PREFILL = "MLIR module conversion jit(prefill)"  # JAX_LOG_COMPILES=1: just before XLA compiles it
STARTUP = 600  # seconds a command may take to reach the point where it is signalled (CI under load)
EXIT = 120  # and to exit after the signal (it writes the finished sets, a figure)


class Process:
    """``python <args>`` with stdout and stderr read as they come (one thread each)."""

    def __init__(self, args: list[str], cwd):
        # SIGINT reaches the child as it reaches a command started from a terminal only if the
        # child does not inherit an ignored SIGINT (a test run started in the background of a
        # shell ignores it, and Python keeps it ignored): a handled signal is reset to the
        # default in the child, so it is handled here while the child starts.
        previous = signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            self.proc = subprocess.Popen([sys.executable, *args], cwd=cwd, text=True, stdout=subprocess.PIPE,
                                         stderr=subprocess.PIPE,
                                         env=dict(os.environ, PYTHONFAULTHANDLER="1", JAX_LOG_COMPILES="1"))
        finally:
            signal.signal(signal.SIGINT, previous)
        self.streams = {"out": [], "err": []}
        self.changed = threading.Condition()
        self.readers = [threading.Thread(target=self._read, args=(name, stream), daemon=True)
                        for name, stream in (("out", self.proc.stdout), ("err", self.proc.stderr))]
        for reader in self.readers:
            reader.start()

    def _read(self, name, stream):
        for line in stream:  # (tqdm's carriage returns end lines too: universal newlines)
            with self.changed:
                self.streams[name].append(line)
                self.changed.notify_all()
        with self.changed:
            self.changed.notify_all()

    def text(self, name: str) -> str:
        with self.changed:
            return "".join(self.streams[name])

    def wait_for(self, what: str, condition, timeout: float = STARTUP) -> None:
        """Waits until ``condition()`` holds; fails (the process killed) if the process ends or
        ``timeout`` seconds pass first."""
        deadline = time.monotonic() + timeout
        with self.changed:
            while not condition():
                if self.proc.poll() is not None:
                    self.kill()
                    pytest.fail(f"the command ended (status {self.proc.returncode}) before {what}; "
                                f"stderr:\n{self.text('err')[-3000:]}")
                if time.monotonic() > deadline:
                    self.kill()
                    pytest.fail(f"no {what} after {timeout} s; stderr:\n{self.text('err')[-3000:]}")
                self.changed.wait(0.05)

    def signal_and_wait(self, signum=signal.SIGINT, timeout: float = EXIT) -> int:
        """Sends ``signum``; the exit status (the streams read to their end)."""
        assert self.proc.poll() is None, "the command ended before the signal"
        self.proc.send_signal(signum)
        try:
            status = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"still running {timeout} s after the signal; stderr:\n{self.text('err')[-3000:]}")
        for reader in self.readers:
            reader.join(30)
        return status

    def kill(self):
        self.proc.kill()
        self.proc.wait()

    def assert_stopped_cleanly(self, status: int, expected: int = 130) -> str:
        """The exit status is ``expected`` and nothing crashed; returns stderr."""
        err = self.text("err")
        assert not any(crash in err for crash in CRASHES) and status == expected, (
            f"exit status {status} (expected {expected}); stderr:\n{err[-3000:]}")
        return err


def lines_with(process: Process, text: str, after: str | None = None) -> int:
    """How many lines of stderr hold ``text`` (after the last line that holds ``after``)."""
    lines = process.streams["err"]
    if after is not None:
        marks = [i for i, line in enumerate(lines) if after in line]
        lines = lines[marks[-1] + 1:] if marks else []
    return sum(text in line for line in lines)


def test_ctrl_c_in_bench_keeps_the_finished_set_and_exits_130(tmp_path):
    """Ctrl-C while the bench runs its second prompt set (its one program compiled before the
    first): status 130 (not a segmentation fault), the line saying what was kept, and the first
    set's results on disk as valid JSON (the report marked incomplete); the run's table is never
    printed. (A Ctrl-C inside a compilation: the generate test below.)"""
    out = tmp_path / "bench"
    bench = Process(["-m", "dflash_jax", "bench", "--datasets", "gsm8k", "mt-bench", "--max-samples", "2",
                     "--max-new-tokens", "64", "--no-adaptive", "--out", str(out)], tmp_path)
    # the first set is on disk (written atomically); the second set's four turns (seconds) are running
    bench.wait_for("the first set's results", lambda: (out / "bench.md").exists())  # its last file
    err = bench.assert_stopped_cleanly(bench.signal_and_wait())

    assert f"interrupted during mt-bench: kept the finished sets (gsm8k) in {out}" in err
    saved = json.loads((out / "bench.json").read_text())
    assert list(saved["datasets"]) == ["gsm8k"] and saved["complete"] is False
    assert saved["datasets"]["gsm8k"]["turns"] == 2 and math.isfinite(saved["average"]["tau"])
    assert (out / "bench.png").stat().st_size > 0 and (out / "bench.md").exists()
    assert not [p.name for p in out.iterdir() if ".tmp" in p.name]  # no half-written file left
    assert "| dataset |" not in bench.text("out")  # the run did not finish


def test_ctrl_c_in_generate_exits_130(tmp_path):
    """Ctrl-C while XLA compiles generate's programs: status 130, the one line
    ``interrupted``, no output and no crash."""
    gen = Process(["-m", "dflash_jax", "generate", "--prompt", "Write a long story about a lighthouse.",
                   "--drafter", dj.EMBEDDED_DRAFTER_DIR, "--max-new-tokens", "64", "--max-len", "320"], tmp_path)
    gen.wait_for("the compilation", lambda: lines_with(gen, LOWERED_PREFILL) >= 1)
    time.sleep(0.3)  # into the prefill program's compilation
    err = gen.assert_stopped_cleanly(gen.signal_and_wait())
    assert err.rstrip().endswith("interrupted") and gen.text("out") == ""


# A command run by dflash_jax.cli.run_cli in its own process, as `python -m dflash_jax` runs one:
# it says "ready" on stderr, then works for 30 s (prints "finished", exits 0) unless stopped.
# "gc-callback": it first runs a garbage collection whose callback says so and stays there 2 s
# (a Ctrl-C can come while JAX's gc callback, _xla_gc_callback, runs, and Python drops an
# exception raised inside a gc callback). "slow-cleanup": its handling of Ctrl-C takes 30 s.
COMMAND = textwrap.dedent("""
    import gc, sys, time
    from dflash_jax.cli import run_cli

    def spin(seconds):
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            pass

    def callback(phase, info):
        if phase == "start" and info["generation"] == 2 and not done:
            done.append(True)
            print("in the callback", file=sys.stderr, flush=True)
            spin(2.0)

    done = []

    def main(argv):
        kind, = argv
        try:
            print("ready", file=sys.stderr, flush=True)
            if kind == "gc-callback":
                gc.callbacks.append(callback)
                gc.collect()
            end = time.perf_counter() + 30
            while time.perf_counter() < end:
                spin(0.01) if kind == "gc-callback" else time.sleep(0.01)
        except KeyboardInterrupt:
            if kind == "slow-cleanup":
                print("cleaning up", file=sys.stderr, flush=True)
                time.sleep(30)
            raise
        print("finished")

    run_cli(main)
    """)


def run_command(tmp_path, kind: str) -> Process:
    script = tmp_path / "command.py"
    script.write_text(COMMAND)
    command = Process([str(script), kind], tmp_path)
    command.wait_for("ready", lambda: lines_with(command, "ready") >= 1, timeout=120)
    return command


def test_a_ctrl_c_python_drops_in_a_gc_callback_still_stops_the_command(tmp_path):
    """A KeyboardInterrupt raised inside a garbage-collection callback is dropped by Python
    ("Exception ignored in ..."); the command must stop all the same (status 130, well before its
    30 s of work end), not run on to the end."""
    command = run_command(tmp_path, "gc-callback")
    command.wait_for("the callback", lambda: lines_with(command, "in the callback") >= 1, timeout=60)
    t0 = time.monotonic()
    status = command.signal_and_wait(timeout=60)
    err = command.assert_stopped_cleanly(status)
    assert "finished" not in command.text("out") and time.monotonic() - t0 < 20
    assert err.rstrip().endswith("interrupted")


def test_a_second_ctrl_c_during_the_cleanup_leaves_at_once(tmp_path):
    """The command's handling of the first Ctrl-C takes 30 s; a second Ctrl-C ends the process at
    once with status 130 and says so."""
    command = run_command(tmp_path, "slow-cleanup")
    command.proc.send_signal(signal.SIGINT)
    command.wait_for("the cleanup", lambda: lines_with(command, "cleaning up") >= 1, timeout=60)
    t0 = time.monotonic()
    err = command.assert_stopped_cleanly(command.signal_and_wait(timeout=60))
    assert "interrupted again: leaving now" in err and time.monotonic() - t0 < 20


def test_sigterm_stops_a_command_with_143(tmp_path):
    """SIGTERM takes the same way out as Ctrl-C: the line ``terminated``, status 143 (128 + 15)."""
    command = run_command(tmp_path, "sleep")
    err = command.assert_stopped_cleanly(command.signal_and_wait(signal.SIGTERM), expected=143)
    assert err.rstrip().endswith("terminated") and "finished" not in command.text("out")

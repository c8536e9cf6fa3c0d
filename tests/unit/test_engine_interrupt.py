"""Engine processes started by `start_deaf_to_interrupt` never receive a
terminal's SIGINT (it is blocked in them, inherited through fork, spawn and
exec), and the starting thread's own mask is restored afterwards."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

from inferd.engines.interrupt import start_deaf_to_interrupt

ROOT = Path(__file__).resolve().parents[2]

# A child that says whether SIGINT is blocked in it, after installing a
# handler of its own (as vLLM's engine core does).
_CHILD = (
    "import signal; signal.signal(signal.SIGINT, lambda *a: None); "
    "print(signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, []))"
)


def _child_blocks_interrupt() -> str:
    return subprocess.run(
        [sys.executable, "-c", _CHILD], capture_output=True, text=True, check=True
    ).stdout.strip()


def _blocked_here() -> bool:
    return signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, [])


def exit_with_the_block() -> None:
    """A multiprocessing child's target: its exit code says (3: blocked)."""
    sys.exit(3 if _blocked_here() else 4)


def test_children_started_inside_block_interrupt_and_the_thread_is_restored() -> None:
    seen: dict[str, object] = {}

    def in_a_worker_thread() -> None:
        seen["inside"] = start_deaf_to_interrupt(_child_blocks_interrupt)
        seen["after"] = _child_blocks_interrupt()
        seen["thread after"] = _blocked_here()

    thread = threading.Thread(target=in_a_worker_thread)
    thread.start()
    thread.join()
    assert seen == {"inside": "True", "after": "False", "thread after": False}


# In a fresh interpreter, where multiprocessing's resource tracker is not
# running yet: vLLM's start launches it (and it unblocks SIGINT in the
# launching thread), then forks the engine core, which spawns its workers.
_FRESH = """
import multiprocessing
from inferd.engines.interrupt import start_deaf_to_interrupt
from tests.unit.test_engine_interrupt import exit_with_the_block

def start(method):
    child = multiprocessing.get_context(method).Process(target=exit_with_the_block)
    child.start()
    child.join(60)
    return child.exitcode

if __name__ == "__main__":
    print(start_deaf_to_interrupt(start, "spawn"), start_deaf_to_interrupt(start, "fork"))
"""


def test_multiprocessing_children_inherit_the_block_from_a_fresh_process() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", _FRESH], capture_output=True, text=True, cwd=ROOT, env=env,
        timeout=120,
    )  # fmt: skip
    assert out.stdout.split() == ["3", "3"], out.stderr

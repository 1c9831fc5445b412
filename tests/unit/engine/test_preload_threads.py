"""The template counts only the threads a load leaves running: a pool that a library ran
for one call and that ends on its own (joblib's, for a forest with ``n_jobs``) is no
reason to stop sharing the model."""

import subprocess
import sys

# Runs in a fresh interpreter, whose only thread is the main one.
CHILD = """
import threading, time
from inferpool.engine.worker.preload import thread_count, threads_left

before = thread_count()
ending = threading.Thread(target=time.sleep, args=(0.3,))
ending.start()
listed = thread_count() - before
print(listed, threads_left(before, settle=5))
stay = threading.Event()
staying = threading.Thread(target=stay.wait, daemon=True)
staying.start()
started = time.monotonic()
print(threads_left(before, settle=0.2), round(time.monotonic() - started, 1))
"""


def test_threads_that_end_on_their_own_are_waited_for_and_others_counted() -> None:
    child = subprocess.run(
        [sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=60
    )
    assert child.returncode == 0, child.stderr
    ending, staying = (line.split() for line in child.stdout.splitlines())
    assert ending == ["1", "0"]  # listed right after the load, gone once it ended
    assert staying == ["1", "0.2"]  # still there when the wait ran out

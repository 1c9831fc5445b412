"""Generators run as child processes whose CPU time is measured exactly."""

import sys

import pytest

from benchmarks.loadgen.base import run_child


def test_cpu_time_and_output_of_a_child():
    burn = "import time\nend = time.process_time() + 0.3\nwhile time.process_time() < end: pass\n"
    child = run_child("burner", [sys.executable, "-c", burn + "print('done')"], timeout=20)
    assert child.stdout == "done\n"
    assert 0.3 <= child.cpu_seconds < 2


def test_failure_and_timeout_raise():
    with pytest.raises(RuntimeError, match="failing exited 3: oops"):
        run_child(
            "failing",
            [sys.executable, "-c", "import sys; sys.stderr.write('oops'); sys.exit(3)"],
            20,
        )
    with pytest.raises(RuntimeError, match="sleeper exited -9"):
        run_child("sleeper", [sys.executable, "-c", "import time; time.sleep(30)"], timeout=0.5)

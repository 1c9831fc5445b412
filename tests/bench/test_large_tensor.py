"""The large-tensor benchmark: its peak-memory accounting on a process that allocates and
frees, and the whole command against a real server (a small tensor, one round trip)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import large_tensor

MIB = 1 << 20


def test_peak_growth_sees_memory_already_given_back():
    # The child allocates (and writes) 48 MiB, frees it, and reports: its RSS is back
    # down, but the high-water mark reset before the allocation keeps the peak.
    script = (
        "import sys\n"
        "sys.stdin.readline()\n"
        "block = b'x' * (48 << 20)\n"
        "del block\n"
        "print('freed', flush=True)\n"
        "sys.stdin.readline()\n"
    )
    command = [sys.executable, "-c", script]
    pipes = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE, "text": True}
    with subprocess.Popen(command, **pipes) as child:
        before = large_tensor.reset_high_water(child.pid)
        assert child.pid in before
        child.stdin.write("go\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "freed"
        grown = large_tensor.peak_growth(before)
        rss_now = large_tensor.status_kib(child.pid, "VmRSS") * 1024
        assert 44 * MIB <= grown <= 64 * MIB
        assert rss_now < before[child.pid] * 1024 + 16 * MIB  # given back: only the peak shows
        # A second reset forgets it.
        assert large_tensor.peak_growth(large_tensor.reset_high_water(child.pid)) < 8 * MIB
        child.stdin.write("end\n")


def test_memcpy_bandwidth_is_a_rate():
    rate = large_tensor.memcpy_bandwidth(4 * MIB, repeat=3)
    assert 1e8 < rate < 1e12  # bytes a second, between 100 MB/s and 1 TB/s


def test_the_loopback_echo_is_a_rate_of_bytes_sent_back_whole():
    raw = bytes(range(256)) * (16 * 1024)  # 4 MiB; the echo checks what came back
    echo = large_tensor.loopback_echo(raw, repeat=2)
    assert 0 < echo["seconds_best"] <= echo["seconds_median"]
    assert 1e6 < echo["rate_mb_s"] * 1e6 < 1e12


@pytest.mark.parametrize("name", ["inferpool-w0", "inferpool-w0-base"])
def test_the_command_measures_both_protocols_on_a_server(tmp_path, name):
    # A 4 MiB tensor, one round trip each over REST binary and gRPC raw, predict in the
    # frontend (one process: the cheapest start). The identity's answer is checked. The
    # -base server runs from a checkout given (this one: a -base without it is refused).
    checkout = Path(__file__).resolve().parents[2]
    assert large_tensor.main([name], tmp_path, size_mib=4, repeat=1, base_checkout=checkout) == 0
    result = json.loads((tmp_path / "results.json").read_text())[name]
    assert result["payload_mib"] == 4 and len(result["memcpy_mb_s"]) == 2
    for protocol in ("rest-binary", "grpc-raw"):
        cell = result[protocol]
        assert cell["rate_mb_s"] > 0 and cell["of_memcpy"] > 0
        # Against the TCP echo measured in the same run (the ceiling of any TCP server).
        assert cell["of_echo"] == cell["rate_mb_s"] / result["tcp-echo"]["rate_mb_s"]
        # The server held the tensor at least once while answering.
        assert cell["peak_growth_mib_max"] >= 3
    table = (tmp_path / "results.md").read_text()
    assert "| rest-binary |" in table and "| tcp echo (the ceiling over TCP) |" in table

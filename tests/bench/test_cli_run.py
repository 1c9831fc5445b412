"""``python -m benchmarks run``'s choices before anything starts: the quick profile's
servers (MLServer beside inferpool when installed, inferpool's configurations when not),
its time budget, and --port-base refused with the busy port named."""

from __future__ import annotations

import socket

import pytest

from benchmarks import __main__ as cli
from benchmarks import mlserver_env, ports
from benchmarks.scenarios import PROFILES


def config(*argv: str):
    return cli.config_from(cli.parser().parse_args(["run", *argv]))


def test_quick_without_mlserver_compares_inferpools_configurations_and_says_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(mlserver_env, "installed", lambda: False)
    quick = config("--quick")
    assert quick.servers == ("inferpool-w0", "inferpool-w2")
    assert quick.baseline == "inferpool-w0"
    assert "MLServer is not installed" in quick.note
    assert "python -m benchmarks install-mlserver" in quick.note
    assert "inferpool-w0 and inferpool-w2" in quick.note
    # REST against gRPC on both models, each on both servers, and LightGBM's batch as
    # Python clients write its JSON (17 digits a number).
    protocols = {s.protocol for s in quick.scenarios}
    assert protocols == {"rest-json", "rest-json17", "grpc-raw"}


def test_quick_with_mlserver_installed_runs_it_beside_inferpool(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(mlserver_env, "installed", lambda: True)
    quick = config("--quick")
    assert (quick.servers, quick.baseline, quick.note) == (
        ("mlserver-w0", "inferpool-w2"),
        "mlserver-w0",
        "",
    )


def test_servers_given_or_a_profile_without_fallback_are_run_as_asked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(mlserver_env, "installed", lambda: False)
    asked = config("--quick", "--servers", "mlserver-w0,inferpool-w0")
    assert (asked.servers, asked.baseline, asked.note) == (
        ("mlserver-w0", "inferpool-w0"),
        "mlserver-w0",
        "",
    )
    assert config("--profile", "full").servers == PROFILES["full"].servers


def test_quick_is_the_quick_profile_and_its_load_fits_well_within_two_minutes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(mlserver_env, "installed", lambda: False)
    assert config("--quick") == config("--profile", "quick")
    # The rest of the two minutes: training the models, starting two servers, checks.
    # (45 s: five scenarios since the tolist() JSON body joined, issue 44.)
    assert config("--quick").estimate_seconds() <= 45


def test_a_busy_port_base_port_refuses_the_run_before_anything_starts(
    tmp_path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ports.free_port()
    taken = base + 4  # inferpool-w2's gRPC port, the second server's second
    with socket.socket() as held:
        held.bind((ports.HOST, taken))
        held.listen()
        argv = ["run", "--quick", "--servers", "inferpool-w0,inferpool-w2"]
        argv += ["--port-base", str(base), "--out", str(tmp_path / "out")]
        status = cli.main([*argv, "--repo", str(tmp_path / "repo")])
    assert status == 2
    err = " ".join(capsys.readouterr().err.split())  # rich wraps at 80 columns
    assert f"port {taken} (inferpool-w2's gRPC port, from --port-base) is in use" in err
    assert not (tmp_path / "repo").exists() and not (tmp_path / "out").exists()


def test_a_port_base_beyond_the_last_port_is_refused(tmp_path, capsys) -> None:
    argv = ["run", "--servers", "inferpool-w0", "--port-base", "65534"]
    assert cli.main([*argv, "--repo", str(tmp_path / "repo")]) == 2
    assert "65534-65536 are not all valid ports" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("printed", "complete"),
    [
        ("1.7.1 1.7.1 1.7.1 1.7.1 1.7.1 0.21.0", True),
        ("1.7.1 1.7.1 1.7.1 1.7.1 1.7.1 0.22.0", False),  # MLServer's workers crash with it
        ("1.7.1 1.7.1 1.6.0 1.7.1 1.7.1 0.21.0", False),  # a runtime at another version
        ("1.7.1 1.7.1 1.7.1 1.7.1 0.21.0", False),  # a venv from before mlserver-catboost
    ],
)
def test_mlserver_counts_as_installed_from_its_distributions_versions(
    tmp_path, printed: str, complete: bool
) -> None:
    """The quick profile asks before choosing its servers: a metadata read, not the 5 to
    20 s of importing MLServer."""
    python = tmp_path / "venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(f"#!/bin/sh\necho {printed}\n")
    python.chmod(0o755)
    assert mlserver_env.installed(tmp_path / "venv") is complete
    python.write_text("#!/bin/sh\nexit 1\n")  # a distribution missing
    assert mlserver_env.installed(tmp_path / "venv") is False
    assert mlserver_env.installed(tmp_path / "nothing") is False

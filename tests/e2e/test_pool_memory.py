"""Workers share the models the template loaded (copy-on-write): those of the repository at
start-up, and a model reloaded from changed files (a new generation of workers)."""

from __future__ import annotations

from pathlib import Path

import httpx
import psutil
import pytest

from tests.support import Server, write_sklearn_model
from tests.support.pool import ask_model, big_knn, logged_sizes, template_pid, wait_for

pytestmark = pytest.mark.timeout(300)


def workers_uss(server: Server) -> dict[int, float]:
    """Each worker's private memory (USS) in MiB, by pid."""
    template = psutil.Process(template_pid(server.process.pid))
    return {w.pid: w.memory_full_info().uss / 2**20 for w in template.children()}


def test_preloaded_model_is_shared_and_a_changed_one_too(tmp_path: Path) -> None:
    first, rows = big_knn(0)
    write_sklearn_model(tmp_path / "knn", first)
    with Server(tmp_path, "--workers", "2") as server:
        server.wait_ready()
        [size] = logged_sizes(server, "knn")
        assert size >= 30  # its footprint: the 40 MB of training data it keeps
        assert ask_model(server, "knn", rows) == first.predict(rows).tolist()
        old = workers_uss(server)
        # Shared with the template, not copied into either worker.
        assert all(uss < size / 2 for uss in old.values()), old

        second, other_rows = big_knn(1)
        write_sklearn_model(tmp_path / "knn", second)  # the template's copy is now stale
        response = httpx.post(f"{server.url}/v2/repository/models/knn/load", timeout=120)
        assert response.status_code == 200, response.text
        wait_for(lambda: len(logged_sizes(server, "knn")) == 2, what="the reload logged")
        assert logged_sizes(server, "knn")[1] == size  # the same shapes: the same footprint
        assert ask_model(server, "knn", other_rows) == second.predict(other_rows).tolist()
        # The template loaded the new files; a new generation of workers shares them.
        wait_for(lambda: not set(old) & set(workers_uss(server)), what="the old workers exit")
        assert all(uss < size / 2 for uss in workers_uss(server).values())
        assert server.stop() == 0

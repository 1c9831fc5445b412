"""The one local Spark session of a process, which every model of the ``mllib`` runtime in
it shares, and what can be read of a saved Spark model without Spark (its metadata).

PySpark runs Spark in a JVM of its own, a child process reached over a local socket
(py4j): a process forked after it started would share that socket with its parent, so
the session starts in a worker after the fork, or in the server itself with
``--workers 0``; the registry's entry neither preloads nor is ``fork_safe``, so the
template never starts one. The JVM exits when its Python process does (it watches its
standard input, which PySpark holds open).

The session is sized for one worker: ``local[n]`` with n the worker's share of the cores
(``OMP_NUM_THREADS``, which the worker sets before loading), a small driver heap (the
first model's ``parameters.extra.jvm_heap``, 512m by default), no UI, one shuffle
partition, and every socket on 127.0.0.1 (``spark.driver.host``, ``bindAddress``,
``SPARK_LOCAL_IP``).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from inferpool.errors import ModelLoadError

logger = logging.getLogger(__name__)

DEFAULT_HEAP = "512m"
MAX_REASON = 300  # characters of Spark's reason kept in a sentence
# Spark's own settings for a session of one worker (the module's docstring says why).
CONFIG = {
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "1",
    "spark.log.level": "ERROR",
}

_session: Any = None
_lock = threading.Lock()


def session(heap: str | None = None) -> Any:
    """This process's SparkSession, started on first use with a driver heap of ``heap``."""
    global _session
    with _lock:
        if _session is not None:
            if heap is not None and heap != _session.conf.get("spark.driver.memory", None):
                logger.warning(
                    "this process's Spark session already runs: jvm_heap %s is not applied", heap
                )
            return _session
        _session = _start(heap or DEFAULT_HEAP)
        return _session


def _start(heap: str) -> Any:
    from pyspark.sql import SparkSession

    # Spark's own address lookup would take the host's first interface (its name resolves
    # to loopback here): the JVM inherits this and binds nothing else.
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    # The Python workers Spark forks to build a DataFrame from local rows run this
    # interpreter (by default, whichever ``python3`` is first on PATH).
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    # py4j logs each connection it closes at INFO.
    logging.getLogger("py4j").setLevel(logging.WARNING)

    threads = _threads()
    builder = SparkSession.builder.master(f"local[{threads}]").appName("inferpool")
    for key, value in {**CONFIG, "spark.driver.memory": heap}.items():
        builder = builder.config(key, value)
    # SparkContext installs a SIGINT handler of its own when started on the main thread;
    # the process keeps its own (a worker ignores SIGINT: the frontend drains it).
    on_main = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGINT) if on_main else None
    began = time.monotonic()
    try:
        started = builder.getOrCreate()
    except Exception as exc:
        raise ModelLoadError(f"Spark did not start: {reason(exc)}") from None
    finally:
        if on_main and previous is not None:
            signal.signal(signal.SIGINT, previous)
    logger.info(
        "Spark %s started in %.1f s (local[%d], driver heap %s)",
        started.version,
        time.monotonic() - began,
        threads,
        heap,
    )
    return started


def _threads() -> int:
    """The worker's share of the cores (1 when it is not said)."""
    try:
        return max(1, int(os.environ.get("OMP_NUM_THREADS", "1")))
    except ValueError:
        return 1


def reason(exc: BaseException) -> str:
    """Spark's reason for an error on one line: the Java exception's first line, never
    its stack trace (the log has it)."""
    logger.debug("Spark raised", exc_info=exc)
    java = getattr(exc, "java_exception", None)
    text = str(java.toString()) if java is not None else str(exc)
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    first = lines[0] if lines else type(exc).__name__
    return first if len(first) <= MAX_REASON else first[: MAX_REASON - 3] + "..."


def read_metadata(folder: Path) -> dict[str, Any]:
    """The JSON document a saved Spark model keeps in ``metadata/`` (its first line):
    ``class``, ``uid``, ``paramMap``, ``defaultParamMap``..."""
    parts = sorted(p for p in (folder / "metadata").glob("part-*") if p.is_file())
    if not parts:
        raise ModelLoadError(f"{folder} holds no Spark model metadata (metadata/part-*)")
    with parts[0].open(encoding="utf-8") as file:
        line = file.readline()
    try:
        document = json.loads(line)
    except ValueError:
        raise ModelLoadError(f"{parts[0]} is not Spark model metadata (not JSON)") from None
    if not isinstance(document, dict) or not isinstance(document.get("class"), str):
        raise ModelLoadError(f"{parts[0]} is not Spark model metadata (no class)")
    return document


def is_spark_model(folder: Path) -> bool:
    """Whether ``folder`` looks like a saved Spark model (``metadata/part-*`` beside
    Spark's ``_SUCCESS`` marker or a ``part-`` file), read without Spark."""
    metadata = folder / "metadata"
    return metadata.is_dir() and any(metadata.glob("part-*"))


def params(document: dict[str, Any]) -> dict[str, Any]:
    """A stage's parameters: its defaults, overridden by those set."""
    merged = dict(document.get("defaultParamMap") or {})
    merged.update(document.get("paramMap") or {})
    return merged


def stage_documents(folder: Path, document: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """A PipelineModel's stages in order: (class, parameters) from each stage's metadata."""
    uids = params(document).get("stageUids") or []
    stages = []
    for uid in uids:
        found = sorted((folder / "stages").glob(f"*_{uid}"))
        if not found:
            raise ModelLoadError(f"{folder} names stage {uid} but has no stages/*_{uid} folder")
        stage = read_metadata(found[0])
        stages.append((str(stage["class"]), params(stage)))
    return stages

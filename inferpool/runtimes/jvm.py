"""The one JVM of a process, which every model of the ``java`` and ``pmml`` runtimes in it
shares: started by the first of them to load, through JPype, never before.

A JVM does not survive ``fork`` (its threads stay behind), so it starts in a worker after
the fork, or in the server itself with ``--workers 0``; the registry's entries of both
runtimes neither preload nor are ``fork_safe``, so the template never starts one.

Its class path holds what every model needs from the system class loader: inferpool's
interface jar (``java_interface/inferpool-model.jar``: ``io.inferpool.Model``) and, when
``jpmml_evaluator`` is installed, the evaluator's jars. A model's own jars get a class
loader each (``class_loader``): a model loaded after the JVM started (JPype's
``addClassPath`` works only before) loads as the first did, and two models may hold
classes of the same name.

Under ``--worker-memory-limit`` (an address-space cap) it starts with smaller reservations
(``CAPPED_OPTIONS``) or refuses in one sentence. The JVM is started with ``-Xrs`` (the
process's signal handlers stay Python's: SIGTERM drains the worker as for any model) and
the serial collector (one GC thread: the workers
are the unit of parallelism, DESIGN §3). Its heap is the ``jvm_heap`` of the first model
to load (``parameters.extra``); a later model asking for another size is served in the
running JVM with a warning.
"""

from __future__ import annotations

import importlib.util
import logging
import re
import resource
from pathlib import Path
from typing import Any

import jpype
import jpype.config

from inferpool.errors import ModelLoadError

logger = logging.getLogger(__name__)

INTERFACE_JAR = Path(__file__).parent / "java_interface" / "inferpool-model.jar"
INTERFACE = "io.inferpool.Model"
# -Xmx's argument: a number of bytes with an optional k/m/g unit.
_HEAP = re.compile(r"\d+[kKmMgG]?")
# The options every JVM of inferpool starts with (the module's docstring says why).
OPTIONS = ("-Xrs", "-XX:+UseSerialGC")

# Under an address-space cap (``--worker-memory-limit``: RLIMIT_AS), JDK 17 reserves 1 GiB
# of class space and 240 MiB of code cache at start, and exits the process when it cannot:
# smaller reservations, a heap of its own by default, and a refusal in one sentence when
# what is left cannot hold them (measured with heap 128m: the JVM starts with 1100 MiB
# left, and exits its process with 950 MiB).
CAPPED_OPTIONS = ("-XX:CompressedClassSpaceSize=128m", "-XX:ReservedCodeCacheSize=64m")
CAPPED_HEAP = "256m"
CAPPED_RESERVE = 1024 * 2**20  # bytes beyond the heap a capped JVM needs to start
_UNITS = {"k": 2**10, "m": 2**20, "g": 2**30}

_started_heap: str | None = None


def ensure_started(heap: str | None = None) -> None:
    """Start this process's JVM with a heap of ``heap`` (``-Xmx``), unless it runs."""
    global _started_heap
    if heap is not None and not _HEAP.fullmatch(str(heap)):
        raise ModelLoadError(f"jvm_heap '{heap}' is not a size such as 512m or 2g")
    if jpype.isJVMStarted():
        if heap is not None and heap != _started_heap:
            logger.warning(
                "this process's JVM already runs with heap %s: jvm_heap %s is not applied",
                _started_heap or "the default",
                heap,
            )
        return
    try:
        path = jpype.getDefaultJVMPath()
    except jpype.JVMNotFoundException:
        raise ModelLoadError(
            "no Java runtime found (none under JAVA_HOME or the usual places): install one "
            "(apt-get install default-jre-headless) or set JAVA_HOME"
        ) from None
    options = list(OPTIONS)
    left = _address_space_left()
    if left is not None:
        heap = heap or CAPPED_HEAP
        needed = _bytes(heap) + CAPPED_RESERVE
        if left < needed:
            raise ModelLoadError(
                f"the worker's memory limit leaves {left >> 20} MiB of address space, and a "
                f"JVM with heap {heap} needs {needed >> 20} MiB: raise --worker-memory-limit "
                "or lower jvm_heap"
            )
        options += CAPPED_OPTIONS
    if heap:
        options.append(f"-Xmx{heap}")
    classpath = [str(INTERFACE_JAR), *pmml_jars()]
    try:
        jpype.startJVM(path, *options, classpath=classpath, convertStrings=False, interrupt=False)
    except OSError as exc:
        raise ModelLoadError(f"the Java runtime at {path} did not start: {exc}") from None
    # At the process's exit, JPype's atexit handler would destroy the JVM, which waits for
    # the Java threads it counts as running: with --workers 0, the server's predict threads
    # (daemon threads of Python's, attached to the JVM by their first call) kept a server
    # from exiting after SIGTERM, one start in two here (tests/java/test_pmml_serving.py).
    # Nothing of a model's needs the JVM's own clean-up: the process's exit frees it all.
    jpype.config.destroy_jvm = False
    _started_heap = heap
    logger.info("JVM started (%s, heap %s)", path, heap or "the JVM's default")


def _address_space_left() -> int | None:
    """Bytes this process may still map under its RLIMIT_AS (None: no cap)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY:
        return None
    with open("/proc/self/status") as status:
        match = re.search(r"VmSize:\s+(\d+) kB", status.read())
    mapped = int(match.group(1)) * 1024 if match else 0
    return max(0, soft - mapped)


def _bytes(size: str) -> int:
    """``512m`` as bytes."""
    unit = size[-1].lower()
    return int(size[:-1]) * _UNITS[unit] if unit in _UNITS else int(size)


def pmml_jars() -> list[str]:
    """The jars that ``jpmml_evaluator`` ships (none when it is not installed), found
    without importing it (it imports pandas)."""
    spec = importlib.util.find_spec("jpmml_evaluator")
    if spec is None or not spec.submodule_search_locations:
        return []
    folder = Path(next(iter(spec.submodule_search_locations)))
    return sorted(str(jar) for jar in folder.rglob("*.jar"))


def class_loader(jars: list[Path]) -> Any:
    """A new class loader over ``jars`` whose parent is the system class loader (which
    holds ``io.inferpool.Model``): a model's classes, apart from every other model's."""
    url_class = jpype.JClass("java.net.URL")
    file_class = jpype.JClass("java.io.File")
    urls = jpype.JArray(url_class)([file_class(str(jar)).toURI().toURL() for jar in jars])
    system = jpype.JClass("java.lang.ClassLoader").getSystemClassLoader()
    return jpype.JClass("java.net.URLClassLoader")(urls, system)


def java_message(exc: BaseException) -> str:
    """A Java exception's class and first line of message (``java.lang.X: why``)."""
    name = str(exc.getClass().getName()) if hasattr(exc, "getClass") else type(exc).__name__
    message = exc.getMessage() if hasattr(exc, "getMessage") else str(exc)
    text = str(message).strip() if message is not None else ""
    text = text.splitlines()[0] if text else ""
    return f"{name}: {text}" if text else name

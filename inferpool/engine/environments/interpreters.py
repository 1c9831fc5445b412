"""Running inferpool's own modules under another environment's interpreter.

An environment (``unpack.py``) needs only its models' libraries. Its interpreter
runs inferpool's template, workers and capability probe with this package loaded from
the server's own folder, and the server's ``sys.path`` appended *after* the
environment's own: the environment's scikit-learn wins over the server's, and what it
lacks (orjson, msgspec, ...) comes from the server. That only works for the same Python
X.Y as the server (inferpool's C extensions are built for it): another version exits at
once with a sentence that says so.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import inferpool

OVERLAY_ENV = "INFERPOOL_OVERLAY"
PROBE_TIMEOUT = 60.0

# Run as ``python -c BOOT module args...``. Kept to the standard library: nothing else is
# importable before the overlay is in place.
BOOT = """\
import importlib.util, json, os, runpy, site, sys
overlay = json.loads(os.environ.pop("INFERPOOL_OVERLAY"))
if list(sys.version_info[:2]) != overlay["python"]:
    sys.exit("this environment runs Python %d.%d; the server runs %d.%d, and the workers "
             "of an environment must run the same Python X.Y"
             % (*sys.version_info[:2], *overlay["python"]))
for entry in overlay["path"]:
    site.addsitedir(entry)
where = overlay["package"]
spec = importlib.util.spec_from_file_location(
    "inferpool", where, submodule_search_locations=[os.path.dirname(where)])
package = importlib.util.module_from_spec(spec)
sys.modules["inferpool"] = package
spec.loader.exec_module(package)
sys.argv = sys.argv[1:]
runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
"""


def command(
    python: str | Path, module: str, *args: str, first: str = ""
) -> tuple[list[str], dict[str, str]]:
    """The argv and environment that run ``module`` with ``args`` under ``python``;
    ``first``: code to run before anything else (``lifeline.PRELUDE``)."""
    overlay = {
        "python": list(sys.version_info[:2]),
        "package": str(Path(inferpool.__file__).resolve()),
        "path": [entry for entry in sys.path if entry and os.path.isdir(entry)],
    }
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)  # the server's would come before the environment's own
    env.pop("PYTHONHOME", None)
    env[OVERLAY_ENV] = json.dumps(overlay)
    return [str(python), "-c", first + BOOT, module, *args], env


class ProbeFailed(Exception):
    """The interpreter could not report its capabilities: the message says why."""


def probe(python: str | Path) -> dict[str, object]:
    """The capabilities (as JSON) of the interpreter ``python``; ProbeFailed with its
    last line of error output if it cannot run inferpool's modules."""
    argv, env = command(python, "inferpool.engine.environments.capabilities")
    try:
        done = subprocess.run(argv, env=env, capture_output=True, timeout=PROBE_TIMEOUT)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ProbeFailed(f"{python} did not run: {exc}") from None
    if done.returncode != 0:
        lines = done.stderr.decode(errors="replace").strip().splitlines()
        raise ProbeFailed(lines[-1] if lines else f"{python} exited with {done.returncode}")
    try:
        answer = json.loads(done.stdout)
    except json.JSONDecodeError:
        raise ProbeFailed(f"{python} printed no capabilities") from None
    if not isinstance(answer, dict):
        raise ProbeFailed(f"{python} printed no capabilities")
    return answer

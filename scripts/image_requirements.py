"""Print the requirements of ``inferpool[EXTRAS]`` from pyproject.toml, one a line.

    python3 scripts/image_requirements.py sklearn,lightgbm  [pyproject.toml]

The Dockerfile installs them (through requirements/image.lock, which pins each) in a
layer of their own before inferpool's sources are copied in, so that a change to the
sources rebuilds inferpool's wheel only, not its dependencies. inferpool's extras that name
inferpool's own other extras (``all``) are expanded. tests/package/test_lock.py checks the
lock pins every one of them for ``all``. Standard library only: it runs on the bare base.
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

# The name of a requirement and its extras: "inferpool[sklearn,lightgbm]" -> inferpool, ...
SELF = re.compile(r"^\s*inferpool\s*\[([^\]]*)\]\s*$", re.IGNORECASE)


def requirements(extras: list[str], pyproject: Path) -> list[str]:
    project = tomllib.loads(pyproject.read_text())["project"]
    optional = project["optional-dependencies"]
    found = list(project["dependencies"])
    pending, seen = list(extras), set()
    while pending:
        extra = pending.pop().strip()
        if not extra or extra in seen:
            continue
        seen.add(extra)
        if extra not in optional:
            raise SystemExit(f"inferpool has no extra {extra!r}; it has {sorted(optional)}")
        for requirement in optional[extra]:
            match = SELF.match(requirement)
            if match:
                pending.extend(match[1].split(","))
            else:
                found.append(requirement)
    return found


if __name__ == "__main__":
    path = Path(sys.argv[2]) if len(sys.argv) > 2 else Path("pyproject.toml")
    print("\n".join(requirements(sys.argv[1].split(","), path)))

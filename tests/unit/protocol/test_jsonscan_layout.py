"""The JSON scanner's C sources (issue 39 point 6): ``_jsonscan.c`` is one translation unit
that includes a generic part and one header per instruction set from ``jsonscan/``. A
header it includes but setup.py does not list in the extension's ``depends`` would not
trigger a rebuild when edited, and one pyproject.toml does not ship would be missing from
the sdist, which then fails to compile: both are checked here, as is that no header in the
folder is left unincluded and that each one says what it owns.
"""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
PROTOCOL = ROOT / "inferpool" / "protocol"
HEADERS = PROTOCOL / "jsonscan"


def _included(source: Path) -> set[str]:
    """The quoted includes of a C file, as paths relative to inferpool/protocol."""
    names = re.findall(r'^#include "([^"]+)"', source.read_text(), flags=re.MULTILINE)
    return {(source.parent / name).resolve().relative_to(PROTOCOL).as_posix() for name in names}


def _extension_depends() -> set[str]:
    """The ``depends`` of setup.py's _jsonscan Extension, read from its syntax tree."""
    tree = ast.parse((ROOT / "setup.py").read_text())
    for call in ast.walk(tree):
        if not (isinstance(call, ast.Call) and getattr(call.func, "id", None) == "Extension"):
            continue
        if ast.literal_eval(call.args[0]) != "inferpool.protocol._jsonscan":
            continue
        for keyword in call.keywords:
            if keyword.arg == "depends":
                return set(ast.literal_eval(keyword.value))
    raise AssertionError("setup.py has no depends for inferpool.protocol._jsonscan")


def test_every_header_is_included_listed_and_shipped() -> None:
    headers = {path.relative_to(PROTOCOL).as_posix() for path in HEADERS.glob("*.h")}
    assert {"jsonscan/tier_ssse3.h", "jsonscan/tier_avx2.h", "jsonscan/tier_avx512.h"} <= headers
    included = _included(PROTOCOL / "_jsonscan.c")
    for header in HEADERS.glob("*.h"):
        included |= _included(header)
    assert headers | {"_pow5.h"} == included
    assert {f"inferpool/protocol/{name}" for name in included} == _extension_depends()
    package_data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-data"
    ]
    assert "*.h" in package_data["inferpool.protocol.jsonscan"]
    assert "*.h" in package_data["inferpool.protocol"]  # _pow5.h


def test_each_header_opens_with_what_it_owns() -> None:
    for header in HEADERS.glob("*.h"):
        opening = header.read_text().split("*/", 1)[0]
        assert opening.startswith("/* "), header.name
        assert len(opening.splitlines()) >= 3, header.name

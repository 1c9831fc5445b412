"""Print pip's configuration as ``export UV_*=...`` lines for a shell to eval (.ci/run).

uv (tox-uv) reads no pip configuration: pip's (its files and PIP_* variables, as
``pip config list`` shows them) is handed to uv as UV_* variables, so that uv installs
what pip would. A variable already set wins; a pip option without a uv counterpart here
stops CI rather than installing something else.
"""

import ast
import os
import shlex
import subprocess
import sys

listing = subprocess.run(
    [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, check=True
).stdout
# pip's precedence: PIP_* variables, then the [install] section, then [global].
rank = {":env:": 2, "install": 1, "global": 0}
options: dict[str, tuple[int, str]] = {}
for line in listing.splitlines():
    key, _, value = line.partition("=")
    section, _, name = key.rpartition(".")
    if section in rank and rank[section] >= options.get(name, (-1, ""))[0]:
        options[name] = (rank[section], str(ast.literal_eval(value)))
# pip option: (uv variable, separator of uv's list); pip splits its lists on whitespace.
to_uv = {
    "index-url": ("UV_DEFAULT_INDEX", " "),
    "extra-index-url": ("UV_INDEX", " "),
    "find-links": ("UV_FIND_LINKS", ","),
    "constraint": ("UV_CONSTRAINT", " "),
    "cert": ("SSL_CERT_FILE", " "),
    "timeout": ("UV_HTTP_TIMEOUT", " "),
    "default-timeout": ("UV_HTTP_TIMEOUT", " "),
}
# Options that change nothing uv installs.
harmless = {
    "disable-pip-version-check",
    "no-compile",
    "progress-bar",
    "root-user-action",
    "no-input",
    "quiet",
    "verbose",
    "retries",
    "no-color",
    "cache-dir",
    "no-cache-dir",
    "no-warn-script-location",
}
unknown = sorted(set(options) - set(to_uv) - harmless)
if unknown:
    sys.exit(f".ci/run: pip option(s) {', '.join(unknown)} have no uv counterpart here")
# pip picks the best version across all its indexes (uv: the first index that has the
# package). pip also compiles every installed module to bytecode; uv does not, and that is
# kept: each tox environment's first processes compile what they import and write it (the
# test suite's imports, 2,516 modules: 7.5 s of CPU), where compiling every module at
# install (9,972 for the default environment) took 38 s of CPU against 9 s without, for
# each of CI's twenty environments. What is installed is the same.
uv = {"UV_INDEX_STRATEGY": "unsafe-best-match"}
for name, (_, value) in options.items():
    if name in to_uv:
        variable, separator = to_uv[name]
        uv[variable] = separator.join(value.split())
for variable, value in uv.items():
    if variable not in os.environ:
        print(f"export {variable}={shlex.quote(value)}")

"""The load probe's child: reads models one by one and says how each went, so that a model
file that crashes its library kills this short-lived process, not the server. Each load
stops once the runtime has read its artefact (``load_errors.ArtefactRead``): what the
server builds from it afterwards (tree kernels, their checks) is its own code, and doing it
twice would double the start-up's work.

``python -m inferpool.engine.worker.probe FD`` reads a JSON list of model settings on
stdin and writes JSON lines to the pipe ``FD``: ``{"loading": i}`` before model ``i``,
``{"loading": i, "file": ..., "library": ...}`` before its runtime opens a file
(``announce.py``), ``{"done": i, "error": reason-or-null}`` after. The frontend's side
is ``engine/load_probe.py``. It logs nothing: the server's own load of the model logs.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from typing import IO, Any

from inferpool.engine.ipc.messages import Loading
from inferpool.engine.worker.announce import announcing
from inferpool.engine.worker.model import failure_reason, load_model
from inferpool.runtimes.load_errors import ArtefactRead
from inferpool.settings import ModelSettings


def probe(documents: list[dict[str, Any]], out: IO[str]) -> None:
    """Load each of ``documents``, reporting on ``out`` as the module says."""

    def write(record: dict[str, Any]) -> None:
        out.write(json.dumps(record) + "\n")
        out.flush()  # before the library runs: it may never return

    for index, document in enumerate(documents):

        def send(message: Loading, index: int = index) -> None:
            write({"loading": index, "file": message.file, "library": message.library})

        error = None
        try:
            settings = ModelSettings(**document)
            with announcing(send, settings.name, settings.version, only_read=True):
                load_model(settings)
        except ArtefactRead:
            pass  # read: what the server builds from it next cannot crash the library's parser
        except Exception as exc:
            error = failure_reason(exc)
        write({"done": index, "error": error})


def main() -> None:
    logging.disable(logging.CRITICAL)
    with os.fdopen(int(sys.argv[1]), "w") as out:
        probe(json.loads(sys.stdin.read()), out)


if __name__ == "__main__":
    main()

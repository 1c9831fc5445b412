"""``report.html``: one self-contained page per run (the chart embedded as a base64 PNG, the
whole table, the run's settings and why a cell has no numbers), to open in a browser or
attach to a CI run without the files beside it.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from html import escape

STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; }
table { border-collapse: collapse; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.5em; }
td { text-align: right; white-space: nowrap; }
td:nth-child(-n+3) { text-align: left; }
th { background: #f0f0f0; }
tr.first td { border-top: 2px solid #888; }
img { max-width: 100%; }
"""


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """An HTML table; a row that starts another scenario gets a heavier top border."""
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = []
    previous = None
    for cells in rows:
        first = ' class="first"' if cells[0] != previous else ""
        previous = cells[0]
        body.append(f"<tr{first}>" + "".join(f"<td>{escape(c)}</td>" for c in cells) + "</tr>")
    rows_html = "\n".join(body)
    return f"<table>\n<thead><tr>{head}</tr></thead>\n<tbody>\n{rows_html}\n</tbody>\n</table>"


def render(
    context: str,
    headers: Sequence[str],
    rows: Sequence[Sequence[str]],
    chart_png: bytes,
    notes: Sequence[str] = (),
    title: str = "inferpool benchmark",
) -> str:
    """The page: title, what was run, the chart, the table, the notes."""
    image = base64.b64encode(chart_png).decode("ascii")
    listed = "".join(f"<li>{escape(note)}</li>" for note in notes)
    return "\n".join(
        [
            "<!DOCTYPE html>",
            '<html lang="en"><head><meta charset="utf-8">',
            f"<title>{escape(title)}</title><style>{STYLE}</style></head><body>",
            f"<h1>{escape(title)}</h1>",
            f"<p>{escape(context)}</p>",
            f'<img alt="req/s and p99 latency per scenario and server" '
            f'src="data:image/png;base64,{image}">',
            "<h2>Every figure</h2>",
            "<p>Medians of the repetitions, (min-max) where there were several; the same "
            "figures are in results.csv and, per repetition, results.json.</p>",
            table(headers, rows),
            f"<h2>Cells without numbers</h2><ul>{listed}</ul>" if notes else "",
            "</body></html>",
            "",
        ]
    )

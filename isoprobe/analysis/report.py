"""``report.html``: one self-contained page (figures embedded, tables sortable in the browser
with a few lines of inline JavaScript, no server, no network).

Everything on the page that comes from runs (model and data set names, override keys and
values, run names, reasons) is text, never markup: the page is assembled from plain strings,
which :func:`write_report` escapes, and :class:`Html` fragments, which only :func:`markup`
makes, escaping every value it fills in. A Content-Security-Policy allows the page's own
sorting script and nothing else, should anything slip through."""

from __future__ import annotations

import base64
import hashlib
import html
import string
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

SORTABLE_SCRIPT = """
document.querySelectorAll("table.sortable th").forEach((th, column) => {
  th.addEventListener("click", () => {
    const table = th.closest("table"), body = table.tBodies[0];
    const ascending = th.dataset.order !== "asc";
    table.querySelectorAll("th").forEach(h => delete h.dataset.order);
    th.dataset.order = ascending ? "asc" : "desc";
    const key = row => {
      const text = row.cells[column].textContent.trim(), number = parseFloat(text);
      return isNaN(number) ? text : number;
    };
    const rows = Array.from(body.rows).sort((a, b) => {
      const x = key(a), y = key(b);
      if (typeof x === "number" && typeof y === "number") return ascending ? x - y : y - x;
      return ascending ? String(x).localeCompare(String(y)) : String(y).localeCompare(String(x));
    });
    rows.forEach(row => body.appendChild(row));
  });
});
"""
STYLE = """
body { font-family: sans-serif; margin: 2em; max-width: 1200px; color: #222; }
table { border-collapse: collapse; font-size: 12px; margin: 1em 0; }
th, td { border: 1px solid #ccc; padding: 3px 6px; text-align: right; }
th { background: #eee; cursor: pointer; position: sticky; top: 0; }
th[data-order="asc"]::after { content: " ▲"; } th[data-order="desc"]::after { content: " ▼"; }
td:first-child, th:first-child { text-align: left; }
img { max-width: 100%; border: 1px solid #ddd; margin: 0.5em 0; }
.note { background: #fff8e0; padding: 0.6em 1em; border-left: 4px solid #e0b000; }
"""


class Html(str):
    """A fragment of the page's own markup. Made by :func:`markup` (or :func:`join`), never by
    calling ``Html`` on text a run holds: :func:`write_report` escapes any other string."""


class _EscapingFormatter(string.Formatter):
    def format_field(self, value: Any, format_spec: str) -> str:
        formatted = format(value, format_spec)
        return formatted if isinstance(value, Html) else html.escape(formatted)


_ESCAPING = _EscapingFormatter()


def markup(template: str, /, *args: Any, **values: Any) -> Html:
    """``template``, isoprobe's own markup (a literal, never a run's value), with each field
    (``{name}``, ``{name:.3g}``, ``{name!r}``) filled by its value formatted and then
    HTML-escaped; an :class:`Html` value goes in as it is."""
    return Html(_ESCAPING.format(template, *args, **values))


def join(parts: Iterable[Html], separator: str = "") -> Html:
    """:class:`Html` fragments one after another (a list's items); refuses plain text."""
    parts = list(parts)
    for part in parts:
        if not isinstance(part, Html):
            raise TypeError(f"join takes Html fragments (made by markup), got {part!r}")
    return Html(html.escape(separator).join(parts))


def table_html(frame: pd.DataFrame, table_id: str) -> Html:
    """A sortable HTML table (click a header to sort by it); pandas escapes every cell, column
    header and index label. A missing value (NaN or None) is an empty cell."""
    return Html(
        frame.where(frame.notna(), np.nan).to_html(
            index=False,
            table_id=table_id,
            classes="sortable",
            escape=True,
            float_format=lambda v: f"{v:.4g}",
            na_rep="",
            border=0,
            render_links=False,
        )
    )


def image_html(path: Path, caption: str) -> Html:
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return markup(
        '<figure><img alt="{caption}" src="data:image/png;base64,{data}">'
        "<figcaption>{caption}</figcaption></figure>",
        caption=caption,
        data=data,
    )


def _source_hash(source: str) -> str:
    digest = hashlib.sha256(source.encode("utf-8")).digest()
    return "'sha256-" + base64.b64encode(digest).decode("ascii") + "'"


#: what the page may load and run: its own sorting script (by hash), its inline styles and
#: its embedded images; nothing from the network, no other script, no forms, no base URL
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; "
    f"script-src {_source_hash(SORTABLE_SCRIPT)}; "
    "style-src 'unsafe-inline'; "
    "img-src data:; "
    "base-uri 'none'; "
    "form-action 'none'"
)


def _block(part: Html | str) -> Html:
    """A paragraph of the page: :class:`Html` as it is, anything else as escaped text."""
    return part if isinstance(part, Html) else markup("<p>{text}</p>", text=part)


@dataclass(frozen=True)
class Section:
    """A part of the page: its heading (none for the opening), then paragraphs, figures and
    titled tables, in that order."""

    heading: str | None = None
    paragraphs: Sequence[Html | str] = ()
    figures: Sequence[tuple[Path, str]] = ()
    tables: Sequence[tuple[str, pd.DataFrame]] = ()


def write_report(
    path: Path,
    title: str,
    paragraphs: Sequence[Html | str],
    figures: list[tuple[Path, str]],
    tables: list[tuple[str, pd.DataFrame]],
) -> Path:
    """The page of one section: paragraphs, figures and titled tables, in that order
    (:func:`write_sections`)."""
    return write_sections(path, title, [Section(None, paragraphs, figures, tables)])


def write_sections(path: Path, title: str, sections: Sequence[Section]) -> Path:
    """The page: each section in turn. A paragraph is :class:`Html` (from :func:`markup`) or
    plain text; the title, headings, captions and table headings and cells are plain text.
    Everything plain is escaped here."""
    parts = [markup("<h1>{title}</h1>", title=title)]
    tables = 0
    for section in sections:
        if section.heading:
            parts.append(markup("<h2>{heading}</h2>", heading=section.heading))
        parts += map(_block, section.paragraphs)
        parts += [image_html(figure, caption) for figure, caption in section.figures]
        for heading, frame in section.tables:
            parts += [
                markup("<h3>{heading}</h3>", heading=heading),
                table_html(frame, f"table{tables}"),
            ]
            tables += 1
    page = markup(
        "<!DOCTYPE html><html><head><meta charset='utf-8'>"
        '<meta http-equiv="Content-Security-Policy" content="{policy}">'
        "<title>{title}</title><style>{style}</style></head><body>{body}"
        "<script>{script}</script></body></html>",
        policy=CONTENT_SECURITY_POLICY,
        title=title,
        style=Html(STYLE),
        body=Html("\n".join(parts)),
        script=Html(SORTABLE_SCRIPT),
    )
    path.write_text(page, encoding="utf-8")
    return path

"""``report.html``: one self-contained page (figures embedded, tables sortable in the browser
with a few lines of inline JavaScript, no server, no network)."""

from __future__ import annotations

import base64
import html
from pathlib import Path

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


def table_html(frame: pd.DataFrame, table_id: str) -> str:
    """A sortable HTML table (click a header to sort by it)."""
    body = frame.to_html(
        index=False,
        table_id=table_id,
        classes="sortable",
        float_format=lambda v: f"{v:.4g}",
        na_rep="",
        border=0,
    )
    return body


def image_html(path: Path, caption: str) -> str:
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return (
        f'<figure><img alt="{html.escape(caption)}" src="data:image/png;base64,{data}">'
        f"<figcaption>{html.escape(caption)}</figcaption></figure>"
    )


def write_report(
    path: Path,
    title: str,
    paragraphs: list[str],
    figures: list[tuple[Path, str]],
    tables: list[tuple[str, pd.DataFrame]],
) -> Path:
    """The page: paragraphs (already HTML), figures and titled tables, in that order."""
    parts = [f"<h1>{html.escape(title)}</h1>", *paragraphs]
    parts += [image_html(figure, caption) for figure, caption in figures]
    for i, (heading, frame) in enumerate(tables):
        parts += [f"<h2>{html.escape(heading)}</h2>", table_html(frame, f"table{i}")]
    page = (
        "<!DOCTYPE html><html><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)}</title><style>{STYLE}</style></head><body>"
        + "\n".join(parts)
        + f"<script>{SORTABLE_SCRIPT}</script></body></html>"
    )
    path.write_text(page, encoding="utf-8")
    return path

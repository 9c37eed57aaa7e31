"""report.html in a real browser (headless Chromium, Debian's package): the figures decode, a
click on a header sorts the table under the page's Content-Security-Policy, and markup that
runs' configs carry runs nothing. Skipped where no Chromium is installed."""

from __future__ import annotations

import base64
import hashlib
import html
import re
import shutil
import subprocess
from pathlib import Path

import pandas as pd
import pytest

from isoprobe.analysis.report import CONTENT_SECURITY_POLICY, write_report
from tests.analysis.probed_runs import (
    IMG_PAYLOAD,
    KEY_PAYLOAD,
    SVG_PAYLOAD,
    analyse,
    hostile_study,
)

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no Chromium (apt-get install chromium)")

#: runs after the page's own script (allowed by its hash): clicks the header twice, reports what
#: the browser sees
PROBE_SCRIPT = """
const header = [...document.querySelectorAll("#table0 th")].find(h => h.textContent === "spearman");
const rows = () => [...document.querySelectorAll("#table0 tbody tr")];
const column = () => rows().map(r => r.cells[1].textContent);
header.click(); const ascending = column().join(" ");
header.click(); const descending = column().join(" ");
const images = [...document.images].map(i => i.naturalWidth + "x" + i.naturalHeight).join(" ");
document.title = `asc=${ascending};desc=${descending};images=${images}`;
"""


def dump_dom(page: Path) -> str:
    """The page's DOM once Chromium has loaded it and run what it allows."""
    done = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom", page.as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "<html" in done.stdout, done.stderr[-2000:]
    return done.stdout


def with_policy(page: str, policy: str | None) -> str:
    """``page`` under ``policy`` instead of its own (no policy at all for None)."""

    def meta(text: str) -> str:
        return f'<meta http-equiv="Content-Security-Policy" content="{html.escape(text)}">'

    assert meta(CONTENT_SECURITY_POLICY) in page
    return page.replace(meta(CONTENT_SECURITY_POLICY), meta(policy) if policy else "")


def test_the_page_shows_its_figure_and_sorts_its_table(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(3, 2))
    ax.plot([0, 1], [1, 0])
    fig.savefig(tmp_path / "figure.png", dpi=100)
    frame = pd.DataFrame({"metric": ["a", "b", "c", "d"], "spearman": [0.5, -0.25, 1.0, -1.0]})
    page = write_report(
        tmp_path / "report.html", "t", [], [(tmp_path / "figure.png", "f")], [("rho", frame)]
    )
    digest = base64.b64encode(hashlib.sha256(PROBE_SCRIPT.encode()).digest()).decode()
    policy = CONTENT_SECURITY_POLICY.replace("script-src ", f"script-src 'sha256-{digest}' ")
    written = with_policy(page.read_text(), policy)
    page.write_text(written.replace("</body>", f"<script>{PROBE_SCRIPT}</script></body>"))
    seen = re.search(r"<title>(asc=.*?)</title>", dump_dom(page))
    assert seen
    assert seen.group(1) == "asc=-1 -0.25 0.5 1;desc=1 0.5 -0.25 -1;images=300x200"


def shown_as_text(payload: str) -> str:
    """How the DOM dump writes ``payload`` when it is a text node."""
    return payload.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def ran(dom: str) -> bool:
    """Whether a payload's script ran: the page renamed or ``<html>`` marked."""
    root = re.search(r"<html[^>]*>", dom).group(0)
    return "data-pwned" in root or "<title>PWNED</title>" in dom


def test_markup_in_runs_configs_runs_nothing_and_shows_as_text(tmp_path):
    analysis = analyse(hostile_study(tmp_path / "sweep"), tmp_path / "analysis")
    written = (analysis / "report.html").read_text()
    unguarded = tmp_path / "without_policy.html"
    unguarded.write_text(with_policy(written, None))
    for page in (analysis / "report.html", unguarded):  # escaping alone, then with the policy
        dom = dump_dom(page)
        assert not ran(dom) and "<title>isoprobe analysis</title>" in dom
        for payload in (IMG_PAYLOAD, SVG_PAYLOAD, KEY_PAYLOAD):
            assert shown_as_text(payload) in dom, payload


def test_the_policy_stops_markup_that_escaped_escaping(tmp_path):
    """Defence in depth: the payloads pasted into the page as markup run without the page's
    policy (the check sees them run) and not with it."""
    page = write_report(tmp_path / "r.html", "t", [], [], [])
    injected = page.read_text().replace("<body>", f"<body>{IMG_PAYLOAD}{SVG_PAYLOAD}")
    page.write_text(with_policy(injected, None))
    assert ran(dump_dom(page))
    page.write_text(injected)
    dom = dump_dom(page)
    assert not ran(dom) and "<title>t</title>" in dom

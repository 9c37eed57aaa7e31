"""report.html in a real browser (headless Chromium, Debian's package): the figures decode and
a click on a header sorts the table. Skipped where no Chromium is installed."""

from __future__ import annotations

import re
import shutil
import subprocess

import pandas as pd
import pytest

from isoprobe.analysis.report import write_report

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no Chromium (apt-get install chromium)")

#: runs after the page's own script: clicks the header twice, reports what the browser sees
PROBE = """<script>
const header = [...document.querySelectorAll("#table0 th")].find(h => h.textContent === "spearman");
const rows = () => [...document.querySelectorAll("#table0 tbody tr")];
const column = () => rows().map(r => r.cells[1].textContent);
header.click(); const ascending = column().join(" ");
header.click(); const descending = column().join(" ");
const images = [...document.images].map(i => i.naturalWidth + "x" + i.naturalHeight).join(" ");
document.title = `asc=${ascending};desc=${descending};images=${images}`;
</script>"""


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
    page.write_text(page.read_text().replace("</body>", PROBE + "</body>"))
    done = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom", page.as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
    )
    seen = re.search(r"<title>(asc=.*?)</title>", done.stdout)
    assert seen, done.stderr[-2000:]
    assert seen.group(1) == "asc=-1 -0.25 0.5 1;desc=1 0.5 -0.25 -1;images=300x200"

"""report.html shows what runs hold as text: markup in a model name, a data set, an override's
key or value, a metric's name or a run directory's name is escaped in every part of the page."""

from __future__ import annotations

from html.parser import HTMLParser

import pandas as pd
import pytest

from isoprobe.analysis.report import (
    CONTENT_SECURITY_POLICY,
    Html,
    join,
    markup,
    table_html,
    write_report,
)
from tests.analysis.probed_runs import (
    IMG_PAYLOAD,
    KEY_PAYLOAD,
    SVG_PAYLOAD,
    analyse,
    hostile_study,
)

#: every element the page's own markup makes
PAGE_TAGS = {
    *(
        "html",
        "head",
        "meta",
        "title",
        "style",
        "body",
        "script",
        "h1",
        "h2",
        "h3",
        "p",
        "b",
        "code",
    ),
    *("ul", "li", "figure", "img", "figcaption", "table", "thead", "tbody", "tr", "th", "td"),
}


class Page(HTMLParser):
    """The parsed page: each element with its attributes, and each text with its elements."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.elements: list[tuple[str, dict[str, str]]] = []
        self.texts: list[tuple[tuple[str, ...], str]] = []
        self._open: list[str] = []
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        self.elements.append((tag, dict(attrs)))
        if tag not in ("meta", "img"):
            self._open.append(tag)

    def handle_endtag(self, tag):
        if tag in self._open:
            del self._open[len(self._open) - 1 - self._open[::-1].index(tag) :]

    def handle_data(self, data):
        self.texts.append((tuple(self._open), data))

    def text_in(self, tag: str) -> list[str]:
        return [text for inside, text in self.texts if tag in inside]


@pytest.fixture(scope="module")
def page(tmp_path_factory) -> Page:
    root = tmp_path_factory.mktemp("hostile")
    analysis = analyse(hostile_study(root / "sweep"), root / "analysis")
    return Page((analysis / "report.html").read_text())


def test_the_page_holds_only_its_own_elements_and_no_handler(page):
    assert {tag for tag, _ in page.elements} <= PAGE_TAGS
    assert [tag for tag, _ in page.elements].count("script") == 1
    for tag, attrs in page.elements:
        assert not [name for name in attrs if name.startswith("on")], (tag, attrs)
        if tag == "img":
            assert attrs["src"].startswith("data:image/png;base64,")


def test_the_opening_paragraph_shows_model_and_data_set_as_text(page):
    opening = next(text for text in page.text_in("p") if "runs analysed" in text)
    assert IMG_PAYLOAD in opening and SVG_PAYLOAD in opening


def test_left_out_and_unprobed_runs_are_named_as_text(page):
    assert any(text.startswith(f"{IMG_PAYLOAD}: ") for text in page.text_in("li"))
    assert any("without probe records" in t and SVG_PAYLOAD in t for t in page.text_in("p"))


def test_table_headers_and_cells_show_keys_and_values_as_text(page):
    headers, cells = page.text_in("th"), page.text_in("td")
    assert headers.count(KEY_PAYLOAD) >= 2  # the runs table and the geometry change
    for payload in (IMG_PAYLOAD, SVG_PAYLOAD, f"model={IMG_PAYLOAD}"):
        assert payload in cells, payload
    # a data set's group too small to reach the level is named in the scan's paragraph
    assert any(f"dataset={SVG_PAYLOAD}" in text for text in page.text_in("p"))


def test_captions_and_alt_text_show_a_swept_key_as_text(page):
    assert any(KEY_PAYLOAD in text for text in page.text_in("figcaption"))
    alts = [attrs["alt"] for tag, attrs in page.elements if tag == "img"]
    assert any(KEY_PAYLOAD in alt for alt in alts)


def test_title_heading_caption_and_paragraph_given_as_text_are_escaped(tmp_path):
    figure = tmp_path / "f.png"
    figure.write_bytes(b"\x89PNG\r\n\x1a\n")
    path = write_report(
        tmp_path / "r.html",
        IMG_PAYLOAD,
        [SVG_PAYLOAD],
        [(figure, SVG_PAYLOAD)],
        [(IMG_PAYLOAD, pd.DataFrame({KEY_PAYLOAD: [IMG_PAYLOAD]}))],
    )
    page = Page(path.read_text())
    assert {tag for tag, _ in page.elements} <= PAGE_TAGS
    assert page.text_in("title") == [IMG_PAYLOAD] and page.text_in("h1") == [IMG_PAYLOAD]
    assert page.text_in("h3") == [IMG_PAYLOAD] and page.text_in("th") == [KEY_PAYLOAD]
    assert SVG_PAYLOAD in page.text_in("p") and page.text_in("figcaption") == [SVG_PAYLOAD]


def test_markup_escapes_every_field_and_keeps_only_its_own_fragments():
    made = markup(
        "<p>{a} {b:.2f} {c!r} {d}</p>",
        a=IMG_PAYLOAD,
        b=1.234,
        c="<x>",
        d=markup("<i>{x}</i>", x="<"),
    )
    assert (
        made == "<p>&lt;img src=x onerror=document.title=&#x27;PWNED&#x27;&gt; 1.23 "
        "&#x27;&lt;x&gt;&#x27; <i>&lt;</i></p>"
    )
    assert isinstance(made, Html)
    assert join([markup("<li>{x}</li>", x="<")] * 2) == "<li>&lt;</li><li>&lt;</li>"
    with pytest.raises(TypeError, match="join takes Html fragments"):
        join([IMG_PAYLOAD])


def test_the_policy_allows_no_script_but_the_pages_own():
    rules = dict(rule.strip().split(" ", 1) for rule in CONTENT_SECURITY_POLICY.split(";"))
    assert rules["default-src"] == "'none'" and rules["img-src"] == "data:"
    assert rules["script-src"].startswith("'sha256-") and " " not in rules["script-src"]


def test_a_missing_value_is_an_empty_cell_whatever_its_column_holds():
    frame = pd.DataFrame({"why": [None, "too few runs"], "rho": [0.5, float("nan")]})
    page = table_html(frame, "t")
    assert page.count("<td") == 4 and "None" not in page and "nan" not in page
    assert Page(page).text_in("td") == ["0.5", "too few runs"]  # the other two cells are empty

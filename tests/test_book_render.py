"""The built book renders offline and reads well at a 1400 px wide window.

These tests read the HTML that `make book` writes to `_build/html` (`make test` builds it first)
and open every page of the table of contents once in headless Chromium (`tools/ensure_chromium.sh`
installs it). Without Chromium the browser checks are skipped locally and fail in CI (environment
variable CI set).

Static checks: no remote assets, local assets and images exist, internal links and anchors
resolve. In the browser (one Chromium run per page, a small script appended to a copy of the page
reports what it measured): math typeset without TeX errors, images decode, code blocks and display
equations fit the text column, no raw TeX in the text, tables render as styled tables, chapter
figures have a caption and alt text, chapter titles carry their number.
"""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

ROOT = Path(__file__).resolve().parents[1]
HTML_DIR = ROOT / "_build" / "html"
INTRO = "book/intro.html"
WINDOW_WIDTH = 1400


def _toc_pages() -> list[str]:
    """Every chapter listed in _toc.yml, as its built page."""
    import yaml

    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    return [chapter["file"] + ".html" for part in toc["parts"] for chapter in part["chapters"]]


# The numbered notebook chapters, and every page of the book (root page first).
CHAPTERS = [page for page in _toc_pages() if page.startswith("notebooks/")]
PAGES = [INTRO, *[page for page in _toc_pages() if page != INTRO]]

CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
    # Any host name fails to resolve: whatever renders here came from local files.
    "--host-resolver-rules=MAP * ~NOTFOUND",
    f"--window-size={WINDOW_WIDTH},2000",
]

# Tags whose URL attributes the browser fetches by itself when the page loads.
FETCHED = {
    "script": ("src",),
    "link": ("href",),
    "img": ("src", "srcset"),
    "iframe": ("src",),
    "source": ("src", "srcset"),
    "video": ("src", "poster"),
    "audio": ("src",),
    "embed": ("src",),
    "object": ("data",),
}
# Text inside these is not rendered prose: TeX delimiters there are expected.
NOT_PROSE = {"script", "style", "pre", "code", "textarea", "noscript"}


# --------------------------------------------------------------------------------------------
# helpers


class _Collector(HTMLParser):
    """Collects fetched asset URLs, link targets, element ids and the text outside code."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.assets: list[tuple[str, str, str]] = []  # (tag, attribute, url)
        self.images: list[str] = []
        self.links: list[str] = []
        self.ids: set[str] = set()
        self.text: list[str] = []
        self._skip = 0

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        for attr in FETCHED.get(tag, ()):
            value = attrs.get(attr)
            if not value:
                continue
            urls = [part.strip().split()[0] for part in value.split(",") if part.strip()] \
                if attr == "srcset" else [value.strip()]
            self.assets.extend((tag, attr, url) for url in urls)
        if tag == "img" and attrs.get("src"):
            self.images.append(attrs["src"].strip())
        if tag == "a" and attrs.get("href"):
            self.links.append(attrs["href"].strip())
        for attr in ("id", "name") if tag == "a" else ("id",):
            if attrs.get(attr):
                self.ids.add(attrs[attr])
        if tag in NOT_PROSE:
            self._skip += 1

    def handle_endtag(self, tag):
        if tag in NOT_PROSE and self._skip:
            self._skip -= 1

    def handle_data(self, data):
        if not self._skip:
            self.text.append(data)


def _parse(markup: str) -> _Collector:
    collector = _Collector()
    collector.feed(markup)
    collector.close()
    return collector


def _is_remote(url: str) -> bool:
    remote_schemes = {"http", "https", "ftp", "ws", "wss"}
    return url.startswith("//") or urlsplit(url).scheme.lower() in remote_schemes


def _local_file(page: Path, url: str) -> Path:
    """The file under _build/html that a relative URL on `page` points at."""
    target = (page.parent / unquote(urlsplit(url).path)).resolve()
    assert target.is_relative_to(HTML_DIR.resolve()), f"{url} on {page.name} leaves _build/html"
    return target


def _page(rel: str) -> Path:
    path = HTML_DIR / rel
    if not path.is_file():
        pytest.fail(
            f"{path.relative_to(ROOT)} is missing: build the book first with `make book` "
            "(`make test` does it for you)."
        )
    return path


def _listing(title: str, rel: str, items: list[str]) -> str:
    return f"{title} on {rel} ({len(items)}):\n  " + "\n  ".join(items)


@pytest.fixture(scope="session")
def chromium() -> str:
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    if binary is None:
        reason = ("headless Chromium not found (neither `chromium` nor `chromium-browser` on "
                  "PATH); run `bash tools/ensure_chromium.sh`")
        if os.environ.get("CI", "").lower() not in {"", "0", "false"}:
            pytest.fail(reason + " (CI is set, so this is an error)")
        pytest.skip(reason)
    return binary


# --------------------------------------------------------------------------------------------
# static checks on the built HTML


def test_no_page_fetches_anything_remote():
    _page(INTRO)
    offenders = []
    for page in sorted(HTML_DIR.rglob("*.html")):
        for tag, attr, url in _parse(page.read_text(encoding="utf-8")).assets:
            if _is_remote(url):
                offenders.append(f"{page.relative_to(HTML_DIR)}: <{tag} {attr}={url!r}>")
    assert not offenders, "built pages load remote assets:\n" + "\n".join(offenders)


@pytest.mark.parametrize("rel", PAGES)
def test_local_assets_exist(rel):
    page = _page(rel)
    parsed = _parse(page.read_text(encoding="utf-8"))
    missing = []
    for tag, attr, url in parsed.assets:
        if _is_remote(url) or url.startswith(("data:", "#")):
            continue
        target = _local_file(page, url)
        if not target.is_file() or target.stat().st_size == 0:
            missing.append(f"<{tag} {attr}={url!r}> -> {target}")
    assert not missing, f"{rel} points at missing or empty files:\n" + "\n".join(missing)
    if 'class="math notranslate' in page.read_text(encoding="utf-8"):
        mathjax = [url for tag, _, url in parsed.assets if tag == "script" and "tex-mml-chtml" in url]
        assert mathjax, f"{rel} has math but no MathJax script tag"


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_chapter_images_are_decodable_files(chapter):
    from PIL import Image  # matplotlib depends on Pillow

    page = _page(chapter)
    images = _parse(page.read_text(encoding="utf-8")).images
    assert images, f"{chapter} has no <img> at all"
    for src in images:
        assert not _is_remote(src), f"remote image {src}"
        if src.startswith("data:"):
            continue  # checked in the browser below
        target = _local_file(page, src)
        assert target.is_file() and target.stat().st_size > 0, f"image {src} -> {target} missing"
        if target.suffix.lower() == ".svg":
            root = ET.parse(target).getroot()
            assert root.tag.rsplit("}", 1)[-1] == "svg", f"{target} is not an SVG document"
        else:
            with Image.open(target) as im:
                im.verify()
            with Image.open(target) as im:
                im.load()
                assert im.width > 0 and im.height > 0, f"{target} has no pixels"


_IDS: dict[Path, set[str]] = {}


def _ids(target: Path) -> set[str]:
    if target not in _IDS:
        _IDS[target] = _parse(target.read_text(encoding="utf-8")).ids
    return _IDS[target]


@pytest.mark.parametrize("rel", PAGES)
def test_internal_links_resolve(rel):
    """Every local link on the page names a file of _build/html, and its #anchor an id there."""
    page = _page(rel)
    broken = []
    for href in sorted(set(_parse(page.read_text(encoding="utf-8")).links)):
        if _is_remote(href) or urlsplit(href).scheme in {"mailto", "javascript", "data", "tel"}:
            continue
        parts = urlsplit(href)
        target = page.resolve() if not parts.path else (page.parent / unquote(parts.path)).resolve()
        if target.is_dir():
            target = target / "index.html"
        if not target.is_relative_to(HTML_DIR.resolve()):
            broken.append(f"{href} (leaves _build/html)")
        elif not target.is_file():
            broken.append(f"{href} (no file {target.relative_to(HTML_DIR.resolve())})")
        elif parts.fragment and target.suffix == ".html" and unquote(parts.fragment) not in _ids(target):
            broken.append(f"{href} (no id {unquote(parts.fragment)!r} in "
                          f"{target.relative_to(HTML_DIR.resolve())})")
    assert not broken, _listing("broken internal links", rel, broken)


# --------------------------------------------------------------------------------------------
# checks in the browser: one Chromium run per page, all measurements from one appended script

_PROBE = """
<script>
(function () {
  var IMAGE_EXT = /\\.(png|svg|jpe?g|gif|webp)$/i;
  function squash(s) { return (s || "").replace(/\\s+/g, " ").trim(); }
  function clip(s, n) { s = squash(s); return s.length > n ? s.slice(0, n) + "..." : s; }
  function section(el) {
    var last = "(top)";
    var heads = document.querySelectorAll("article h1, article h2, article h3, article h4");
    for (var i = 0; i < heads.length; i++) {
      if (heads[i].compareDocumentPosition(el) & Node.DOCUMENT_POSITION_FOLLOWING) {
        last = squash(heads[i].textContent).replace(/#$/, "");
      } else { break; }
    }
    return last;
  }
  // Load every image now, so that the load event waits for them (a lazy image far below the
  // window would otherwise start loading only when the probe asks, after the load event, and
  // the virtual time budget can run out first).
  Array.prototype.forEach.call(document.images, function (im) { im.loading = "eager"; });
  function images() {
    var imgs = Array.prototype.slice.call(document.images);
    return Promise.all(imgs.map(function (im) {
      // A loaded image with a size is not decoded again: decoding a large PNG takes real time
      // that the virtual time budget does not wait for (the files are verified with Pillow).
      var decode = im.complete && im.naturalWidth > 0 ? Promise.resolve() : im.decode();
      return decode.then(function () { return true; }, function () { return false; })
        .then(function (decoded) {
          return {src: im.getAttribute("src"), decoded: decoded, complete: im.complete,
                  naturalWidth: im.naturalWidth, naturalHeight: im.naturalHeight,
                  shownWidth: im.getBoundingClientRect().width};
        });
    }));
  }
  function texOf() {
    var map = new Map();
    try {
      for (const item of MathJax.startup.document.math) {
        if (item.typesetRoot) { map.set(item.typesetRoot, item.math); }
      }
    } catch (e) { /* no MathJax on this page */ }
    return map;
  }
  function layout() {
    var article = document.querySelector("article.bd-article") || document.body;
    var column = article.getBoundingClientRect();
    var out = {code: [], equations: [], tex: [], tables: [], figures: [], h1: null,
               column: column.width};
    var pres = article.querySelectorAll(
      "div.highlight pre, div.cell_input pre, div.cell_output pre");
    pres.forEach(function (pre) {
      var r = pre.getBoundingClientRect();
      if (pre.scrollWidth > pre.clientWidth + 1 || r.right > column.right + 1) {
        var longest = (pre.textContent || "").split("\\n").reduce(function (a, b) {
          return b.length > a.length ? b : a; }, "");
        out.code.push({section: section(pre), line: clip(longest, 90), chars: longest.length,
                       scrollWidth: pre.scrollWidth, clientWidth: pre.clientWidth});
      }
    });
    var tex = texOf();
    article.querySelectorAll('mjx-container[display="true"]').forEach(function (c) {
      var math = c.querySelector("mjx-math");
      var inner = math ? math.getBoundingClientRect().width : 0;
      var r = c.getBoundingClientRect();
      if (inner > c.clientWidth + 1 || c.scrollWidth > c.clientWidth + 1
          || r.right > column.right + 1) {
        out.equations.push({section: section(c), tex: clip(tex.get(c) || "", 90),
                            width: Math.round(inner), column: c.clientWidth});
      }
    });
    var skip = /^(SCRIPT|STYLE|PRE|CODE|TEXTAREA|NOSCRIPT|MJX-CONTAINER|MJX-ASSISTIVE-MML)$/;
    var walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT, {
      acceptNode: function (node) {
        for (var p = node.parentNode; p && p !== document.body; p = p.parentNode) {
          if (skip.test(p.nodeName) || p.id === "rope-probe-report") {
            return NodeFilter.FILTER_REJECT;
          }
        }
        return NodeFilter.FILTER_ACCEPT;
      }
    });
    var raw = /\\$\\$|\\$|\\\\\\[|\\\\\\(|\\\\[A-Za-z]+/g;
    for (var node = walker.nextNode(); node; node = walker.nextNode()) {
      var text = node.nodeValue, found = text.match(raw);
      if (found) {
        var at = text.search(raw);
        out.tex.push({section: section(node.parentNode),
                      found: Array.from(new Set(found)).slice(0, 6).join(" "),
                      context: clip(text.slice(Math.max(0, at - 40), at + 80), 120)});
      }
    }
    // A markdown table shown as text: a separator row (| --- |, which smartquotes turn into
    // an em dash in prose) in a paragraph, or in a printed cell output.
    var sepProse = /\\|\\s*:?(-{3,}|\\u2014|\\u2013):?\\s*\\|/;
    var sepOutput = /^\\s*\\|?\\s*:?-{3,}:?\\s*(\\|\\s*:?-{3,}:?\\s*)+\\|?\\s*$/m;
    article.querySelectorAll("p, li, div.cell_output pre").forEach(function (el) {
      var text = el.textContent || "";
      if (el.nodeName === "PRE" ? sepOutput.test(text) : sepProse.test(text)) {
        out.tables.push({section: section(el),
                         where: "markdown table in a " + (el.nodeName === "PRE" ? "printed output" : "paragraph"),
                         start: clip(text, 80)});
      }
    });
    // An HTML table without the theme's styling (a bare <table> from IPython.display.HTML) has
    // no cell padding: its numbers run into each other.
    article.querySelectorAll("table").forEach(function (table) {
      var cell = table.querySelector("tbody td") || table.querySelector("td, th");
      if (!cell) { return; }
      var cs = getComputedStyle(cell);
      if (parseFloat(cs.paddingLeft) + parseFloat(cs.paddingRight) < 4) {
        out.tables.push({section: section(table), where: "unpadded HTML table",
                         start: clip(table.textContent, 80)});
      }
    });
    article.querySelectorAll("img").forEach(function (im) {
      var alt = squash(im.getAttribute("alt"));
      var figure = im.closest("figure");
      var caption = figure ? figure.querySelector("figcaption") : null;
      var missing = [];
      if (!alt || IMAGE_EXT.test(alt) || alt.indexOf("_images/") >= 0) { missing.push("alt text"); }
      if (!caption || !squash(caption.textContent)) { missing.push("caption"); }
      if (missing.length) {
        var src = im.getAttribute("src") || "";
        out.figures.push({section: section(im), src: src.split("/").pop().slice(0, 16) + "...",
                          missing: missing});
      }
    });
    var h1 = article.querySelector("h1");
    out.h1 = h1 ? {text: squash(h1.textContent).replace(/#$/, ""),
                   numbered: !!h1.querySelector("span.section-number")} : null;
    return out;
  }
  function settle() {
    var mj = window.MathJax && window.MathJax.startup && window.MathJax.startup.promise;
    return Promise.resolve(mj).then(function () { return document.fonts.ready; });
  }
  function report(value) {
    var pre = document.createElement("pre");
    pre.id = "rope-probe-report";
    pre.textContent = JSON.stringify(value);
    document.body.appendChild(pre);
  }
  window.addEventListener("load", function () {
    settle().then(function () { return images(); }).then(function (imgs) {
      var result = layout();
      result.images = imgs;
      report(result);
    }).catch(function (e) { report({error: String(e && e.stack || e)}); });
  });
})();
</script>
"""


PROBE_ATTEMPTS = 3


@pytest.fixture(scope="session")
def probe(chromium, tmp_path_factory):
    """probe(rel) -> (dom, report): the page after its scripts ran, and what _PROBE measured.

    A static page cannot report its layout through --dump-dom, so Chromium opens a copy of the
    page whose <base> points back at the built page's folder (every relative URL resolves as on
    the original) with _PROBE appended; the probe writes its findings as JSON into a <pre>.
    Each page is opened once per session.
    """
    cache: dict[str, tuple[str, dict]] = {}

    def run(rel: str) -> tuple[str, dict]:
        if rel not in cache:
            page = _page(rel)
            source = page.read_text(encoding="utf-8")
            base = f'<base href="{page.parent.resolve().as_uri()}/">'
            probed, n = re.subn(r"(<head\b[^>]*>)", lambda m: m.group(1) + base, source, count=1)
            assert n == 1, f"no <head> in {rel}"
            probed, n = re.subn(r"(</body\s*>)", lambda m: _PROBE + m.group(1), probed, count=1)
            assert n == 1, f"no </body> in {rel}"
            work = tmp_path_factory.mktemp("probe")
            copy = work / "probe.html"
            copy.write_text(probed, encoding="utf-8")
            # On a loaded machine the virtual time budget can run out before MathJax is done
            # (rarely): then the DOM has no report, and a run with a larger budget settles it.
            for attempt in range(PROBE_ATTEMPTS):
                budget = f"--virtual-time-budget={60000 * 3**attempt}"
                proc = subprocess.run(
                    [chromium, *CHROMIUM_FLAGS, budget, f"--user-data-dir={work / f'profile{attempt}'}",
                     "--dump-dom", copy.as_uri()],
                    capture_output=True, text=True, timeout=180,
                )
                assert proc.returncode == 0 and "<html" in proc.stdout, (
                    f"chromium failed on {rel} (exit {proc.returncode}):\n{proc.stderr[-3000:]}"
                )
                dom = proc.stdout
                # The theme adds attributes (tabindex) to every <pre>.
                found = re.search(r'<pre id="rope-probe-report"[^>]*>(.*?)</pre>', dom, re.S)
                if found:
                    break
            assert found, (f"the probe did not report on {rel} in {PROBE_ATTEMPTS} runs (page "
                           "scripts did not finish in time?)")
            report = json.loads(html.unescape(found.group(1)))
            assert "error" not in report, f"the probe failed on {rel}: {report['error']}"
            cache[rel] = (dom, report)
        return cache[rel]

    return run


MATH_PAGES = [
    rel for rel in PAGES
    if (HTML_DIR / rel).is_file() and 'class="math notranslate' in (HTML_DIR / rel).read_text("utf-8")
] or [INTRO]


@pytest.mark.parametrize("rel", MATH_PAGES)
def test_math_is_typeset_in_browser(rel, probe):
    dom, _ = probe(rel)
    typeset = "<mjx-container" in dom  # a bool, so a failure does not print the whole DOM
    assert typeset, (
        f"MathJax typeset nothing on {rel}: is _build/html/mathjax/ there (tools/fetch_mathjax.sh)"
        " and does the page's MathJax script tag point at it?"
    )
    tex_errors = re.findall(r'data-mjx-error="([^"]*)"', dom)
    clean = not tex_errors and "<mjx-merror" not in dom
    assert clean, f"MathJax TeX errors on {rel}: {tex_errors}"


@pytest.mark.parametrize("rel", PAGES)
def test_no_raw_tex_in_text(rel, probe):
    """No TeX outside typeset math: `$`, `$$`, `\\(`, `\\[` or a `\\command` in the page text."""
    _, report = probe(rel)
    found = [f"[{t['section']}] {t['found']} in: {t['context']}" for t in report["tex"]]
    assert not found, _listing("raw TeX in the text", rel, found)


@pytest.mark.parametrize("rel", PAGES)
def test_tables_render_as_tables(rel, probe):
    """A table is a styled HTML table: not markdown source shown as a paragraph or a printed
    output, and not a bare <table> whose cells have no padding."""
    _, report = probe(rel)
    found = [f"[{t['section']}] {t['where']}: {t['start']}" for t in report["tables"]]
    assert not found, _listing("tables that do not render as tables", rel, found)


@pytest.mark.parametrize("rel", PAGES)
def test_code_fits_column(rel, probe):
    """No code cell, output or code block scrolls sideways in the text column."""
    _, report = probe(rel)
    wide = [f"[{c['section']}] {c['chars']} chars, {c['scrollWidth']} > {c['clientWidth']} px: "
            f"{c['line']}" for c in report["code"]]
    assert not wide, _listing(f"code wider than the column at {WINDOW_WIDTH} px", rel, wide)


@pytest.mark.parametrize("rel", PAGES)
def test_display_equations_fit_column(rel, probe):
    _, report = probe(rel)
    wide = [f"[{e['section']}] {e['width']} > {e['column']} px: {e['tex']}"
            for e in report["equations"]]
    assert not wide, _listing(f"display equations wider than the column at {WINDOW_WIDTH} px",
                              rel, wide)


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_chapter_figures_have_caption_and_alt(chapter, probe):
    _, report = probe(chapter)
    bare = [f"[{f['section']}] {f['src']} without {' and '.join(f['missing'])}"
            for f in report["figures"]]
    assert not bare, _listing("figures without caption or alt text", chapter, bare)


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_chapter_title_is_numbered(chapter, probe):
    _, report = probe(chapter)
    h1 = report["h1"]
    assert h1 is not None, f"{chapter} has no <h1> in its article"
    assert h1["numbered"], (
        f"{chapter}: the title {h1['text']!r} has no chapter number (span.section-number); "
        "is the chapter under a `numbered: true` part of _toc.yml, with one # title?"
    )


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_chapter_images_load_in_browser(chapter, probe):
    """Every <img> of the chapter decodes in Chromium (naturalWidth > 0)."""
    _, report = probe(chapter)
    images = report["images"]
    assert images, f"{chapter} has no <img> at all"
    broken = [r for r in images if not (r["decoded"] and r["complete"] and r["naturalWidth"] > 0)]
    assert not broken, f"images that did not load on {chapter}: {broken}"


# Figures as the reader sees them: rope.analysis.book draws each one as a pixel-doubled PNG whose text
# chunks record the smallest font it draws (points) and the most panels it sets side by side.
MIN_TEXT_PX = 9.0  # the smallest text height, as displayed at the window width above
MIN_DENSITY = 2.0  # image pixels per displayed pixel: sharp on a high-density screen
MAX_COLUMNS = 2


def figure_legibility(png: Path, shown_width: float) -> dict:
    """What a chapter figure shows at ``shown_width`` CSS pixels: image pixels per displayed pixel,
    the height of its smallest text in displayed pixels, its panels side by side."""
    from PIL import Image

    from rope.analysis import book

    with Image.open(png) as im:
        info, width = dict(im.info), im.width
    if book.MIN_FONT_KEY not in info:
        return {"drawn by book.start()'s style": False}
    inches = width / info["dpi"][0]  # the figure's width as saved (bbox tight)
    return {"density": width / shown_width,
            "smallest text px": float(info[book.MIN_FONT_KEY]) / 72 * shown_width / inches,
            "columns": int(info[book.COLUMNS_KEY])}


def legible(measured: dict) -> bool:
    return (measured.get("density", 0) >= MIN_DENSITY - 0.01 and measured["smallest text px"] >= MIN_TEXT_PX - 0.01
            and measured["columns"] <= MAX_COLUMNS)


def test_figure_legibility_is_measured_from_the_png_and_its_displayed_width(tmp_path):
    """A figure 7 in wide with 9 pt text, saved at 200 dpi (1400 px) and shown 700 px wide: 2 image
    pixels per screen pixel, 9 pt = 12.5 px; shown 350 px wide its text is half as tall; a figure
    drawn outside the book's style is reported as such."""
    from PIL import Image
    from PIL.PngImagePlugin import PngInfo

    from rope.analysis import book

    chunks = PngInfo()
    chunks.add_text(book.MIN_FONT_KEY, "9")
    chunks.add_text(book.COLUMNS_KEY, "2")
    Image.new("RGB", (1400, 600)).save(tmp_path / "f.png", pnginfo=chunks, dpi=(200, 200))
    Image.new("RGB", (1400, 600)).save(tmp_path / "plain.png", dpi=(200, 200))
    shown = figure_legibility(tmp_path / "f.png", 700)
    # (a PNG stores its resolution in whole pixels per metre: 200 dpi reads back as 199.9996)
    assert shown == {"density": 2.0, "smallest text px": pytest.approx(12.5, rel=1e-5), "columns": 2}
    assert legible(shown)
    assert figure_legibility(tmp_path / "f.png", 350)["smallest text px"] == pytest.approx(6.25, rel=1e-5)
    assert not legible(figure_legibility(tmp_path / "f.png", 1400))  # 1x density
    assert not legible(figure_legibility(tmp_path / "plain.png", 700))


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_chapter_figures_are_legible_at_the_column_width(chapter, probe):
    """Every figure: at least 2 image pixels per displayed pixel, text at least 9 px high as shown,
    at most two panels side by side."""
    _, report = probe(chapter)
    page = _page(chapter)
    illegible = []
    for image in report["images"]:
        src = image["src"] or ""
        if not src.endswith(".png") or "_images/" not in src or _is_remote(src):
            continue  # not a cell's figure (the theme's launch-button logos)
        measured = figure_legibility(_local_file(page, src), image["shownWidth"])
        if not legible(measured):
            illegible.append(f"{src.rsplit('/', 1)[-1][:16]}...: {measured}")
    assert not illegible, _listing("figures not legible at the column width", chapter, illegible)

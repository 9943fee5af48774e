"""The built book renders offline: math typeset by the local MathJax, images load, no remote assets.

These tests read the HTML that `make book` writes to `_build/html` (`make test` builds it first)
and open pages in headless Chromium (`tools/ensure_chromium.sh` installs it). Without Chromium
the browser checks are skipped locally and fail in CI (environment variable CI set).
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


def _toc_chapters() -> list[str]:
    """Every chapter listed in _toc.yml, as its built page."""
    import yaml

    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    return [chapter["file"] + ".html" for part in toc["parts"] for chapter in part["chapters"]]


# The notebook chapters; the other pages of the table of contents (book/references) have no math or figures.
CHAPTERS = [page for page in _toc_chapters() if page.startswith("notebooks/")]
PAGES = [INTRO, *CHAPTERS]

CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    # Any host name fails to resolve: whatever renders here came from local files.
    "--host-resolver-rules=MAP * ~NOTFOUND",
    "--virtual-time-budget=20000",
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
    """Collects fetched asset URLs and the rendered text outside script, style and code."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.assets: list[tuple[str, str, str]] = []  # (tag, attribute, url)
        self.images: list[str] = []
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


@pytest.fixture(scope="session")
def dump_dom(chromium, tmp_path_factory):
    """dump_dom(path) -> the DOM of the file after its scripts ran, cached per path."""
    cache: dict[Path, str] = {}

    def run(path: Path) -> str:
        if path not in cache:
            profile = tmp_path_factory.mktemp("chromium-profile")
            proc = subprocess.run(
                [chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--dump-dom",
                 path.resolve().as_uri()],
                capture_output=True, text=True, timeout=180,
            )
            assert proc.returncode == 0 and "<html" in proc.stdout, (
                f"chromium failed on {path} (exit {proc.returncode}):\n{proc.stderr[-3000:]}"
            )
            cache[path] = proc.stdout
        return cache[path]

    return run


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
    mathjax = [url for tag, _, url in parsed.assets if tag == "script" and "tex-mml-chtml" in url]
    assert mathjax, f"{rel} has no MathJax script tag"


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


# --------------------------------------------------------------------------------------------
# checks in the browser


@pytest.mark.parametrize("rel", PAGES)
def test_math_is_typeset_in_browser(rel, dump_dom):
    dom = dump_dom(_page(rel))
    typeset = "<mjx-container" in dom  # a bool, so a failure does not print the whole DOM
    assert typeset, (
        f"MathJax typeset nothing on {rel}: is _build/html/mathjax/ there (tools/fetch_mathjax.sh)"
        " and does the page's MathJax script tag point at it?"
    )
    tex_errors = re.findall(r'data-mjx-error="([^"]*)"', dom)
    clean = not tex_errors and "<mjx-merror" not in dom
    assert clean, f"MathJax TeX errors on {rel}: {tex_errors}"
    text = "".join(_parse(dom).text)
    for raw in ("$$", "\\[", "\\("):
        at = text.find(raw)
        context = text[max(0, at - 80):at + 80]
        assert at < 0, f"raw {raw!r} left in the rendered text of {rel}: ...{context}..."


_IMAGE_PROBE = """
<script>
(function () {
  var imgs = Array.prototype.slice.call(document.images);
  imgs.forEach(function (im) { im.loading = "eager"; });
  Promise.all(imgs.map(function (im) {
    return im.decode().then(function () { return true; }, function () { return false; })
      .then(function (decoded) {
        return {src: im.getAttribute("src"), decoded: decoded, complete: im.complete,
                naturalWidth: im.naturalWidth, naturalHeight: im.naturalHeight};
      });
  })).then(function (report) {
    var pre = document.createElement("pre");
    pre.id = "rope-image-report";
    pre.textContent = JSON.stringify(report);
    document.body.appendChild(pre);
  });
})();
</script>
"""


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_chapter_images_load_in_browser(chapter, dump_dom, tmp_path):
    """Every <img> of the chapter decodes in Chromium (naturalWidth > 0).

    A static page cannot report its images' load state through --dump-dom, so the test opens a
    copy of the page whose <base> points back at the built page's folder (every relative URL
    resolves as on the original) with a small script appended that records, for each image,
    whether the browser decoded it.
    """
    page = _page(chapter)
    source = page.read_text(encoding="utf-8")
    base = f'<base href="{page.parent.resolve().as_uri()}/">'
    probed, n = re.subn(r"(<head\b[^>]*>)", lambda m: m.group(1) + base, source, count=1)
    assert n == 1, "no <head> in the chapter page"
    probed, n = re.subn(r"(</body\s*>)", lambda m: _IMAGE_PROBE + m.group(1), probed, count=1)
    assert n == 1, "no </body> in the chapter page"
    copy = tmp_path / "probe.html"
    copy.write_text(probed, encoding="utf-8")

    dom = dump_dom(copy)
    # The theme adds attributes (tabindex) to every <pre>.
    found = re.search(r'<pre id="rope-image-report"[^>]*>(.*?)</pre>', dom, re.S)
    assert found, "the image probe did not report (page scripts did not finish in time?)"
    report = json.loads(html.unescape(found.group(1)))
    assert report, f"{chapter} has no <img> at all"
    broken = [r for r in report if not (r["decoded"] and r["complete"] and r["naturalWidth"] > 0)]
    assert not broken, f"images that did not load on {chapter}: {broken}"

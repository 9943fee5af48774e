"""Full-page screenshots of the built book, one PNG per page, for looking at the layout.

Builds nothing: it reads the pages `make book` wrote to _build/html. For every page of _toc.yml
(the root page first) headless Chromium opens the page once at WIDTH px to measure its height
after MathJax has typeset, then once more with a window that tall to take the screenshot.
Pages taller than --tile px are shot in several tiles, NAME-1.png, NAME-2.png, ...

    .venv/bin/python tools/screenshots.py [OUT_DIR] [--only 05 07 ...] [--width 1400]

OUT_DIR defaults to /tmp/shots. `bash tools/ensure_chromium.sh` installs Chromium.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HTML_DIR = ROOT / "_build" / "html"

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--hide-scrollbars",
    "--disable-background-networking",
    "--disable-component-update",
    "--host-resolver-rules=MAP * ~NOTFOUND",
    "--virtual-time-budget=60000",
]

# Appended to a copy of the page: once MathJax and the fonts are done, record the page height.
PROBE = """
<script>
window.addEventListener("load", function () {
  var mj = window.MathJax && window.MathJax.startup && window.MathJax.startup.promise;
  Promise.resolve(mj).then(function () { return document.fonts.ready; }).then(function () {
    var pre = document.createElement("pre");
    pre.id = "rope-shot-height";
    pre.style.display = "none";
    pre.textContent = String(Math.ceil(Math.max(document.documentElement.scrollHeight,
                                                document.body.scrollHeight)));
    document.body.appendChild(pre);
  });
});
</script>
"""


def toc_pages() -> list[str]:
    import yaml

    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    pages = [toc["root"]] + [ch["file"] for part in toc["parts"] for ch in part["chapters"]]
    return [page + ".html" for page in dict.fromkeys(pages)]


def probed_copy(page: Path, folder: Path, offset: int = 0) -> Path:
    """A copy of the page that loads its assets from the original folder, with PROBE appended;
    for a tile below the top, the page is shifted up by `offset` px (a headless screenshot
    always starts at the top of the document)."""
    source = page.read_text(encoding="utf-8")
    head = f'<base href="{page.parent.resolve().as_uri()}/">'
    if offset:
        head += f"<style>html {{ margin-top: -{offset}px !important; }}</style>"
    source = re.sub(r"(<head\b[^>]*>)", lambda m: m.group(1) + head, source, count=1)
    source = re.sub(r"(</body\s*>)", lambda m: PROBE + m.group(1), source, count=1)
    copy = folder / f"{page.stem}.{offset}.probe.html"
    copy.write_text(source, encoding="utf-8")
    return copy


def chromium(binary: str, profile: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([binary, *FLAGS, f"--user-data-dir={profile}", *args],
                          capture_output=True, text=True, timeout=300)


def page_height(binary: str, copy: Path, width: int, profile: Path) -> int:
    for _ in range(3):
        proc = chromium(binary, profile, f"--window-size={width},2000", "--dump-dom", copy.as_uri())
        found = re.search(r'<pre id="rope-shot-height"[^>]*>(\d+)</pre>', proc.stdout)
        if found:
            return int(found.group(1))
    raise RuntimeError(f"could not measure the height of {copy.name}: {proc.stderr[-2000:]}")


def shoot(binary: str, rel: str, out: Path, width: int, tile: int, work: Path) -> list[Path]:
    page = HTML_DIR / rel
    if not page.is_file():
        raise SystemExit(f"{page} is missing: build the book first (`make book`)")
    copy = probed_copy(page, work)
    profile = work / "profile"
    height = page_height(binary, copy, width, profile)
    name = rel.removesuffix(".html").replace("/", "_")
    tiles = max(1, -(-height // tile))
    shots = []
    for k in range(tiles):
        offset = k * tile
        window = min(tile, height - offset) if tiles > 1 else height
        target = out / (f"{name}.png" if tiles == 1 else f"{name}-{k + 1}.png")
        url = probed_copy(page, work, offset).as_uri()
        proc = chromium(binary, profile, f"--window-size={width},{window}",
                        f"--screenshot={target}", url)
        if proc.returncode != 0 or not target.is_file():
            raise RuntimeError(f"screenshot of {rel} failed: {proc.stderr[-2000:]}")
        shots.append(target)
    print(f"{rel}: {height} px -> {', '.join(s.name for s in shots)}")
    return shots


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", nargs="?", default="/tmp/shots", help="folder for the PNGs")
    parser.add_argument("--width", type=int, default=1400, help="window width in px")
    parser.add_argument("--tile", type=int, default=40000,
                        help="pages taller than this many px are shot in tiles")
    parser.add_argument("--only", nargs="*", default=None,
                        help="only pages whose path contains one of these strings")
    args = parser.parse_args(argv)
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    if binary is None:
        raise SystemExit("Chromium not found: run `bash tools/ensure_chromium.sh`")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    pages = toc_pages()
    if args.only:
        pages = [p for p in pages if any(s in p for s in args.only)]
    with tempfile.TemporaryDirectory(prefix="rope-shots-") as tmp:
        for rel in pages:
            shoot(binary, rel, out, args.width, args.tile, Path(tmp))
    return 0


if __name__ == "__main__":
    sys.exit(main())

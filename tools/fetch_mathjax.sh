#!/usr/bin/env bash
# Put MathJax 3 (the npm package's es5/ folder) under _mathjax/mathjax/, so the built book
# typesets math offline. Idempotent: does nothing when the file is already there.
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION=3.2.2
DEST=_mathjax/mathjax
if [[ -s "$DEST/tex-mml-chtml.js" ]]; then
  echo "MathJax already present in $DEST"
  exit 0
fi

command -v npm >/dev/null || { echo "error: npm is required to fetch mathjax@$VERSION" >&2; exit 1; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
tarball=$(cd "$tmp" && npm pack --silent "mathjax@$VERSION" | tail -n 1)
[[ -s "$tmp/$tarball" ]] || { echo "error: npm pack produced no tarball" >&2; exit 1; }
tar -xzf "$tmp/$tarball" -C "$tmp"
[[ -s "$tmp/package/es5/tex-mml-chtml.js" ]] || { echo "error: es5/tex-mml-chtml.js missing from $tarball" >&2; exit 1; }

rm -rf "$DEST"
mkdir -p "$(dirname "$DEST")"
cp -R "$tmp/package/es5" "$DEST"
echo "MathJax $VERSION installed in $DEST"

#!/usr/bin/env bash
# Make sure a headless Chromium is available for tests/test_book_render.py. Idempotent.
set -euo pipefail

find_chromium() { command -v chromium || command -v chromium-browser || true; }

bin=$(find_chromium)
if [[ -z "$bin" ]]; then
  echo "Chromium not found; installing Debian's chromium package"
  SUDO=""
  [[ $(id -u) -eq 0 ]] || SUDO="sudo"
  $SUDO apt-get update -qq
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
  bin=$(find_chromium)
  [[ -n "$bin" ]] || { echo "error: chromium still not on PATH after install" >&2; exit 1; }
fi
echo "Using $bin: $("$bin" --version 2>/dev/null || echo 'version unknown')"

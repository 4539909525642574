#!/bin/sh
# Install Debian's chromium for the real-browser tests (tests/test_viz_browser.py) when it is missing.
# Playwright drives this system browser; it never downloads one of its own. Idempotent, and never fails
# the build: without a browser the browser tests skip and say why.
set -u
BROWSER=/usr/bin/chromium
if [ -x "$BROWSER" ]; then
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "ensure-chromium: no apt-get here; browser tests will skip" >&2
    exit 0
fi
SUDO=""
if [ "$(id -u)" != 0 ]; then
    if command -v sudo >/dev/null 2>&1; then SUDO="sudo -n"; else
        echo "ensure-chromium: not root and no sudo; browser tests will skip" >&2
        exit 0
    fi
fi
echo "ensure-chromium: installing chromium with apt-get (once)" >&2
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq >/dev/null 2>&1 || true
$SUDO apt-get install -y -qq --no-install-recommends chromium >/dev/null 2>&1 \
    || echo "ensure-chromium: apt-get install chromium failed; browser tests will skip" >&2
exit 0

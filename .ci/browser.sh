#!/bin/sh
# Debian's chromium for the browser tests (Playwright drives /usr/bin/chromium; no browser is downloaded).
# Nothing to do where it is installed. Uses sudo only when not root. On a machine without apt-get, or
# without root or password-less sudo, it says so and carries on: the browser tests then skip, saying why.
set -u
[ -x /usr/bin/chromium ] && exit 0
if ! command -v apt-get >/dev/null 2>&1; then
    echo "browser.sh: no apt-get here; install chromium at /usr/bin/chromium or the browser tests skip" >&2
    exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    if ! sudo -n true 2>/dev/null; then
        echo "browser.sh: not root and no password-less sudo; the browser tests skip without chromium" >&2
        exit 0
    fi
    SUDO="sudo -n"
fi
$SUDO apt-get update -qq && $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null

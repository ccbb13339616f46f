#!/bin/sh
# Install Debian's chromium + chromium-driver when either is missing (for the browser tests).
# Idempotent and quiet: does nothing when both are there. Needs root (or sudo) to install.
set -eu
if [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; then
    exit 0
fi
SUDO=""
if [ "$(id -u)" != 0 ]; then
    command -v sudo >/dev/null 2>&1 || { echo "ensure-browser: need root or sudo to install chromium" >&2; exit 1; }
    SUDO="sudo"
fi
echo "ensure-browser: installing chromium and chromium-driver" >&2
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq >/dev/null
$SUDO apt-get install -y -qq chromium chromium-driver >/dev/null
[ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ] || {
    echo "ensure-browser: install finished but /usr/bin/chromium or /usr/bin/chromedriver is missing" >&2
    exit 1
}

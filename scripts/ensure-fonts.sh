#!/bin/sh
# Install Debian's fonts-noto-cjk when no Noto CJK font is installed, so the PNG draws Chinese,
# Japanese and Korean tokens instead of empty boxes (bertattn.viz.png looks the font up through
# matplotlib; without one it warns once and draws boxes). Idempotent and quiet: does nothing when
# a Noto CJK font is there. Needs root (or sudo) to install. A failed install is reported and
# tolerated (exit 0): the PNG still renders (with boxes and one warning); the CJK test fails.
set -u
if command -v fc-list >/dev/null 2>&1 && fc-list 2>/dev/null | grep -q "Noto Sans CJK"; then
    exit 0
fi
if [ -n "$(find /usr/share/fonts -iname 'NotoSansCJK*' 2>/dev/null | head -n 1)" ]; then
    exit 0  # installed, but fontconfig (fc-list) is missing or not refreshed
fi
SUDO=""
if [ "$(id -u)" != 0 ]; then
    if ! command -v sudo >/dev/null 2>&1; then
        echo "ensure-fonts: need root or sudo to install fonts-noto-cjk; CJK tokens will be drawn as boxes in PNGs" >&2
        exit 0
    fi
    SUDO="sudo"
fi
echo "ensure-fonts: installing fonts-noto-cjk (CJK glyphs for the PNG)" >&2
export DEBIAN_FRONTEND=noninteractive
LOG=$(mktemp)
if ! { $SUDO apt-get update -qq >"$LOG" 2>&1 &&
       $SUDO apt-get install -y -qq --no-install-recommends fonts-noto-cjk >>"$LOG" 2>&1; }; then
    tail -n 5 "$LOG" >&2
    rm -f "$LOG"
    echo "ensure-fonts: could not install fonts-noto-cjk; CJK tokens will be drawn as boxes in PNGs (install it, or any CJK font matplotlib can find)" >&2
    exit 0
fi
rm -f "$LOG"
if ! fc-list 2>/dev/null | grep -q "Noto Sans CJK"; then
    echo "ensure-fonts: fonts-noto-cjk installed but fc-list does not list a Noto Sans CJK font" >&2
fi
exit 0

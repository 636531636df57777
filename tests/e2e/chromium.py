"""Headless Chromium for the audit dashboard: the DOM after the page's script ran, per-section text, and a
screenshot of one section at desktop width. Used by tests/e2e/test_audit_html.py and by
tests/e2e/dashboard_screens.py (the screenshots in docs/images).

Chromium runs as root without its sandbox, with a new empty profile per run, everything that would phone
home off, and every host name failing to resolve: a page must render from its file alone (and this test
bed talks to loopback only).
"""

from __future__ import annotations

import re
import shutil
import struct
import subprocess
import tempfile
import zlib
from html.parser import HTMLParser
from pathlib import Path

DESKTOP = 1440
SECTIONS = ("glance", "drift", "fleet", "problems", "fixes", "versions")
FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-default-apps", "--no-proxy-server", "--host-resolver-rules=MAP * ~NOTFOUND",
    "--hide-scrollbars", "--force-device-scale-factor=1",
]


def find_chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


def run(browser: str, *args: str, window: tuple[int, int] = (DESKTOP, 1000)
        ) -> subprocess.CompletedProcess[str]:
    with tempfile.TemporaryDirectory(prefix="chromium-profile-") as profile:
        return subprocess.run(
            [browser, *FLAGS, f"--window-size={window[0]},{window[1]}", f"--user-data-dir={profile}", *args],
            capture_output=True, text=True, timeout=180)


def dump_dom(browser: str, url: str) -> str:
    done = run(browser, "--dump-dom", url)
    if done.returncode != 0:
        raise RuntimeError(f"chromium --dump-dom failed: {done.stderr[-2000:]}")
    return done.stdout


class Dom(HTMLParser):
    """The dumped DOM: visible text per section, and every element's attributes by tag."""

    VOID = frozenset({"meta", "link", "br", "img", "input", "hr", "circle", "line", "polyline"})

    def __init__(self, html: str) -> None:
        super().__init__()
        self.sections: dict[str, list[str]] = {}
        self.elements: list[tuple[str, dict[str, str], str | None]] = []  # tag, attrs, section
        self._stack: list[tuple[str, str | None]] = []
        self._skip = 0
        self.feed(html)

    @property
    def _section(self) -> str | None:
        return next((sid for _, sid in reversed(self._stack) if sid), None)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = {name: value or "" for name, value in attrs}
        if tag in ("script", "style"):
            self._skip += 1
        sid = values.get("id") if tag == "section" else None
        self.elements.append((tag, values, sid or self._section))
        if tag not in self.VOID:
            self._stack.append((tag, sid))
        if sid:
            self.sections.setdefault(sid, [])

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.elements.append((tag, {name: value or "" for name, value in attrs}, self._section))

    def handle_endtag(self, tag: str) -> None:
        if tag in ("script", "style"):
            self._skip -= 1
        if tag in self.VOID:
            return
        while self._stack:
            if self._stack.pop()[0] == tag:
                break

    def handle_data(self, data: str) -> None:
        section = self._section
        if not self._skip and section and data.strip():
            self.sections[section].append(" ".join(data.split()))

    def text(self, section: str) -> str:
        return " ".join(self.sections.get(section, []))

    def find(self, tag: str, section: str | None = None, **attrs: str) -> list[dict[str, str]]:
        """Elements with these attribute values; `class_` matches one class among the element's."""
        wanted = dict(attrs)
        css = wanted.pop("class_", None)
        return [values for name, values, where in self.elements
                if name == tag and (section is None or where == section)
                and all(values.get(k) == v for k, v in wanted.items())
                and (css is None or css in values.get("class", "").split())]


def only_section(page: str, section: str, extra: str = "") -> str:
    """The page showing one section alone (the others and the header hidden), for its screenshot."""
    style = (f"<style>body > header, main > section:not(#{section}) {{ display: none !important; }}"
             f" main > section#{section} {{ border-top: 0; content-visibility: visible !important; }}"
             "</style>")
    return page.replace("</head>", style + "</head>", 1).replace("</body>", extra + "</body>", 1)


_MEASURE = ("<script>document.body.setAttribute('data-height', "
            "String(Math.ceil(document.documentElement.getBoundingClientRect().height)));</script>")


def screenshot_section(browser: str, html: Path, section: str, png: Path, *, width: int = DESKTOP,
                       max_height: int = 1500) -> tuple[int, int]:
    """A PNG of one section at desktop width, as tall as the section (at most max_height)."""
    page = html.read_text()
    with tempfile.TemporaryDirectory(prefix="section-") as work:
        measured = Path(work) / "measure.html"
        measured.write_text(only_section(page, section, _MEASURE))
        found = re.search(r'data-height="(\d+)"', dump_dom(browser, measured.as_uri()))
        height = min(max_height, int(found.group(1)) if found else max_height)
        shown = Path(work) / "section.html"
        shown.write_text(only_section(page, section))
        done = run(browser, f"--screenshot={png}", shown.as_uri(), window=(width, height))
        if done.returncode != 0 or not png.exists():
            raise RuntimeError(f"chromium --screenshot failed: {done.stderr[-2000:]}")
    return width, height


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def png_colours(path: Path) -> int:
    """How many distinct byte values the image data holds: a blank page has a handful."""
    data, offset, idat = path.read_bytes(), 8, b""
    while offset < len(data):
        (length,), kind = struct.unpack(">I", data[offset:offset + 4]), data[offset + 4:offset + 8]
        if kind == b"IDAT":
            idat += data[offset + 8:offset + 8 + length]
        offset += 12 + length
    return len(set(zlib.decompress(idat)))

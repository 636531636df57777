"""The audit's HTML report opens in a real browser: headless Chromium renders the file (file://, no network),
its inline JS runs (the filter from the URL hash hides rows and counts them), and the page shows the
targets, finding codes and the drift section. Without Chromium it skips, except under CI=true, where it
fails (.ci/run installs Debian's `chromium`)."""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import zlib
from collections.abc import Callable
from html.parser import HTMLParser
from pathlib import Path

import pytest

from tests.conftest import in_ci
from tests.e2e.conftest import host_args, run_cli
from tests.e2e.scenarios import problem_case
from tests.lab.bed import Lab
from tests.lab.container import Container

WINDOW = (1280, 1400)
# As root, without the sandbox; everything that would phone home is off, and every host name fails to
# resolve: the page must render from the file alone (and this test bed talks to loopback only).
CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-default-apps", "--no-proxy-server", "--host-resolver-rules=MAP * ~NOTFOUND",
    f"--window-size={WINDOW[0]},{WINDOW[1]}",
]


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    message = "headless Chromium is not installed (apt-get install chromium)"
    if in_ci():
        pytest.fail(f"CI=true and {message}", pytrace=False)
    pytest.skip(message)


def run_chromium(browser: str, profile: Path, *args: str) -> subprocess.CompletedProcess[str]:
    profile.mkdir()  # a new, empty profile per run: nothing remembered between runs
    return subprocess.run([browser, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args],
                          capture_output=True, text=True, timeout=120)


class _Page(HTMLParser):
    """The visible text of the dumped DOM, and the style of each target row (set by the inline JS)."""

    def __init__(self) -> None:
        super().__init__()
        self.text: list[str] = []
        self.rows: list[tuple[str, str]] = []  # (data-health, style) per target row
        self._skip = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        if tag in ("script", "style"):
            self._skip += 1
        if tag == "tr" and values.get("data-health"):
            self.rows.append((values["data-health"] or "", values.get("style") or ""))

    def handle_endtag(self, tag: str) -> None:
        if tag in ("script", "style"):
            self._skip -= 1

    def handle_data(self, data: str) -> None:
        if not self._skip and data.strip():
            self.text.append(" ".join(data.split()))


def png_pixels(path: Path) -> tuple[int, int, bytes]:
    """Width, height and the decompressed scanlines of a PNG (enough to tell a page from a blank)."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    offset, width, height, idat = 8, 0, 0, b""
    while offset < len(data):
        (length,), kind = struct.unpack(">I", data[offset:offset + 4]), data[offset + 4:offset + 8]
        chunk = data[offset + 8:offset + 8 + length]
        if kind == b"IHDR":
            width, height = struct.unpack(">II", chunk[:8])
        elif kind == b"IDAT":
            idat += chunk
        offset += 12 + length
    return width, height, zlib.decompress(idat)


def test_html_report_renders_in_headless_chromium(
    lab: Lab, make_ct: Callable[..., Container], tmp_path: Path,
) -> None:
    browser = chromium()
    broken, plain = make_ct(setup=problem_case), make_ct()
    db, html = tmp_path / "audit.db", tmp_path / "report.html"
    audit = ["audit", *host_args(lab, None, broken.ctid, plain.ctid), "--db", str(db)]
    assert run_cli(*audit).exit_code == 3
    broken.sh("mkdir -p /var/lib/dpkg/updates && echo 'Package: x' > /var/lib/dpkg/updates/0001")
    second = run_cli(*audit, "--json", "--html", str(html))
    assert second.exit_code == 3, second.stdout + second.stderr
    healths = {t["target"]: t["health"] for t in second.json()["targets"]}
    broken_name = next(name for name in healths if name.endswith(f"/{broken.ctid}"))
    assert healths[broken_name] == "error" and len(set(healths.values())) == 2, healths

    url = html.resolve().as_uri() + "#health=error"
    dumped = run_chromium(browser, tmp_path / "profile-dom", "--dump-dom", url)
    assert dumped.returncode == 0, dumped.stderr[-2000:]
    page = _Page()
    page.feed(dumped.stdout)
    text = " ".join(page.text)
    for name in healths:
        assert name in text
    for code in ("DPKG_INTERRUPTED", "CUDA_RUNTIME_WITHOUT_TOOLKIT"):
        assert code in text
    assert "Drift" in text and f"New: {broken_name} — error DPKG_INTERRUPTED" in text
    # The inline JS ran: it read the filter from the URL hash, hid the other row and counted.
    assert "showing 1 of 2 targets" in text
    assert sorted(page.rows) == sorted((health, "" if health == "error" else "display: none;")
                                       for health in healths.values())

    screenshot = tmp_path / "report.png"
    shot = run_chromium(browser, tmp_path / "profile-shot", f"--screenshot={screenshot}", url)
    assert shot.returncode == 0 and screenshot.exists(), shot.stderr[-2000:]
    width, height, pixels = png_pixels(screenshot)
    assert (width, height) == WINDOW
    assert screenshot.stat().st_size > 10_000 and len(set(pixels)) > 50, "the screenshot looks blank"
    if os.environ.get("FLEETFIX_KEEP_SCREENSHOT"):  # for a person to look at
        shutil.copyfile(screenshot, os.environ["FLEETFIX_KEEP_SCREENSHOT"])

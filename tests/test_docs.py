"""Docs that list registry contents stay in step with the registries."""
from pathlib import Path

from fedcache.extract.backbones import BACKBONES
from fedcache.extract.datasets import DATASETS

DOCS = Path(__file__).resolve().parents[1] / "docs"


def test_every_dataset_and_backbone_is_documented():
    text = (DOCS / "datasets-and-backbones.md").read_text()
    missing = [n for n in DATASETS.names() + BACKBONES.names() if not n.startswith("test-") and f"`{n}`" not in text]
    assert not missing, f"add these to docs/datasets-and-backbones.md: {missing}"


# ---- commands and code shown in the docs --------------------------------------------------------
import os  # noqa: E402
import re  # noqa: E402
import shlex  # noqa: E402

import pytest  # noqa: E402

ROOT = DOCS.parent
SHELL_BLOCK = re.compile(r"```(?:bash|console|sh|shell)\n(.*?)```", re.S)
PYTHON_BLOCK = re.compile(r"```python\n(.*?)```", re.S)


def doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]


def documented_commands() -> list[tuple[str, list[str]]]:
    """Every `fedcache ...` command in a shell block of the README or docs/, as (where, argv)."""
    found = []
    for path in doc_files():
        for block in SHELL_BLOCK.findall(path.read_text()):
            for line in block.replace("\\\n", " ").splitlines():
                for words in _commands(line.strip().removeprefix("$ ")):
                    synopsis = any(w.startswith("[-") for w in words)  # usage notation, not a command
                    if words[0] == "fedcache" and not synopsis:
                        found.append((f"{path.relative_to(ROOT)}: {shlex.join(words)[:80]}", words[1:]))
    return found


def _commands(line: str) -> list[list[str]]:
    """A shell line split into its simple commands (at &&, ||, ;, |, &), quotes and comments respected."""
    lex = shlex.shlex(line, posix=True, punctuation_chars=True)
    lex.whitespace_split = True
    out: list[list[str]] = [[]]
    for tok in lex:
        if tok in ("&&", "||", ";", "|", "&"):
            out.append([])
        else:
            out[-1].append(tok)
    return [c for c in out if c]


def parse_command(argv: list[str]) -> None:
    """Resolve the subcommand and parse its options exactly as the CLI would, without running it."""
    import typer.main

    from fedcache.cli import app

    cmd, args, name = typer.main.get_command(app), list(argv), "fedcache"
    while hasattr(cmd, "resolve_command"):  # a group: the first word names the subcommand
        name, cmd, args = cmd.resolve_command(cmd.make_context(name, [], resilient_parsing=True), args)
    cmd.make_context(name, args)


@pytest.mark.parametrize("where,argv", documented_commands(), ids=lambda v: v if isinstance(v, str) else "")
def test_documented_command_parses(where, argv):
    """Each documented command names a real subcommand with real options and valid values; what it does is
    exercised by the test of that command (and the walk-through below runs the Python API for real)."""
    parse_command(argv)


def test_documented_commands_are_found():
    where = [w for w, _ in documented_commands()]
    for doc in ("README.md", "docs/getting-started.md", "docs/bring-your-own-embeddings.md", "docs/reproducing.md"):
        assert any(w.startswith(doc) for w in where), f"no fedcache command found in {doc}"


@pytest.mark.slow
def test_python_api_walkthrough_runs(tmp_path, monkeypatch):
    """docs/python-api.md, every python block in order, in an empty directory; the train cell twice, as a notebook
    re-runs a cell (its second run was refused: its out already held a run)."""
    blocks = PYTHON_BLOCK.findall((DOCS / "python-api.md").read_text())
    assert len(blocks) >= 5
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS", "1"))
    namespace: dict = {"__name__": "__walkthrough__"}
    for i, code in enumerate(blocks):
        for _ in range(2 if "fedcache.train(" in code else 1):
            exec(compile(code, f"docs/python-api.md block {i + 1}", "exec"), namespace)
    assert (tmp_path / "runs" / "grid" / "report.html").exists()


TOML_BLOCK = re.compile(r"```toml\n(.*?)```", re.S)


def test_documented_grid_files_load(tmp_path):
    from fedcache.grids import GridSpec, load_toml

    blocks = TOML_BLOCK.findall((DOCS / "getting-started.md").read_text())  # the grid files (other pages show Flower's)
    assert blocks, "docs/getting-started.md shows a grid TOML file"
    for i, text in enumerate(blocks):
        path = tmp_path / f"grid{i}.toml"
        path.write_text(text)
        GridSpec(**load_toml(path))


# Pages whose python blocks and fedcache commands run for real, in order, in an empty directory.
RUNNABLE_PAGES = ["bring-your-own-embeddings.md"]


@pytest.mark.parametrize("page", RUNNABLE_PAGES)
def test_runnable_page_runs(page, tmp_path, monkeypatch, capsys):
    from fedcache.cli import main

    monkeypatch.chdir(tmp_path)
    text = (DOCS / page).read_text()
    steps = sorted([(m.start(), "python", m.group(1)) for m in PYTHON_BLOCK.finditer(text)]
                   + [(m.start(), "shell", m.group(1)) for m in SHELL_BLOCK.finditer(text)])
    namespace: dict = {"__name__": "__docs__"}
    ran = 0
    for _, kind, code in steps:
        if kind == "python":
            exec(compile(code, f"docs/{page}", "exec"), namespace)
            continue
        for line in code.replace("\\\n", " ").splitlines():
            for words in _commands(line.strip()):
                if words[0] == "fedcache":
                    assert main(words[1:]) == 0, f"{shlex.join(words)}: {capsys.readouterr().err}"
                    ran += 1
    assert ran >= 3


def test_every_file_the_docs_name_exists():
    """A benchmark, script or test a page points to must exist (retired scripts leave no dangling commands)."""
    missing = []
    for page in doc_files():
        for ref in re.findall(r"\b((?:benchmarks|tests|fedcache)/[\w/.-]+\.(?:py|json|toml))\b", page.read_text()):
            if not (ROOT / ref).exists():
                missing.append(f"{page.relative_to(ROOT)}: {ref}")
        for image in re.findall(r"!\[[^\]]*\]\(([^)\s]+)\)", page.read_text()):  # relative to the page
            if "://" not in image and not (page.parent / image).exists():
                missing.append(f"{page.relative_to(ROOT)}: {image}")
    assert not missing


BENCHMARK_COMMAND = re.compile(r"\b(benchmarks/\w+\.py)((?:\s+(?:--[a-z][\w-]*|[^\s`|()-][^\s`|()]*))*)")


def test_every_benchmark_option_the_docs_name_exists():
    """A figure's command names its benchmark's options as the script spells them (a renamed flag leaves the
    figure without a command that reproduces it)."""
    unknown = []
    for page in doc_files():
        for script, words in BENCHMARK_COMMAND.findall(page.read_text()):
            source = (ROOT / script).read_text() if (ROOT / script).exists() else ""
            unknown += [f"{page.relative_to(ROOT)}: {script} {flag}" for flag in re.findall(r"--[a-z][\w-]*", words)
                        if f'"{flag}"' not in source]
    assert not unknown


# ---- what belongs where: measured figures live on results pages and in performance.md ------------------
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"```.*?```", re.S)
# A table cell that is a figure (maybe bold, with a spread or a second figure beside it); a row with two of them, one
# with decimals, is a measurement (an option table has one number per row: its default).
FIGURE_CELL = re.compile(r"\**[\d,]+(\.\d+)?\**( \([^)]*\))?( ± [\d.]+)?( / [\d,]+(\.\d+)?)*")
SPEED_RATIO = re.compile(r"\b\d+\.\d+x\b|\b\d+(?:\.\d+)?-\d+(?:\.\d+)?x\b")


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    return {_slug(h) for h in re.findall(r"^#+ (.*)$", FENCE.sub("", page.read_text()), re.M)}


def test_every_relative_link_and_anchor_resolves():
    broken = []
    for page in doc_files():
        for target in LINK.findall(FENCE.sub("", page.read_text())):
            if re.match(r"[a-z]+:", target):
                continue  # https:, mailto:
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken


def test_method_pages_hold_no_measured_tables():
    """A method page says what the method does; what it measured lives on a results page (docs/results/)."""
    found = []
    for page in sorted((DOCS / "methods").glob("*.md")):
        for row in FENCE.sub("", page.read_text()).splitlines():
            cells = [c.strip() for c in row.strip().strip("|").split("|")] if row.startswith("|") else []
            figures = [c for c in cells if FIGURE_CELL.fullmatch(c)]
            if len(figures) >= 2 and any(re.search(r"\d\.\d", c) for c in figures):
                found.append(f"{page.name}: {row[:80]}")
    assert not found, "move these rows to a page of docs/results/ with the command that measures them"


def test_every_method_page_says_what_it_trains_sends_and_changes():
    """docs/methods/README.md promises each page says what the method trains and sends, and how it differs from its
    paper and official code: a section for each, the differences as a table."""
    missing = []
    for page in sorted(p for p in (DOCS / "methods").glob("*.md") if p.name != "README.md"):
        sections = {s.split("\n", 1)[0].lower(): s for s in re.split(r"^## ", FENCE.sub("", page.read_text()), flags=re.M)}
        for what, starts in (("what it trains", ("what it trains", "what it does")), ("what travels", ("what travels",)),
                             ("a table of differences", ("differences",))):
            body = next((s for head, s in sections.items() if head.startswith(starts)), "")
            if not body or (what == "a table of differences" and "\n|---" not in body):
                missing.append(f"{page.name}: {what}")
    assert not missing, f"add these sections to the method pages: {missing}"


def test_speed_ratios_live_only_in_performance_md():
    """Speed is measured on one machine at one time: docs/performance.md holds it beside the command."""
    found = [f"{page.relative_to(ROOT)}: {m.group(0)}" for page in doc_files() if page.name != "performance.md"
             for m in SPEED_RATIO.finditer(page.read_text())]
    assert not found, "move these figures to docs/performance.md (with their command) and link there"


def test_every_results_page_shows_its_commands_and_is_listed():
    index = (DOCS / "results" / "README.md").read_text()
    pages = sorted(p for p in (DOCS / "results").glob("*.md") if p.name != "README.md")
    assert pages
    for page in pages:
        text = page.read_text()
        commands = [line for block in SHELL_BLOCK.findall(text) for line in block.splitlines()
                    if re.match(r"(\S+=\S+ )*(fedcache|python|\.venv/bin/python|PYTHONPATH=\S+ python) ", line)]
        assert commands, f"{page.name} shows no command that reproduces its figures"
        assert f"({page.name})" in index, f"docs/results/README.md does not list {page.name}"

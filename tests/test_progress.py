"""Plain progress lines where a progress bar would draw nothing (logs, CI, notebooks)."""
import io
import subprocess
import sys

import pytest

from rich.console import Console

from fedcache.progress import PlainProgress


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_one_line_at_start_each_tenth_and_the_end_with_eta():
    out, clock = io.StringIO(), Clock()
    progress = PlainProgress(Console(file=out, width=200), min_interval=5, clock=clock)
    task = progress.add_task("extract train", total=100)
    for _ in range(100):
        clock.t += 1
        progress.advance(task)
    lines = out.getvalue().splitlines()
    assert lines[0] == "extract train 0/100 (0%)"
    assert lines[1] == "extract train 10/100 (10%) ETA 1m30s"  # 10 s for 10 items: 90 s left
    assert len(lines) == 11 and lines[-1] == "extract train 100/100 (100%) in 1m40s"


def test_lines_are_rate_limited_and_fields_shown():
    out, clock = io.StringIO(), Clock()
    progress = PlainProgress(Console(file=out, width=200), min_interval=30, clock=clock)
    task = progress.add_task("fedavg rounds", total=50, acc="")
    for done in range(1, 51):
        clock.t += 1
        progress.update(task, completed=done, acc=f"acc {done}%")
    lines = out.getvalue().splitlines()
    assert len(lines) == 3  # start, the first tenth after 30 s, the end
    assert lines[-1] == "fedavg rounds 50/50 (100%) in 50s acc 50%"


def test_a_total_learned_later_is_used():
    out, clock = io.StringIO(), Clock()
    progress = PlainProgress(Console(file=out, width=200), min_interval=0, clock=clock)
    task = progress.add_task("grid", total=None, last="")
    clock.t = 10
    progress.update(task, total=4, completed=1, last="fedavg seed 0: 60.0%")
    assert out.getvalue().splitlines() == ["grid started", "grid 1/4 (25%) ETA 30s fedavg seed 0: 60.0%"]


def test_a_total_grown_after_its_end_goes_on_being_said_to_its_new_end():
    """A halving grid's count as the grid command gives it: a revived candidate's runs past the planned total
    (``update(total=max(planned, done), completed=done)``), then its test stage. Once a line said 100%, nothing more
    was printed, not even the end."""
    out, clock = io.StringIO(), Clock()
    progress = PlainProgress(Console(file=out, width=200), min_interval=0, clock=clock)
    task = progress.add_task("grid", total=None)
    for done in range(1, 11):  # 8 planned, 10 run
        clock.t += 1
        progress.update(task, total=max(8, done), completed=done)
    progress.update(task, total=20)  # the test stage: 10 more
    for done in range(11, 21):
        clock.t += 1
        progress.update(task, completed=done)
    lines = out.getvalue().splitlines()
    assert [line.split()[1] for line in lines if "(100%)" in line] == ["8/8", "9/9", "10/10", "20/20"]
    assert "grid 16/20 (80%) ETA 4s" in lines  # its tenths go on after the new total


def test_a_total_grown_before_its_end_goes_on_with_the_tenths_of_the_new_total():
    """A halving grid whose revived candidates ran more than planned, counted on by its test stage: the total grows
    at 95 of 100 to 200. Its tenths went on only once past the 90% said before, so nothing was said until the end."""
    out, clock = io.StringIO(), Clock()
    progress = PlainProgress(Console(file=out, width=200), min_interval=0, clock=clock)
    task = progress.add_task("grid", total=100)
    for done in range(1, 96):
        clock.t += 1
        progress.update(task, completed=done)
    for done in range(96, 201):
        clock.t += 1
        progress.update(task, total=200, completed=done)
    counts = [line.split()[1] for line in out.getvalue().splitlines()]
    assert counts[-7:] == ["90/100", "100/200", "120/200", "140/200", "160/200", "180/200", "200/200"]


def test_a_total_grown_across_a_tenth_does_not_say_that_tenth_again():
    """A halving grid's count whose total grows by two revived runs at 23 of 24: 22/24 said 92%, the total became 26,
    its tenths were lowered to that of 23/26 (88%), and 24/26 said the tenth just said again (92%)."""
    out, clock = io.StringIO(), Clock()
    progress = PlainProgress(Console(file=out, width=200), min_interval=0, clock=clock)
    task = progress.add_task("grid", total=24)
    for done in range(1, 27):
        clock.t += 1
        progress.update(task, total=24 if done < 23 else 26, completed=done)
    counts = [line.split()[1] for line in out.getvalue().splitlines()]
    assert counts[-3:] == ["20/24", "22/24", "26/26"], counts


def test_new_ends_in_quick_succession_wait_as_tenths_do_and_the_last_is_said_on_exit():
    """A total grown with the count printed a line per cell (each a new 100%), past the one-per-interval promise."""
    out, clock = io.StringIO(), Clock()
    with PlainProgress(Console(file=out, width=200), min_interval=5, clock=clock) as progress:
        task = progress.add_task("grid", total=None)
        for done in range(1, 15):  # 8 planned, 14 run, one a second
            clock.t += 1
            progress.update(task, total=max(8, done), completed=done)
    ends = [line.split()[1] for line in out.getvalue().splitlines() if "(100%)" in line]
    assert ends == ["8/8", "13/13", "14/14"]  # the first at once, then one per 5 s, the last as the work ends


def test_work_stopped_part_way_says_where_it_stopped():
    """Ctrl-C in a log: the last line said "0/3000" although 265 rounds were checkpointed (lines held back by
    min_interval); it now says the count the work stopped at. Nothing more where the last line said it already."""
    out, clock = io.StringIO(), Clock()
    try:
        with PlainProgress(Console(file=out, width=200), min_interval=10, clock=clock) as progress:
            rounds = progress.add_task("fedavg rounds", total=3000, acc="")
            cells = progress.add_task("grid", total=None)
            for done in range(1, 266):
                clock.t += 0.03
                progress.update(rounds, completed=done, acc=f"acc {done / 10:.1f}%")
            raise KeyboardInterrupt
    except KeyboardInterrupt:
        pass
    assert out.getvalue().splitlines() == ["fedavg rounds 0/3000 (0%)", "grid started",
                                           "fedavg rounds 265/3000 (9%) stopped after 8s acc 26.5%"]


def test_work_that_ends_or_stops_where_its_last_line_said_adds_no_stopped_line():
    out, clock = io.StringIO(), Clock()
    with PlainProgress(Console(file=out, width=200), min_interval=0, clock=clock) as progress:
        task = progress.add_task("rows", total=4)
        progress.update(task, completed=2)
    try:
        with PlainProgress(Console(file=out, width=200), min_interval=0, clock=clock) as progress:
            task = progress.add_task("rows", total=4)
            progress.update(task, completed=2)
            raise RuntimeError("failed")
    except RuntimeError:
        pass
    assert "stopped" not in out.getvalue()


def test_counts_of_millions_are_written_in_full():
    """An import's rows: ``:g`` wrote 1,100,000 as ``1.1e+06``."""
    out, clock = io.StringIO(), Clock()
    progress = PlainProgress(Console(file=out, width=200), min_interval=0, clock=clock)
    task = progress.add_task("rows written", total=1_100_000)
    progress.update(task, completed=1_100_000)
    assert out.getvalue().splitlines() == ["rows written 0/1100000 (0%)", "rows written 1100000/1100000 (100%) in 0s"]


def test_a_task_resumed_part_way_starts_there_and_estimates_from_its_own_rate():
    """A resumed run: 60 of 100 done before it started, 10 s for the next 10: 30 s left (not 10 s / 70 items)."""
    out, clock = io.StringIO(), Clock()
    progress = PlainProgress(Console(file=out, width=200), min_interval=5, clock=clock)
    task = progress.add_task("fedavg rounds", total=100, completed=60)
    for _ in range(10):
        clock.t += 1
        progress.advance(task)
    lines = out.getvalue().splitlines()
    assert lines[:2] == ["fedavg rounds 60/100 (60%)", "fedavg rounds 70/100 (70%) ETA 30s"]


def test_a_librarys_debug_logger_is_held_back_at_the_commands_level():
    """flwr sets its logger to DEBUG; the root logger's level never filters its records, the handler's does."""
    code = ("import logging; from fedcache.progress import log_to_stderr; log_to_stderr('WARNING'); "
            "lib = logging.getLogger('flwr'); lib.setLevel(logging.DEBUG); lib.debug('noise'); lib.warning('kept')")
    err = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stderr
    assert err == "WARNING flwr: kept\n"


def test_a_record_a_librarys_own_stderr_handler_printed_is_not_printed_again():
    """huggingface_hub puts a handler on its logger and lets its records reach the root: each line showed twice."""
    code = ("import logging, sys; from fedcache.progress import log_to_stderr; log_to_stderr('WARNING'); "
            "lib = logging.getLogger('hub'); lib.addHandler(logging.StreamHandler(sys.stderr)); "
            "logging.getLogger('hub.http').warning('retrying'); logging.getLogger('other').warning('kept')")
    err = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stderr
    assert err == "retrying\nWARNING other: kept\n"


def test_logging_to_stderr_for_a_block_removes_its_handler_and_level_after_it():
    code = ("import logging; from fedcache.progress import logging_to_stderr\n"
            "with logging_to_stderr('INFO'): logging.getLogger('x').info('during')\n"
            "root = logging.getLogger(); print(root.handlers, logging.getLevelName(root.level))\n"
            "logging.getLogger('x').warning('after')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout == "[] WARNING\n" and out.stderr == "INFO x: during\nafter\n"  # after: logging's last resort


def test_a_step_is_logged_and_said_only_where_it_took_slow_step_seconds(caplog):
    """A step before a command's progress (a grid reading a million rows): said where it was slow, so a short run
    prints what it printed before; the log (INFO) has every step."""
    import logging

    from fedcache import progress

    said, log = [], logging.getLogger("fedcache.test")
    with caplog.at_level(logging.INFO, logger="fedcache.test"):
        progress.said_step(log, said.append, "fast", progress.SLOW_STEP / 10)
        progress.said_step(log, said.append, "slow", progress.SLOW_STEP)
        progress.said_step(log, None, "to nobody", 60.0)  # the library called without a callback: quiet
    assert said == ["slow"]
    assert [r.getMessage() for r in caplog.records] == ["fast", "slow", "to nobody"]


def test_a_log_line_while_a_bar_is_drawn_prints_above_the_bar_not_on_it():
    """A command's stderr handler wrote to the terminal itself while a bar was drawn there: a grid worker's record
    landed after the bar's text on its line (`... 50% -:--:--WARNING ...`) and left a copy of the bar in the
    scrollback. While the bar is drawn, its lines go through the bar's console, which prints them above it."""
    import logging

    from fedcache.cli.common import Bar

    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    logging.getLogger().addHandler(handler)
    try:
        with Bar(console=Console(file=out, force_terminal=True, width=60), auto_refresh=False) as bar:
            task = bar.add_task("grid", total=2)
            bar.update(task, completed=1)
            bar.refresh()
            logging.getLogger("fedcache.test").warning("a worker's line")
            bar.update(task, completed=2)
        logging.getLogger("fedcache.test").warning("after the bar")
    finally:
        logging.getLogger().removeHandler(handler)
    lines = out.getvalue().replace("\x1b[2K", "").replace("\r", "\n").splitlines()
    assert "WARNING fedcache.test: a worker's line" in lines, lines  # a line of its own
    assert lines[-1].endswith("WARNING fedcache.test: after the bar") and handler.stream is out


@pytest.mark.parametrize("width, bar, description", [(160, 40, "whole"), (100, 21, "whole"), (80, 0, "whole"),
                                                     (60, 0, "cut")])
def test_an_extractions_bar_is_one_line_of_the_terminal_with_its_figures_whole(width, bar, description):
    """At 80 columns (COLUMNS=80) an extraction's line wrapped: its rate's `img/s` on a second line, its count cut to
    `960/…`. The figures stay whole; the bar takes the room the description leaves (none under BAR_LEAST cells), and
    the description is cut only where it alone does not fit."""
    from fedcache.cli.common import Bar, bar_columns

    clock, label = Clock(), "digits5-offline/test/synthdigits efficientnet-lite0"
    console = Console(file=io.StringIO(), force_terminal=True, width=width, color_system=None)
    progress = Bar(*bar_columns(), console=console, auto_refresh=False, get_time=clock)
    task = progress.add_task(label, total=1000)
    for _ in range(10):
        clock.t += 2.0
        progress.advance(task, 96)
    console.print(progress.get_renderable())
    (line,) = console.file.getvalue().splitlines()
    assert len(line) <= width and line.endswith(" 960/1000 48 img/s 0:00:01"), line
    assert line.count("━") + line.count("╸") == round(bar * 0.96), line
    assert line.startswith(label + " ") if description == "whole" else line.startswith(label[:10]) and "… " in line

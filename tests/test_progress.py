"""data_prep.progress: tqdm on a terminal, flushed lines elsewhere."""

from __future__ import annotations

import io

from tqdm import tqdm

from data_prep.progress import LineProgress, Progress, duration, progress_bar


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


class Flushes(io.StringIO):
    """Counts flushes: a line that sits in a buffer is a line ``> run.log`` does not show yet."""

    flushes = 0

    def flush(self) -> None:
        self.flushes += 1


def test_lines_off_a_terminal_one_per_step_with_postfix():
    out = Flushes()
    bar = progress_bar(range(2), "iteration", 4, tag="capo train", initial=2, every_s=0, file=out)
    assert isinstance(bar, LineProgress)
    for i in bar:
        bar.set_postfix({"success": f"{i / 10:.2f}", "tok/s": 12})
    lines = out.getvalue().splitlines()
    assert [line.rsplit(" (", 1)[0] for line in lines] == [
        "[capo train] iteration 3/4 success 0.00 tok/s 12",
        "[capo train] iteration 4/4 success 0.10 tok/s 12",
    ]
    assert out.flushes >= 2 and "\r" not in out.getvalue()


def test_lines_are_throttled_but_the_last_one_is_printed():
    out = io.StringIO()
    for _ in progress_bar(range(1000), "expert episodes", tag="capo train", every_s=3600, file=out):
        pass
    assert out.getvalue().splitlines() == ["[capo train] expert episodes 1000/1000 (0 s)"]
    out = io.StringIO()
    with progress_bar(desc="f.zip", unit="B", tag="capo data", every_s=3600, file=out) as bar:
        bar.update(3 << 20)  # no total: printed on close
    assert out.getvalue() == "[capo data] f.zip 3.0 MiB (0 s)\n"


def test_a_terminal_gets_tqdm_and_disabled_is_silent():
    terminal = Terminal()
    assert isinstance(progress_bar(range(3), "x", file=terminal), tqdm)
    quiet = io.StringIO()
    silent = Progress("capo train", enabled=False, file=quiet)
    silent.say("nothing")
    for _ in silent.bar(range(3), "iteration", every_s=0):
        pass
    assert quiet.getvalue() == ""
    loud = io.StringIO()
    Progress("capo eval", file=loud).say("held-out evaluation: 5 episodes")
    assert loud.getvalue() == "[capo eval] held-out evaluation: 5 episodes\n"


def test_duration():
    assert [duration(s) for s in (46.2, 723, 7500)] == ["46 s", "12 min 03 s", "2 h 05 min"]

"""tune.training.get_progress_bar: a live tqdm bar on a terminal, one plain line per step when redirected.

The recipes call ``bar.update(1)`` every step, then ``bar.set_description(...)`` and ``bar.set_postfix(...)`` at
logging steps (PPO sets the description only); the loops below make the same calls in the same order.
"""

import fcntl
import io
import os
import pty
import re
import struct
import subprocess
import sys
import termios
import textwrap
from pathlib import Path

from tqdm import tqdm

from tune.training import get_progress_bar

REPO = Path(__file__).resolve().parents[3]
# one epoch of a recipe's loop: update every step, description and postfix at logging steps
LOOP = """
import sys
from tune.training import get_progress_bar

steps, log_every = {steps}, {log_every}
bar = get_progress_bar(steps, epoch=0)
for step in range(1, steps + 1):
    bar.update(1)
    if step % log_every == 0:
        bar.set_description(f"1|{{step}}|Loss: {{1 / step:.4f}}")
        bar.set_postfix(tokens_per_second=f"{{1000 + step:.0f}}")
bar.close()
"""


def _recipe_loop(bar, steps: int, log_every: int, postfix: bool = True, epoch: int = 0, first: int = 1) -> None:
    for step in range(first, steps + 1):
        bar.update(1)
        if step % log_every == 0:
            bar.set_description(f"{epoch + 1}|{step}|Loss: {1 / step:.4f}")
            if postfix:
                bar.set_postfix(tokens_per_second=f"{1000 + step:.0f}")
    bar.close()


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_redirected_output_gets_one_line_per_step_with_that_steps_loss():
    out = io.StringIO()
    _recipe_loop(get_progress_bar(12, epoch=0, disable=False, file=out), steps=12, log_every=3)
    lines = out.getvalue().splitlines()
    assert "\r" not in out.getvalue()
    assert len(lines) == 12
    assert [int(re.search(r" (\d+)/12 ", line).group(1)) for line in lines] == list(range(1, 13))
    # a logging step's line carries its own loss and postfix; the steps between show the last ones, as the bar does
    assert lines[2].startswith("1|3|Loss: 0.3333:  25% 3/12 [") and lines[2].endswith("tokens_per_second=1003]")
    assert lines[3].startswith("1|3|Loss: 0.3333:  33% 4/12 [")
    assert lines[0].startswith("1|0:   8% 1/12 [")  # before the first logging step: the epoch's own description


def test_a_description_without_postfix_is_written_with_the_next_step():
    # ppo_full_finetune_single_device sets the description only: the line waits for the next update or close
    out = io.StringIO()
    _recipe_loop(get_progress_bar(4, epoch=1, disable=False, file=out), steps=4, log_every=1, postfix=False, epoch=1)
    lines = out.getvalue().splitlines()
    assert [line.split(":")[0] for line in lines] == ["2|1|Loss", "2|2|Loss", "2|3|Loss", "2|4|Loss"]


def test_a_resumed_epoch_counts_on_from_the_steps_done():
    out = io.StringIO()
    bar = get_progress_bar(8, epoch=0, initial=5, disable=False, file=out)
    _recipe_loop(bar, steps=8, log_every=1, first=6)
    lines = out.getvalue().splitlines()
    assert [re.search(r" (\d+/8) ", line).group(1) for line in lines] == ["6/8", "7/8", "8/8"]


def test_a_terminal_gets_the_live_tqdm_bar():
    out = _Terminal()
    bar = get_progress_bar(5, epoch=0, disable=False, file=out)
    assert type(bar) is tqdm
    _recipe_loop(bar, steps=5, log_every=1)
    assert "\r" in out.getvalue() and "100%|" in out.getvalue()


def test_a_hidden_bar_writes_nothing(monkeypatch):
    out = io.StringIO()
    monkeypatch.setenv("TQDM_DISABLE", "1")
    _recipe_loop(get_progress_bar(3, epoch=0, file=out), steps=3, log_every=1)
    monkeypatch.delenv("TQDM_DISABLE")
    monkeypatch.setenv("RANK", "1")
    _recipe_loop(get_progress_bar(3, epoch=0, file=out), steps=3, log_every=1)
    assert out.getvalue() == ""


def test_a_closed_stream_never_stops_training():
    out = io.StringIO()
    bar = get_progress_bar(3, epoch=0, disable=False, file=out)
    out.close()
    _recipe_loop(bar, steps=3, log_every=1)  # no error


def _python(code: str, stderr) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("TQDM_DISABLE", None)
    return subprocess.Popen([sys.executable, "-c", code], stderr=stderr, stdout=subprocess.DEVNULL, env=env)


def test_stderr_redirected_to_a_file_gets_exactly_one_line_per_step(tmp_path):
    log = tmp_path / "stderr.log"
    with open(log, "w") as stderr:
        assert _python(LOOP.format(steps=25, log_every=5), stderr).wait(timeout=120) == 0
    text = log.read_text()
    assert "\r" not in text
    lines = text.splitlines()
    assert len(lines) == 25, text
    assert lines[-1].startswith("1|25|Loss: 0.0400: 100% 25/25 [")


def test_stderr_on_a_terminal_gets_the_live_bar():
    master, terminal = pty.openpty()
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))  # a terminal 120 columns wide
    proc = _python(textwrap.dedent(LOOP.format(steps=25, log_every=5)), terminal)
    os.close(terminal)
    output = b""
    while True:
        try:
            chunk = os.read(master, 4096)
        except OSError:  # the process closed its end
            break
        if not chunk:
            break
        output += chunk
    os.close(master)
    assert proc.wait(timeout=120) == 0
    text = output.decode()
    assert "\r1|25|Loss: 0.0400: 100%|" in text  # redrawn in place, with the bar
    assert text.count("\n") <= 2  # the bar's own line (and the newline closing it): not a line per step

"""A process that has imported torch, ``datasets`` and tune once, and forks a child for each ``tune run``.

Most of a tiny recipe run is start-up: importing torch (1.2 s here), ``torch._dynamo`` (1.1 s, imported by the
first optimizer) and ``datasets`` (0.7 s) before four steps that take half a second. :func:`run` sends the
command to this process (one per pytest worker, started on first use), which forks; the child sets the working
directory, environment, ``sys.path`` and ``sys.argv`` the fresh process would have, sends its output to files,
runs ``tune._cli.main.main`` and exits with its status. The zygote itself never runs a recipe, so every run starts
from the same imported state, as a fresh process would, and nothing one run changes is seen by the next.

``TUNE_TEST_FRESH_PROCESS=1`` runs every recipe in a fresh interpreter instead (tests/recipes/utils.py); so does
any call that passes extra environment variables, which may matter at import time.

Protocol (JSON lines over the zygote's stdin/stdout): request ``{"argv", "cwd", "env", "stdout", "stderr"}``;
replies ``{"pid"}`` right after the fork, then ``{"returncode"}`` when the child has exited.
"""

import atexit
import json
import logging
import os
import select
import signal
import subprocess
import sys
import traceback


def _warm_up() -> None:
    import datasets  # noqa: F401
    import safetensors.torch  # noqa: F401
    import torch
    import torch._dynamo  # noqa: F401  (the first optimizer imports it)

    import tune._cli.main  # noqa: F401
    import tune.config  # noqa: F401
    import tune.datasets  # noqa: F401
    import tune.training  # noqa: F401

    torch.set_num_threads(1)


def _child(request: dict) -> None:
    """In the forked child: become the fresh ``tune run`` process and exit with its status (never returns)."""
    code = 1
    try:
        os.setpgid(0, 0)  # its own process group: a timeout kills what it started too (torchrun, workers)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
            target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            os.dup2(target, fd)
            os.close(target)
        sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115
        sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115
        sys.stdin = open(os.devnull)  # noqa: SIM115
        # the fresh process's sys.path: its PYTHONPATH entries first
        extra = [p for p in request["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
        sys.path[:0] = [p for p in extra if p not in sys.path]
        sys.argv = ["tune", *request["argv"]]
        from tune._cli.main import main

        code = main(request["argv"])
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
        if not isinstance(exit_.code, (int, type(None))):
            print(exit_.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        try:
            atexit._run_exitfuncs()
            logging.shutdown()
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code if isinstance(code, int) else 1)


def serve() -> None:
    _warm_up()
    replies = sys.stdout
    print(json.dumps({"ready": True}), file=replies, flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _child(request)
        print(json.dumps({"pid": pid}), file=replies, flush=True)
        _, status = os.waitpid(pid, 0)
        print(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}), file=replies, flush=True)


class Zygote:
    """The client side: one zygote process, started on the first :meth:`run`."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen | None = None
        self._buffer = b""

    def _readline(self, timeout: float | None) -> dict | None:
        """The zygote's next reply, or None after ``timeout`` seconds without one."""
        fd = self._proc.stdout.fileno()
        while b"\n" not in self._buffer:
            ready, _, _ = select.select([fd], [], [], timeout)
            if not ready:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                raise RuntimeError("the recipe zygote exited (run with TUNE_TEST_FRESH_PROCESS=1 to compare)")
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return json.loads(line)

    def _start(self, env: dict[str, str]) -> None:
        self._proc = subprocess.Popen(
            [sys.executable, "-c", "from tests.recipes._zygote import serve; serve()"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            bufsize=0,
        )
        self._buffer = b""
        if not (self._readline(300) or {}).get("ready"):
            raise RuntimeError("the recipe zygote did not start (run with TUNE_TEST_FRESH_PROCESS=1 to compare)")
        atexit.register(self._proc.kill)

    def run(self, argv: list[str], cwd, env: dict[str, str], timeout: float, stdout: str, stderr: str) -> int:
        """Runs ``tune ARGV`` in a forked child; returns its exit status (negative: killed by that signal).

        Raises:
            subprocess.TimeoutExpired: after ``timeout`` seconds (the child's process group is killed first).
        """
        if self._proc is None or self._proc.poll() is not None:
            self._start(env)
        request = dict(argv=argv, cwd=str(cwd), env=env, stdout=stdout, stderr=stderr)
        self._proc.stdin.write((json.dumps(request) + "\n").encode())
        pid = self._readline(60)["pid"]
        reply = self._readline(timeout)
        if reply is None:
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:  # not yet its own group leader
                os.kill(pid, signal.SIGKILL)
            self._readline(60)  # the killed child's status
            raise subprocess.TimeoutExpired(["tune", *argv], timeout)
        return reply["returncode"]

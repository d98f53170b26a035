"""JSON-lines protocol between the benchmark parent and its worker processes.

A worker reads one request per line on stdin, ``{"cmd": name, "args": {...}}``, and writes one
response per line, ``{"ok": true, "result": ...}`` or ``{"ok": false, "error": traceback}``.
The worker's file descriptor 1 is moved to stderr before anything is imported, so a stray print
(or a C library writing to stdout) cannot corrupt the channel; stderr goes to a log file.

Arrays travel as ``{"dtype", "shape", "data"}`` with the data as a flat list (JSON floats
round-trip exactly), which is only meant for the gate's tiny cases.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any


def encode(a: Any) -> Any:
    """A NumPy array (or a list/tuple/dict of them, or None) as JSON-able data."""
    import numpy as np

    if isinstance(a, np.ndarray):
        return {"dtype": str(a.dtype), "shape": list(a.shape), "data": a.ravel().tolist()}
    if isinstance(a, (list, tuple)):
        return [encode(v) for v in a]
    if isinstance(a, dict):
        return {k: encode(v) for k, v in a.items()}
    return a


def decode(d: Any) -> Any:
    """Inverse of :func:`encode`."""
    import numpy as np

    if isinstance(d, dict) and set(d) == {"dtype", "shape", "data"}:
        return np.asarray(d["data"], dtype=d["dtype"]).reshape(d["shape"])
    if isinstance(d, list):
        return [decode(v) for v in d]
    if isinstance(d, dict):
        return {k: decode(v) for k, v in d.items()}
    return d


def serve(handlers: dict[str, Callable[..., Any]]) -> None:
    """Worker main loop: answer requests until ``quit`` or end of input."""
    channel = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    for line in sys.stdin:
        if not line.strip():
            continue
        req = json.loads(line)
        cmd = req.get("cmd")
        if cmd == "quit":
            channel.write(json.dumps({"ok": True, "result": None}) + "\n")
            break
        try:
            result = handlers[cmd](**req.get("args", {}))
            resp = {"ok": True, "result": result}
        except Exception:
            resp = {"ok": False, "error": traceback.format_exc()}
        channel.write(json.dumps(resp) + "\n")
        channel.flush()


class WorkerError(RuntimeError):
    pass


class Worker:
    """Parent side of one persistent worker process (``python script *argv``)."""

    def __init__(
        self, name: str, script: Path, log_path: Path, env: dict | None = None, argv: tuple = ()
    ) -> None:
        self.name = name
        self.log_path = log_path
        self._log = open(log_path, "a")  # noqa: SIM115 (closed in close())
        self.t_spawn = time.perf_counter()
        self.proc = subprocess.Popen(
            [sys.executable, str(script), *argv],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            bufsize=1,
            env=env,
        )

    def call(self, cmd: str, **args: Any) -> Any:
        if self.proc.poll() is not None:
            raise WorkerError(f"{self.name} worker exited ({self.proc.returncode}); {self._tail()}")
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"cmd": cmd, "args": args}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise WorkerError(f"{self.name} worker died during {cmd!r}; {self._tail()}")
        resp = json.loads(line)
        if not resp["ok"]:
            raise WorkerError(f"{self.name} worker failed in {cmd!r}:\n{resp['error']}")
        return resp["result"]

    def _tail(self, n: int = 2000) -> str:
        try:
            text = Path(self.log_path).read_text(errors="replace")
        except OSError:
            return "no log"
        return f"log {self.log_path} ends with:\n{text[-n:]}"

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.call("quit")
            except (WorkerError, OSError, ValueError):
                pass
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


def time_reps(
    n: int, timed: Callable[[Any], Any], untimed: Callable[[], Any] | None = None
) -> list[float]:
    """Per-rep seconds of ``timed(state)``; ``state = untimed()`` runs before each rep, outside
    the clock (None when there is no untimed part)."""
    out = []
    clock = time.perf_counter
    for _ in range(n):
        state = untimed() if untimed is not None else None
        t0 = clock()
        timed(state)
        out.append(clock() - t0)
        del state
    return out

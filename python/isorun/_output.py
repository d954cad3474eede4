"""Where a worker's output goes when the caller reads it: ``capture_output=True`` (kept for the
outcome), or a ``sys.stdout``/``sys.stderr`` that is not this process's fd 1/2 (Jupyter,
``contextlib.redirect_stdout``, pytest's capture), into which it is forwarded line by line as it
comes. Otherwise the worker writes to fd 1 and the runner copies its stderr to fd 2, as before.

Each stream read here is a pipe: the worker gets its write end as its stdout with the assignment
(``stdout_mode::fd``, so a standby interpreter's stdout is replaced too), and the runner copies the
worker's stderr into the other (``stderr_echo_fd``) while it keeps the stderr tail. This process
keeps the write ends open until the job has ended (the runner writes to the stderr one until
then), then closes them; a thread per pipe reads until the end of file.
"""

from __future__ import annotations

import codecs
import os
import sys
import threading
from typing import TYPE_CHECKING, Callable, Optional, TextIO

if TYPE_CHECKING:
    from . import _core

__all__ = ["CallOutput", "for_call"]

#: How long a finished call waits for the last of its output once the worker is gone: only a
#: process the function left running (which holds the pipe) makes it wait that long.
DRAIN_S = 2.0


def _is_fd(stream: Optional[TextIO], fd: int) -> bool:
    """Whether ``stream`` writes to this process's ``fd`` (or is None: nowhere to forward to)."""
    if stream is None:
        return True
    try:
        return stream.fileno() == fd
    except Exception:  # noqa: BLE001 - io.UnsupportedOperation, a closed stream, a stand-in
        return False


def _forward_to(stream: TextIO) -> Callable[[str], None]:
    def write(text: str) -> None:
        try:
            stream.write(text)
            stream.flush()
        except Exception:  # noqa: BLE001 - a stream closed since: the line is dropped, as a closed fd would
            pass

    return write


class _Pump:
    """One pipe, read by a daemon thread that hands each line (and a last partial one) to a sink."""

    def __init__(self, sink: Callable[[str], None]) -> None:
        self._read, self.write_fd = os.pipe()  # both close-on-exec; the runner passes the write end on
        self._sink = sink
        self._done = threading.Event()
        threading.Thread(target=self._run, name="isorun-output", daemon=True).start()

    def _run(self) -> None:
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        pending = ""
        try:
            while True:
                chunk = os.read(self._read, 1 << 16)
                if not chunk:
                    break
                pending += decoder.decode(chunk)
                end = pending.rfind("\n") + 1
                if end:
                    for line in pending[:end].splitlines(keepends=True):
                        self._sink(line)
                    pending = pending[end:]
            pending += decoder.decode(b"", final=True)
            if pending:
                self._sink(pending)
        finally:
            os.close(self._read)
            self._done.set()

    def close_write(self) -> None:
        if self.write_fd >= 0:
            os.close(self.write_fd)
            self.write_fd = -1

    def drain(self) -> None:
        self._done.wait(DRAIN_S)


class CallOutput:
    """The pipes of one call (see the module's doc)."""

    def __init__(self, stdout: Optional[TextIO], stderr: Optional[TextIO], capture: bool) -> None:
        self.capture = capture
        self._text: dict[str, list[str]] = {"stdout": [], "stderr": []}
        self._lock = threading.Lock()
        self._open = True
        self._pumps: dict[str, _Pump] = {}
        for name, target in (("stdout", stdout), ("stderr", stderr)):
            if capture:
                self._pumps[name] = _Pump(self._keeper(name))
            elif target is not None:
                self._pumps[name] = _Pump(_forward_to(target))

    def _keeper(self, name: str) -> Callable[[str], None]:
        def keep(text: str) -> None:
            with self._lock:
                if self._open:  # not after the call has ended: its outcome is made
                    self._text[name].append(text)

        return keep

    def apply(self, options: _core.CallOptions) -> _core.CallOptions:
        """``options`` with this call's descriptors."""
        if "stdout" in self._pumps:
            options.stdout_fd = self._pumps["stdout"].write_fd
        if "stderr" in self._pumps:
            options.stderr_fd = self._pumps["stderr"].write_fd
        return options

    def close(self) -> Optional[tuple[str, str]]:
        """Once the job has ended (or never started): closes this side's write ends and waits for
        the rest of the output. Returns (stdout, stderr) when capturing."""
        for pump in self._pumps.values():
            pump.close_write()
        for pump in self._pumps.values():
            pump.drain()
        with self._lock:
            self._open = False
            return ("".join(self._text["stdout"]), "".join(self._text["stderr"])) if self.capture else None


def for_call(capture: bool, echo_stderr: bool, early_result: bool) -> Optional[CallOutput]:
    """The pipes a call needs now, from the caller's ``sys.stdout``/``sys.stderr`` as they are
    when it starts; None where the output goes straight to fds 1 and 2."""
    if capture:
        return CallOutput(None, None, capture=True)
    if early_result:
        # The result is handed over while the worker (and the runner's copy of its stderr) runs
        # on: nothing here knows when its output ends. It goes straight through.
        return None
    stdout = None if _is_fd(sys.stdout, 1) else sys.stdout
    stderr = None if not echo_stderr or _is_fd(sys.stderr, 2) else sys.stderr
    if stdout is None and stderr is None:
        return None
    return CallOutput(stdout, stderr, capture=False)

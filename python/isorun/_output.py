"""Where a worker's output goes when the caller reads it: ``capture_output=True`` (kept for the
outcome), or a ``sys.stdout``/``sys.stderr`` that is not this process's fd 1/2 (Jupyter,
``contextlib.redirect_stdout``, pytest's capture), into which it is forwarded line by line as it
comes. Otherwise the worker writes to fd 1 and the runner copies its stderr to fd 2, as before.

Each stream read here is a pipe: the worker gets its write end as its stdout with the assignment
(``stdout_mode::fd``, so a standby interpreter's stdout is replaced too), and the runner copies the
worker's stderr into the other (``stderr_echo_fd``) while it keeps the stderr tail. This process
keeps the write ends open until the job has ended (the runner writes to the stderr one until
then), then closes them.

One thread of the process (started at the first call that needs it) reads every such pipe, with
a selector, and hands each line (and a last partial one) to the pipe's sink; other threads give
it pipes, and ask it to catch up, through a wake-up pipe. Forwarded calls whose target stream is
the same object share one pipe for it, made when the first of them starts and closed once the
last of them has ended: a call in flight, queued or running, costs no thread and no descriptor
of its own, and the workers' lines meet in the pipe as they would on a terminal (a write of up to
PIPE_BUF bytes is never split). A call that ends waits until what was in the shared pipe then
(its own output with it) has been forwarded, a partial last line included, so that it is in the
stream when the call returns. ``capture_output=True`` gives each call pipes of its own (its text
must be its own), read by the same thread.
"""

from __future__ import annotations

import codecs
import contextlib
import fcntl
import os
import selectors
import sys
import termios
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Optional, TextIO

if TYPE_CHECKING:
    from . import _core

__all__ = ["CallOutput", "for_call"]

#: How long a finished call waits for the last of its output once the worker is gone: only a
#: process the function left running (which holds the pipe) makes it wait that long.
DRAIN_S = 2.0

#: The most read from one pipe at a time: the other pipes get their turn in between.
_CHUNK = 1 << 16


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


class _Pipe:
    """One pipe and its sink. The reader thread alone reads it, decodes it and calls the sink;
    ``cond`` guards what other threads look at: the bytes read so far (``consumed``, advanced
    with each read, so that ``consumed`` + what the pipe holds is all that was written to it), the
    sync asked for (``want``) and the bytes handed on at the last sync (``synced``), and
    ``eof``."""

    def __init__(self, sink: Callable[[str], None], generation: int) -> None:
        self.read_fd, self.write_fd = os.pipe()  # both close-on-exec; the runner passes the write end on
        os.set_blocking(self.read_fd, False)  # (the read end's own flag: the write end blocks)
        self.sink = sink
        self.generation = generation
        self.cond = threading.Condition(threading.Lock())
        self.consumed = 0
        self.want = -1  # a sync is asked for once `consumed` reaches it
        self.synced = 0
        self.eof = False
        self.users = 0  # shared pipes: the calls that use it
        self.target: Optional[TextIO] = None  # shared pipes: the stream it forwards to
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._pending = ""  # decoded text after the last line end

    # The reader thread's side.

    def on_readable(self, selector: selectors.BaseSelector) -> None:
        with self.cond:
            try:
                data = os.read(self.read_fd, _CHUNK)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            self.consumed += len(data)
        if not data:
            self._finish(selector)
            return
        self._pending += self._decoder.decode(data)
        end = self._pending.rfind("\n") + 1
        if end:
            for line in self._pending[:end].splitlines(keepends=True):
                self.sink(line)
            self._pending = self._pending[end:]
        self.check_sync()

    def check_sync(self) -> None:
        """Meets the sync asked for if all it covers has been read: the partial line read so far
        goes to the sink too, and the waiters are woken."""
        with self.cond:
            if self.eof or self.want < 0 or self.want > self.consumed:
                return
        if self._pending:
            self.sink(self._pending)
            self._pending = ""
        with self.cond:
            self.synced = self.consumed
            if self.want <= self.consumed:  # (not one asked for since, further on)
                self.want = -1
            self.cond.notify_all()

    def _finish(self, selector: selectors.BaseSelector) -> None:
        """At the end of the pipe: the rest to the sink, the read end closed."""
        try:
            self._pending += self._decoder.decode(b"", final=True)
            if self._pending:
                self.sink(self._pending)
                self._pending = ""
        finally:
            try:
                selector.unregister(self.read_fd)
            except (KeyError, ValueError):
                pass
            with self.cond:
                try:
                    os.close(self.read_fd)
                except OSError:
                    pass
                self.read_fd = -1
                self.eof = True
                self.cond.notify_all()
            with _lock:
                _pipes.discard(self)

    # The other threads' side.

    def close_write(self) -> None:
        """(Under ``_lock``.)"""
        if self.write_fd >= 0:
            os.close(self.write_fd)
            self.write_fd = -1

    def ask_sync(self) -> int:
        """The sync that covers all that was written to the pipe so far: the bytes that will have
        been forwarded then (-1: the pipe has ended, all of it forwarded)."""
        with self.cond:
            if self.eof:
                return -1
            held = fcntl.ioctl(self.read_fd, termios.FIONREAD, b"\0\0\0\0")
            target = self.consumed + int.from_bytes(held, sys.byteorder)
            self.want = max(self.want, target)
            return target

    def wait(self, target: Optional[int], deadline: float) -> None:
        """Until the sync ``target`` has been met (None: until the end of the pipe), or the
        ``deadline``."""
        with self.cond:
            while not (self.eof or (target is not None and self.synced >= target)):
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                self.cond.wait(left)


class _Forwarder:
    """The thread that reads every pipe."""

    def __init__(self) -> None:
        self.selector = selectors.DefaultSelector()
        self.wake_read, self.wake_write = os.pipe()
        os.set_blocking(self.wake_read, False)
        os.set_blocking(self.wake_write, False)
        self.selector.register(self.wake_read, selectors.EVENT_READ, None)
        self._asked = threading.Lock()
        self._to_add: list[_Pipe] = []
        self._to_sync: list[_Pipe] = []
        self.thread = threading.Thread(target=self._run, name="isorun-output", daemon=True)
        self.thread.start()

    def add(self, pipe: _Pipe) -> None:
        with self._asked:
            self._to_add.append(pipe)
        self._wake()

    def sync(self, pipe: _Pipe) -> None:
        with self._asked:
            self._to_sync.append(pipe)
        self._wake()

    def _wake(self) -> None:
        try:
            os.write(self.wake_write, b"\0")
        except OSError:  # full: a wake-up is pending already
            pass

    def _run(self) -> None:
        while True:
            for key, _ in self.selector.select():
                pipe: Optional[_Pipe] = key.data
                if pipe is None:
                    self._take_asked()
                    continue
                try:
                    pipe.on_readable(self.selector)
                except Exception:  # noqa: BLE001 - an unexpected failure ends that pipe, not the others
                    if not pipe.eof:
                        pipe._finish(self.selector)

    def _take_asked(self) -> None:
        try:
            while os.read(self.wake_read, 4096):
                pass
        except BlockingIOError:
            pass
        with self._asked:
            added, self._to_add = self._to_add, []
            synced, self._to_sync = self._to_sync, []
        for pipe in added:
            if not pipe.eof:
                self.selector.register(pipe.read_fd, selectors.EVENT_READ, pipe)
        for pipe in synced:
            pipe.check_sync()


# The module's state, under `_lock`: the reader thread (started at the first pipe), the shared
# pipes by the id of their stream, and all the pipes not yet ended (for a fork's child). A fork's
# child starts a new generation: the pipes of the one before are its parent's.
_lock = threading.Lock()
_forwarder: Optional[_Forwarder] = None
_shared: dict[int, _Pipe] = {}
_pipes: set[_Pipe] = set()
_generation = 0


def _new_pipe(sink: Callable[[str], None]) -> _Pipe:
    """(Under ``_lock``.) A pipe the reader thread reads."""
    global _forwarder
    if _forwarder is None:
        _forwarder = _Forwarder()
    pipe = _Pipe(sink, _generation)
    _pipes.add(pipe)
    _forwarder.add(pipe)
    return pipe


def _after_fork_in_child() -> None:
    """The reader thread is not in the child: the next call starts anew. The parent's pipes,
    the wake-up pipe and the selector are closed here (the child's copies only), so that the
    parent still sees the ends of its pipes."""
    global _lock, _forwarder, _shared, _pipes, _generation
    forwarder, pipes = _forwarder, _pipes
    _lock = threading.Lock()  # (another thread of the parent may have held it)
    _forwarder, _shared, _pipes = None, {}, set()
    _generation += 1
    fds = [fd for pipe in pipes for fd in (pipe.read_fd, pipe.write_fd)]
    for pipe in pipes:
        pipe.cond = threading.Condition(threading.Lock())
        pipe.read_fd = pipe.write_fd = -1
        pipe.eof = True
    if forwarder is not None:
        fds += [forwarder.wake_read, forwarder.wake_write]
        try:
            forwarder.selector.close()  # the child's epoll descriptor (the parent's own stays)
        except OSError:
            pass
    for fd in fds:
        if fd >= 0:
            try:
                os.close(fd)
            except OSError:
                pass


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


_NO_LOCK: Any = contextlib.nullcontext()  # (a forwarding call's: it keeps no text)


class CallOutput:
    """The pipes of one call (see the module's doc)."""

    # (Slots, and the text and its lock only where the output is captured: every call queued
    # while sys.stdout is not fd 1, a hundred thousand of them, has one.)
    __slots__ = ("capture", "_text", "_lock", "_open", "_pipes")

    def __init__(self, stdout: Optional[TextIO], stderr: Optional[TextIO], capture: bool) -> None:
        self.capture = capture
        self._text: dict[str, list[str]] = {"stdout": [], "stderr": []} if capture else {}
        self._lock = threading.Lock() if capture else _NO_LOCK
        self._open = True
        self._pipes: dict[str, _Pipe] = {}
        with _lock:
            try:
                for name, target in (("stdout", stdout), ("stderr", stderr)):
                    if capture:
                        self._pipes[name] = _new_pipe(self._keeper(name))
                    elif target is not None:
                        self._pipes[name] = self._share(target)
            except BaseException:
                self._release_all()
                raise

    @staticmethod
    def _share(target: TextIO) -> _Pipe:
        """(Under ``_lock``.) The pipe of the calls that forward into ``target``, one more using it."""
        pipe = _shared.get(id(target))
        if pipe is None or pipe.target is not target:
            pipe = _new_pipe(_forward_to(target))
            pipe.target = target  # (held: the id is not another stream's while the pipe is shared)
            _shared[id(target)] = pipe
        pipe.users += 1
        return pipe

    def _release_all(self) -> list[tuple[_Pipe, bool]]:
        """(Under ``_lock``.) Gives up this call's pipes: its own ones are closed, a shared one
        once its last call gives it up. Returns them, each with whether it was closed here."""
        released = []
        for pipe in self._pipes.values():
            if pipe.generation != _generation:
                continue  # the parent's, in a fork's child
            if self.capture:
                pipe.close_write()
                released.append((pipe, True))
                continue
            pipe.users -= 1
            last = pipe.users == 0
            if last:
                if _shared.get(id(pipe.target)) is pipe:
                    del _shared[id(pipe.target)]
                pipe.close_write()
            released.append((pipe, last))
        self._pipes = {}
        return released

    def _keeper(self, name: str) -> Callable[[str], None]:
        def keep(text: str) -> None:
            with self._lock:
                if self._open:  # not after the call has ended: its outcome is made
                    self._text[name].append(text)

        return keep

    def fds(self) -> tuple[int, int]:
        """The descriptors apply() gives a call (-1: none)."""
        return tuple(self._pipes[name].write_fd if name in self._pipes else -1  # type: ignore[return-value]
                     for name in ("stdout", "stderr"))

    def apply(self, options: _core.CallOptions) -> _core.CallOptions:
        """``options`` with this call's descriptors. The result then waits for the worker's exit,
        after which its output is complete."""
        options.early_small_result = False
        if "stdout" in self._pipes:
            options.stdout_fd = self._pipes["stdout"].write_fd
        if "stderr" in self._pipes:
            options.stderr_fd = self._pipes["stderr"].write_fd
        return options

    def close(self) -> Optional[tuple[str, str]]:
        """Once the job has ended (or never started): gives up this call's pipes and waits until
        its output has been handed on: all of a pipe of its own, or of a shared pipe what it held
        by now (a pipe's last call waits for its end). Returns (stdout, stderr) when capturing."""
        with _lock:
            released = self._release_all()
            forwarder = _forwarder
        if released and forwarder is not None and threading.current_thread() is not forwarder.thread:
            # (Not in the reader thread: a sink that made a call would wait for itself.)
            waits: list[tuple[_Pipe, Optional[int]]] = []
            for pipe, _ in released:
                # What the pipe holds now, a partial last line included (a process the function
                # left running may hold a pipe open, and end no line, for as long as it likes).
                target = pipe.ask_sync()
                if target >= 0:
                    forwarder.sync(pipe)
                    waits.append((pipe, target))
            # A pipe closed here: its end, all that was written to it read.
            waits += [(pipe, None) for pipe, closed in released if closed]
            deadline = time.monotonic() + DRAIN_S
            for pipe, until in waits:
                pipe.wait(until, deadline)
        if not self.capture:
            return None
        with self._lock:
            self._open = False
            return "".join(self._text["stdout"]), "".join(self._text["stderr"])


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

"""A sweep trial's checkpoints (docs/sweeps.md#checkpoints): ``with isorun.checkpoint(step) as
folder:`` saves one, committed whole; ``isorun.latest_checkpoint()`` is what the attempt resumes
from; ``isorun.should_checkpoint()`` says a planned stop is coming.

The folder layout is the one the sweep's C++ side reads (worker/include/isorun/worker/checkpoint.hpp):
committed checkpoints are folders ``step-NNNNNNNNNNNN`` in ``$ISORUN_CHECKPOINT_DIR``, each made
whole in a staging folder, fsync'ed, then renamed (atomic), then the parent fsync'ed; the latest
``$ISORUN_CHECKPOINT_KEEP`` are kept."""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import shutil
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

from ._report import write_line

__all__ = ["Checkpoint", "checkpoint", "latest_checkpoint", "should_checkpoint"]

_PREFIX = "step-"
_DIGITS = re.compile("[0-9]+")
_MAX_STEP = 2**63 - 1  # the supervisor's steps are 64-bit
_STAGING = ".writing-"
_serial = itertools.count()
_warned = False
_installed = False


class Checkpoint(NamedTuple):
    """A committed checkpoint: its step and its folder."""

    step: int
    path: Path


def _folder() -> Path | None:
    where = os.environ.get("ISORUN_CHECKPOINT_DIR")
    return Path(where) if where else None


def _step_of(name: str) -> int | None:
    """The step a committed folder's name says, read as the supervisor reads it (checkpoint.cpp's
    step_of): ASCII digits only (``str.isdigit()`` also takes ``²`` and ``٣``, which the
    supervisor does not list), at most ``2**63 - 1``; ``None`` for any other name."""
    if not name.startswith(_PREFIX) or not _DIGITS.fullmatch(name, len(_PREFIX)):
        return None
    step = int(name[len(_PREFIX):])
    return step if step <= _MAX_STEP else None


def _committed(folder: Path) -> list[Checkpoint]:
    found = []
    with contextlib.suppress(FileNotFoundError):
        for entry in os.scandir(folder):
            step = _step_of(entry.name)
            if step is not None and entry.is_dir(follow_symlinks=False):
                found.append(Checkpoint(step, Path(entry.path)))
    return sorted(found)


def latest_checkpoint() -> Checkpoint | None:
    """The trial's latest committed checkpoint, if it has one: what this attempt resumes from (a
    retry, an out-of-memory retry at a larger cap, a resumed sweep). ``None`` outside a sweep with
    ``checkpoints:``, or before the trial's first checkpoint."""
    folder = _folder()
    if folder is None:
        return None
    committed = _committed(folder)
    return committed[-1] if committed else None


def _sync(path: str, directory: bool) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | (os.O_DIRECTORY if directory else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _sync_tree(root: Path) -> None:
    folders = []
    for here, dirs, files in os.walk(root):
        for name in files:
            path = os.path.join(here, name)
            if not os.path.islink(path):
                _sync(path, False)
        folders.append(here)
        dirs[:] = [d for d in dirs if not os.path.islink(os.path.join(here, d))]
    for here in reversed(folders):
        _sync(here, True)


@contextlib.contextmanager
def checkpoint(step: int) -> Iterator[Path]:
    """Saves checkpoint ``step`` of the running trial::

        with isorun.checkpoint(step) as folder:
            torch.save(model.state_dict(), folder / "model.pt")

    ``folder`` is a new, empty folder; when the block ends without an exception, it is committed
    whole (fsync'ed, then renamed: a trial stopped half-way through leaves the previous checkpoint
    as the latest) and handed to every later attempt of the trial (:func:`latest_checkpoint`).
    Steps only go forward.

    :raises RuntimeError: outside a sweep with ``checkpoints:``.
    :raises ValueError: for a step not after the latest committed one, or past ``2**63 - 1``
        (nothing is written)."""
    folder = _folder()
    if folder is None:
        raise RuntimeError("isorun.checkpoint(): this function does not run in a sweep with checkpoints "
                           "(add checkpoints: {keep: 2} to the spec)")
    if isinstance(step, bool) or not isinstance(step, int):
        raise TypeError(f"checkpoint: step is a whole number, not {type(step).__name__}")
    if step > _MAX_STEP:
        raise ValueError(f"checkpoint step {step} is larger than the largest step a checkpoint can have, "
                         f"{_MAX_STEP} (2**63 - 1); nothing was written")
    last = latest_checkpoint()
    if step < 0 or (last is not None and step <= last.step):
        raise ValueError(f"checkpoint step {step} is not after the latest committed one, "
                         f"{last.step if last else -1}, in {folder} (steps only go forward; nothing was written)")
    staged = folder / f"{_STAGING}{step}-{os.getpid()}-{next(_serial)}"
    staged.mkdir()
    try:
        yield staged
        _sync_tree(staged)
        os.rename(staged, folder / f"{_PREFIX}{step:012d}")
        _sync(str(folder), True)
    except BaseException:
        shutil.rmtree(staged, ignore_errors=True)  # a checkpoint not committed leaves nothing
        raise
    keep = max(1, int(os.environ.get("ISORUN_CHECKPOINT_KEEP", "1") or 1))
    for old in _committed(folder)[:-keep]:
        shutil.rmtree(old.path, ignore_errors=True)
    write_line({"checkpoint": step})  # committed: the sweep tells its trackers


def _on_warning(signum: int, frame: Any) -> None:
    global _warned
    _warned = True


def should_checkpoint() -> bool:
    """Whether a planned stop is coming (the trial's timeout, the sweep being stopped): save a
    checkpoint now, within the stop's grace period. From the first call on (make it before the
    work starts), the sweep's warning signal (``checkpoints: {signal: ...}``, SIGUSR1 by default)
    no longer ends the interpreter but makes this True; a function that never asks is ended by
    it. Outside a sweep with checkpoints it is always False."""
    global _installed
    if not _installed and _folder() is not None:
        signal.signal(int(os.environ.get("ISORUN_CHECKPOINT_SIGNAL", int(signal.SIGUSR1))), _on_warning)
        _installed = True
    return _warned

"""Sweeps from Python: :func:`sweep` runs ``isorun sweep`` (the C++ command the package carries)
on a spec given as a file or a dict, and returns the journaled records; :func:`sweep_iter` yields
them as they are journaled."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Generator, Iterator, Mapping, Sequence
from typing import Any, Callable, Optional, Union

from . import _progress
from ._trial import TRIAL_ENV
from .errors import Error, UsageError

__all__ = ["sweep", "sweep_iter", "SweepResults"]

Spec = Union[str, "os.PathLike[str]", Mapping[str, Any]]


class SweepResults(list):
    """The sweep's records, one per trial in the order they were journaled: each a dict with
    ``id``, ``params``, ``outcome`` (``"success"``, ``"task_error"``, ...), ``result`` (what the
    trial returned), ``attempts``, ``device``, ``wall_s`` and the rest of the journal's fields
    (docs/sweeps.md). ``out`` is the output folder (``results.csv``, ``report.html``, ``logs/``)."""

    out: str

    def __init__(self, records: list[dict[str, Any]], out: str) -> None:
        super().__init__(records)
        self.out = out

    def frame(self) -> Any:
        """The records as a pandas DataFrame: one row per trial, its parameters and its result's
        fields as columns (``params.lr``, ``result.loss``) beside ``id`` and ``outcome``.
        Raises ImportError where pandas is not installed."""
        try:
            import pandas
        except ImportError as e:  # pandas is optional: the records are plain dicts without it
            raise ImportError("SweepResults.frame() needs pandas: pip install pandas (or use the records, "
                              "which are dicts, as they are)") from e

        return pandas.json_normalize(list(self))


def _target(fn: Callable[..., Any]) -> str:
    """``python:`` for a function object: ``module:qualname``, or ``/path/file.py:qualname`` for a
    function of the script being run (its trials load the file as a module, not as __main__)."""
    qualname = getattr(fn, "__qualname__", "")
    if not qualname or "<" in qualname:
        raise UsageError(f"a sweep's function is found by name in its trials' interpreters, so it must be defined "
                         f"at the top level of a module or script, not a lambda or a nested function ({fn!r})")
    module = getattr(fn, "__module__", None)
    if module == "__main__":
        path = getattr(sys.modules["__main__"], "__file__", None)
        if not path:
            raise UsageError("a function defined in an interactive session cannot be a sweep's function: put it in "
                             "a file and name it as 'path/to/file.py:function'")
        return f"{os.path.abspath(path)}:{qualname}"
    return f"{module}:{qualname}"


def _program() -> str:
    program = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin", "isorun")
    if not os.access(program, os.X_OK):
        raise Error(f"isorun: the bundled command is missing ({program}); reinstall the package")
    return program


def _out_of(line: str) -> Optional[str]:
    """The output folder in the command's first line ("...; results in OUT/")."""
    marker = "; results in "
    at = line.rfind(marker)
    if at < 0:
        return None
    out = line[at + len(marker):].rstrip("\n")
    return out[:-1] if out.endswith("/") else out


class _JournalTail:
    """Reads ``OUT/results.jsonl`` as the sweep appends to it: each call gives the records of the
    complete lines written since the last (a line still being written waits for its newline).
    The journal is append-only JSON lines: a line that does not parse (cut short by a crash) is
    skipped, as isorun skips it."""

    def __init__(self, out: str) -> None:
        self._path = os.path.join(out, "results.jsonl")
        self._offset = 0

    def read(self) -> list[dict[str, Any]]:
        try:
            with open(self._path, "rb") as journal:
                journal.seek(self._offset)
                data = journal.read()
        except FileNotFoundError:
            return []
        complete = data[:data.rfind(b"\n") + 1]
        self._offset += len(complete)
        records = []
        for line in complete.splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and "id" in record:
                records.append(record)
        return records


def _records(out: str) -> list[dict[str, Any]]:
    """The latest record of each trial in ``OUT/results.jsonl``, in journal order."""
    latest: dict[str, dict[str, Any]] = {}
    for record in _JournalTail(out).read():
        latest.pop(record["id"], None)
        latest[record["id"]] = record
    return list(latest.values())


def _counts(line: str) -> Optional[tuple[int, int]]:
    """(trials, to run) in the command's first line ("...: 12 trials (8 to run) on ...", or for a
    search "...: up to 100 trials chosen by ...")."""
    found = re.search(r": (\d+) trials \((\d+) to run\)", line)
    if found:
        return int(found.group(1)), int(found.group(2))
    found = re.search(r": up to (\d+) trials chosen by", line)
    return (int(found.group(1)), int(found.group(1))) if found else None


def _with_search(spec: Spec, search: Any, trials: Any, folder: str, env: dict[str, str]) -> Spec:
    """The spec with ``search=`` (an Optuna sampler, or a study whose sampler is taken) and
    ``trials=`` put in its ``search:``; the sampler handed to the searcher pickled, in
    ``folder``."""
    if search is None and trials is None:
        return spec
    if not isinstance(spec, Mapping):
        raise UsageError("search= and trials= go with a spec given as a dict; in a YAML file, write them in its "
                         "search:")
    if trials is not None and (isinstance(trials, bool) or not isinstance(trials, int) or trials < 1):
        raise UsageError(f"trials takes the number of trials to ask the searcher for (1 or more), not {trials!r}")
    spec = dict(spec)
    settings = dict(spec.get("search") or {})
    settings.setdefault("type", "optuna")
    if trials is not None:
        settings["trials"] = trials
    if search is not None:
        try:
            import optuna
        except ImportError as e:
            raise UsageError(f"search= takes an Optuna sampler or study, and Optuna is not installed ({e}); "
                             "pip install optuna (or pip install 'isorun[optuna]')") from None
        sampler = search.sampler if isinstance(search, optuna.Study) else search
        if not isinstance(sampler, optuna.samplers.BaseSampler):
            raise UsageError(f"search= takes an Optuna sampler (optuna.samplers.TPESampler(seed=0), ...) or a study, "
                             f"not {type(search).__name__}")
        import cloudpickle

        path = os.path.join(folder, "sampler.pkl")
        with open(path, "wb") as f:
            cloudpickle.dump(sampler, f)
        env["ISORUN_SEARCH_SAMPLER"] = path  # (where isorun.search.optuna takes it from)
        settings["type"] = "optuna"
        # (Its class in the spec: the folder's fingerprint then tells this sampler from another.)
        name = re.sub(r"[^A-Za-z0-9_.]", "_", f"{type(sampler).__module__}.{type(sampler).__qualname__}")
        settings["sampler"] = f"pickled:{name}"
    spec["search"] = settings
    return spec


class _Tally:
    """The progress of a sweep from its records: the trials with a final record (a trial
    retried under a larger cap has a record per attempt, ``retry_mem_limit`` on all but its
    last), and how many of them did not end well (neither a success nor pruned)."""

    def __init__(self) -> None:
        self._ok: dict[str, bool] = {}

    def add(self, record: dict[str, Any]) -> None:
        if not record.get("retry_mem_limit"):
            self._ok[record["id"]] = record.get("outcome") in ("success", "pruned")

    @property
    def done(self) -> int:
        return len(self._ok)

    @property
    def failed(self) -> int:
        return sum(not ok for ok in self._ok.values())


# How often the journal is read while the command runs: records reach the caller this late at most.
_POLL_S = 0.1


def _options(out: Any, rerun_failed: Any, args: Any, progress: Any, serve: Any = False) -> list[str]:
    """The command's options from the keyword arguments, checked (``progress`` too) before
    anything starts."""
    if not isinstance(rerun_failed, bool):
        raise UsageError(f"rerun_failed takes True or False, not {rerun_failed!r}")
    _progress.check(progress)
    if isinstance(args, str) or not all(isinstance(a, str) for a in args):
        raise UsageError(f"args takes a tuple of isorun sweep options, as strings, not {args!r}")
    options = ["--no-progress", *args]
    if out is not None:
        options += ["--out", os.fspath(out)]
    if rerun_failed:
        options.append("--rerun-failed")
    return options + _serve(serve)


def _serve(serve: Any) -> list[str]:
    """``serve``: False, True (a free port) or a port, as the command's options."""
    if serve is False:
        return []
    if serve is True:
        return ["--serve"]
    if isinstance(serve, bool) or not isinstance(serve, int) or not 0 < serve < 65536:
        raise UsageError(f"serve takes True (a free port), a port (1 to 65535) or False, not {serve!r}")
    return ["--serve", "--port", str(serve)]


Track = Union[str, Sequence[str], Mapping[str, Mapping[str, Any]]]


def _with_track(spec: Spec, track: Optional[Track]) -> tuple[Spec, list[str]]:
    """The spec and the command's options with ``track`` added (docs/sweeps.md#trackers): a name
    (``"mlflow"``, ``"mlflow=sqlite:///mlflow.db"``) or a list of them as ``--track`` options; a
    mapping of trackers by name to their settings, merged into a mapping spec's ``track``."""
    if track is None:
        return spec, []
    if isinstance(track, str):
        track = [track]
    if isinstance(track, Mapping):
        if not all(isinstance(k, str) and isinstance(v, Mapping) for k, v in track.items()):
            raise UsageError(f"track takes a mapping of trackers by name to their settings, not {track!r}")
        if isinstance(spec, Mapping):
            merged = dict(spec)
            merged["track"] = {**(spec.get("track") or {}), **{k: dict(v) for k, v in track.items()}}
            return merged, []
        if any(set(v) - {"uri"} for v in track.values()):
            raise UsageError("track: settings other than uri go in the spec file's track: section")
        track = [f"{k}={v['uri']}" if "uri" in v else k for k, v in track.items()]
    if not isinstance(track, Sequence) or not all(isinstance(t, str) and t for t in track):
        raise UsageError(f"track takes a tracker's name (\"mlflow\", \"mlflow=URI\"), a list of them or a mapping of "
                         f"them to their settings, not {track!r}")
    return spec, [option for t in track for option in ("--track", t)]


def _run(spec: Spec, options: list[str], progress: bool, search: Any = None,
         trials: Optional[int] = None, quiet: bool = False) -> Generator[dict[str, Any], None, str]:
    """Runs ``isorun sweep`` and yields each record as it is journaled, the records of earlier
    runs of the same sweep first; returns the output folder. Leaving the iterator early stops
    the sweep as Ctrl-C does (and waits for it). The one loop behind :func:`sweep` and
    :func:`sweep_iter`."""
    if os.environ.get(TRIAL_ENV):
        raise UsageError("isorun.sweep() was called in a sweep's trial: the script that runs the sweep was imported "
                         "by its trials; put the sweep under if __name__ == '__main__':")
    program = _program()
    with tempfile.TemporaryDirectory(prefix="isorun-sweep-spec-") as folder:
        env = dict(os.environ)
        spec, path = _spec_file(_with_search(spec, search, trials, folder, env), folder)
        error_file = _command_env(env, folder)
        lines: list[str] = []
        table: list[str] = []  # its stdout: the rank table, written to sys.stdout once the records are
        # A session of its own: a Ctrl-C at the terminal reaches this process alone, and it hands
        # the command exactly one SIGINT per interrupt, also where only this process is
        # interrupted (Jupyter's "interrupt the kernel").
        with subprocess.Popen([program, "sweep", path, *options], stderr=subprocess.PIPE, text=True,
                              stdout=subprocess.DEVNULL if quiet else subprocess.PIPE,
                              errors="replace", env=env, start_new_session=True) as proc:
            followed = yield from _follow(proc, lines, table, progress)
        failure, said_why = _failure(error_file)
    out, interrupted = followed
    if interrupted:
        raise KeyboardInterrupt
    _raise_for_exit(proc.returncode, failure, said_why, lines, path if isinstance(spec, dict) else None)
    if out is None:  # (a sweep that ended well said where its results are)
        raise Error(f"isorun sweep ended with exit code {proc.returncode}: {''.join(lines[-5:]).strip()}")
    # Through sys.stdout (redirect_stdout, capsys, Jupyter), after the last record was handed over.
    sys.stdout.write("".join(table))
    sys.stdout.flush()
    return out


def _spec_file(spec: Spec, folder: str) -> tuple[Spec, str]:
    """The spec as the command reads it: a file as given, or a mapping written into ``folder`` as
    JSON (which is YAML), a function named by ``python`` as the module:name the trials import."""
    if not isinstance(spec, Mapping):
        return spec, os.fspath(spec)
    spec = dict(spec)
    if callable(spec.get("python")):
        spec["python"] = _target(spec["python"])
    path = os.path.join(folder, "spec.yaml")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(spec, f, indent=2)
    return spec, path


def _command_env(env: dict[str, str], folder: str) -> str:
    """Sets what the command needs in ``env`` (the trials' interpreter and its module path, this
    process as the one it stops with); returns the file its failure record goes to."""
    env.setdefault("ISORUN_PYTHON", sys.executable)
    # The trials' interpreters find modules as this one does.
    env["PYTHONPATH"] = os.pathsep.join(p for p in [*sys.path, env.get("PYTHONPATH", "")] if p)
    env["ISORUN_STOP_WITH_PARENT"] = str(os.getpid())  # it stops its trials if this process dies
    error_file = os.path.join(folder, "error.json")
    env["ISORUN_ERROR_FILE"] = error_file  # its refusal as a record, not words to scrape
    return error_file


def _follow(proc: subprocess.Popen, lines: list[str], table: list[str],
            progress: bool) -> Generator[dict[str, Any], None, tuple[Optional[str], bool]]:
    """Yields the records the running command journals, until it ends (or the caller leaves, which
    stops it); returns its output folder (None if it never said) and whether Ctrl-C stopped it.
    Its stderr lines go to ``lines`` and its stdout to ``table``, each read by a thread of its own,
    so that this one reads the journal while they come (or do not)."""
    echo = threading.Thread(target=_echo, args=(proc, lines), name="isorun-sweep-stderr", daemon=True)
    echo.start()
    keep = threading.Thread(target=_keep, args=(proc, table), name="isorun-sweep-stdout", daemon=True)
    keep.start()
    tail: Optional[_JournalTail] = None
    out: Optional[str] = None
    tally, bar, counts = _Tally(), None, None
    interrupted = ended = False
    try:
        while not ended:
            try:
                ended = _ended(proc, _POLL_S)
            except KeyboardInterrupt:
                interrupted = True
                proc.send_signal(signal.SIGINT)  # it stops its trials; a second one at once
                continue
            if ended:
                echo.join()  # its last lines, then the journal's last records
                keep.join()
            if tail is None:
                out = next((o for o in map(_out_of, lines) if o), None)
                if out is None:
                    continue
                tail = _JournalTail(out)
                counts = _counts(next(line for line in lines if _out_of(line)))
            records = tail.read()
            for record in records:
                tally.add(record)
            if bar is not None:
                bar.update(tally.done, tally.failed)
            elif progress and counts and counts[0]:
                # From what the journal holds at first (a resumed sweep's records): the rate counts
                # what ends from now on.
                bar = _progress.Progress(counts[0], "trials", tally.done, tally.failed)
            yield from records
    finally:
        if bar is not None:
            bar.close()
        if not ended:  # the caller left the iterator, or its on_record raised
            _stop(proc)
            echo.join()  # (before the pipes they read are closed)
            keep.join()
    return out, interrupted


def _raise_for_exit(code: Optional[int], failure: str, said_why: str, lines: list[str],
                    written: Optional[str]) -> None:
    """The exception for how the command ended, if it did not end with its results (exit 0, or 1
    where trials failed): its refusal as :class:`UsageError` (the spec file ``written`` here
    called "spec", without the lines of a file the caller never saw), Ctrl-C, a failed searcher.
    The command's error lines that :func:`_echo` held back go to stderr where no exception
    carries them."""
    said = "".join(lines[-5:]).strip()
    if code == 2:
        # The command's own words, from its failure record, and "the spec" for the file written here.
        message = (said_why if failure == "usage" else "") or said or "isorun sweep refused the spec"
        if written:
            message = re.sub(re.escape(written) + r": (line \d+(, column \d+)?: )?", "spec: ", message)
        raise UsageError(message)
    if code == 1 and failure == "search_error":  # (failed trials exit 1 too; the record tells them apart)
        raise Error(said_why)
    if code not in (0, 1, 130):
        raise Error(f"isorun sweep ended with exit code {code}: {said}")
    sys.stderr.writelines(line for line in lines if line.startswith(_ERROR_LINE))
    if code == 130:
        raise KeyboardInterrupt


def _failure(error_file: str) -> tuple[str, str]:
    """The outcome and message of the command's failure record (ISORUN_ERROR_FILE): ("usage",
    ...) for a refusal, ("search_error", ...) where the searcher failed; ("", "") if it wrote
    none."""
    try:
        with open(error_file, encoding="utf-8", errors="replace") as f:
            record = json.load(f)
    except (OSError, ValueError):
        return "", ""
    if not isinstance(record, dict) or not isinstance(record.get("message"), str):
        return "", ""
    return str(record.get("outcome")), record["message"]


# How the command's error lines begin: held back by _echo, for the exception to carry.
_ERROR_LINE = "isorun: error: "


def _echo(proc: subprocess.Popen[str], lines: list[str]) -> None:
    """Echoes the command's stderr to this process's and keeps its lines, until it ends; its error
    lines are only kept (:func:`_raise_for_exit` says them once, in the exception or here)."""
    assert proc.stderr is not None
    for line in proc.stderr:
        lines.append(line)
        if not line.startswith(_ERROR_LINE):
            sys.stderr.write(line)


def _keep(proc: subprocess.Popen[str], table: list[str]) -> None:
    """Keeps the command's stdout (its rank table) until it ends; nothing where it is quiet."""
    if proc.stdout is not None:
        table.extend(proc.stdout)


def _ended(proc: subprocess.Popen[str], within: float) -> bool:
    try:
        proc.wait(within)
    except subprocess.TimeoutExpired:
        return False
    return True


def _stop(proc: subprocess.Popen[str]) -> None:
    """Stops the command as Ctrl-C does, and waits for its trials to stop; an interrupt while it
    waits stops them at once (the command's second SIGINT)."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGINT)
    while True:
        try:
            proc.wait()
            return
        except KeyboardInterrupt:
            proc.send_signal(signal.SIGINT)


def sweep(spec: Spec, *, out: Union[str, os.PathLike[str], None] = None, rerun_failed: bool = False,
          args: tuple[str, ...] = (), progress: bool = False,
          on_record: Optional[Callable[[dict[str, Any]], None]] = None, search: Any = None,
          trials: Optional[int] = None, quiet: bool = False, track: Optional[Track] = None,
          serve: Union[bool, int] = False) -> SweepResults:
    """Runs a sweep and returns its records.

    ``spec`` is a sweep spec: the path of a YAML file, or a dict with the same keys
    (docs/sweeps.md). Its ``python`` may be a function object as well as ``"module:function"``
    or ``"path/to/file.py:function"``; each trial calls it in a fresh interpreter (this one's
    ``sys.executable``, with the package) with the trial's parameters as keyword arguments, and
    its returned dict is the trial's result. Everything sweeps do applies: packing on GPUs under
    ``mem_limit``, standby interpreters (``resources: {standby: 1, preload: [numpy]}``), the
    journal and resume (running the same sweep again runs only what is not done), the report.

    ``out`` overrides the spec's output folder; ``rerun_failed`` runs failed trials again;
    ``args`` are more ``isorun sweep`` options (``("--metric", "loss:min")``). The command's
    lines go to stderr as it runs; its rank table to ``sys.stdout`` when it ends, unless
    ``quiet=True``. ``progress=True`` shows the trials done of all, the failures
    and the rate on stderr as they end (a tqdm bar where tqdm is installed, else a line of
    isorun's own). ``on_record(record)`` is called in this thread with each record as it is
    journaled, in journal order (those of earlier runs of the same sweep first); if it raises,
    the sweep is stopped and the exception raised. :func:`sweep_iter` yields the records instead.

    ``search`` chooses each trial from the results so far (docs/sweeps.md#search): an Optuna
    sampler (``optuna.samplers.TPESampler(seed=0)``) or a study (its sampler), with the
    distributions in the spec's ``search: {params: ...}`` and ``trials`` the budget::

        isorun.sweep({"python": train, "metric": {"name": "loss", "goal": "minimize"},
                      "search": {"params": {"lr": {"float": [1e-4, 0.1], "log": True}}}},
                     search=optuna.samplers.TPESampler(seed=0), trials=200)

    ``track`` sends the sweep's events to trackers as well (docs/sweeps.md#trackers): ``"mlflow"``
    (the sweep a parent run, each trial a child run), ``"mlflow=sqlite:///mlflow.db"``,
    ``"tensorboard"``, a list of them, or a mapping of trackers by name to their settings
    (``{"mlflow": {"uri": ..., "experiment": "lr-search"}}``). ``serve=True`` serves the live
    report while the sweep runs (``isorun sweep --serve``, docs/sweeps.md#the-live-report): its
    address, with the token that opens it, is the command's line ``isorun: the report, live:
    URL`` on stderr; ``serve=PORT`` takes that port on 127.0.0.1.

    Returns the records (:class:`SweepResults`, a list; ``.frame()`` makes a DataFrame), also
    when some trials failed: each record says how its trial ended. Raises :class:`UsageError`
    for a spec isorun refuses (nothing is started), :class:`KeyboardInterrupt` when the sweep
    was interrupted, and :class:`Error` if the command failed otherwise.
    """
    if on_record is not None and not callable(on_record):
        raise UsageError(f"on_record takes a function of one record, not {on_record!r}")
    spec, tracking = _with_track(spec, track)
    stream = _run(spec, _options(out, rerun_failed, args, progress, serve) + tracking, progress, search, trials,
                  _quiet(quiet))
    while True:
        try:
            record = next(stream)
        except StopIteration as end:
            return SweepResults(_records(end.value), end.value)
        if on_record is not None:
            try:
                on_record(record)
            except BaseException:
                stream.close()  # the sweep stops
                raise


def sweep_iter(spec: Spec, *, out: Union[str, os.PathLike[str], None] = None, rerun_failed: bool = False,
               args: tuple[str, ...] = (), progress: bool = False, search: Any = None,
               trials: Optional[int] = None, quiet: bool = False, track: Optional[Track] = None,
               serve: Union[bool, int] = False) -> Iterator[dict[str, Any]]:
    """Runs a sweep as :func:`sweep` does, and yields each trial's record as it is journaled in
    ``OUT/results.jsonl``, while the sweep runs: those of earlier runs of the same sweep first
    (resume), then each as its trial ends. A trial retried under a larger cap has a record per
    attempt; its last counts.

        for record in isorun.sweep_iter({"python": train, "params": {"lr": [0.1, 0.01]}}):
            print(record["params"], record["outcome"], record["result"])

    Leaving the loop early (``break``, an exception, closing the generator) stops the sweep as
    Ctrl-C does, and waits for its trials to stop. The options are :func:`sweep`'s; bad ones are
    a :class:`UsageError` at once, and the errors :func:`sweep` raises come from the iteration.
    """
    spec, tracking = _with_track(spec, track)
    return _run(spec, _options(out, rerun_failed, args, progress, serve) + tracking, progress, search, trials,
                _quiet(quiet))


def _quiet(quiet: Any) -> bool:
    if not isinstance(quiet, bool):
        raise UsageError(f"quiet takes True or False, not {quiet!r}")
    return quiet

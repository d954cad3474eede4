"""Sweeps from Python: :func:`sweep` runs ``isorun sweep`` (the C++ command the package carries)
on a spec given as a file or a dict, and returns the journaled records."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from typing import Any, Callable, Mapping, Optional, Union

from .errors import Error, UsageError

__all__ = ["sweep", "SweepResults"]

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
        import pandas

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


def _records(out: str) -> list[dict[str, Any]]:
    """The latest record of each trial in ``OUT/results.jsonl``, in journal order."""
    latest: dict[str, dict[str, Any]] = {}
    try:
        with open(os.path.join(out, "results.jsonl"), encoding="utf-8") as journal:
            for line in journal:
                try:
                    record = json.loads(line)
                except ValueError:
                    continue  # a line cut short by a crash: isorun skips it too
                if isinstance(record, dict) and "id" in record:
                    latest.pop(record["id"], None)
                    latest[record["id"]] = record
    except FileNotFoundError:
        pass
    return list(latest.values())


def _follow(proc: "subprocess.Popen[str]", lines: list[str]) -> int:
    """Echoes the command's stderr and keeps its lines until it ends; returns its exit code. An
    interrupt is handed to the command as SIGINT (it stops its trials: a second one stops them
    at once) and raised once the command has ended."""
    assert proc.stderr is not None
    interrupted = False
    while True:
        try:
            for line in proc.stderr:
                lines.append(line)
                sys.stderr.write(line)
            code = proc.wait()
            break
        except KeyboardInterrupt:
            interrupted = True
            proc.send_signal(signal.SIGINT)
    if interrupted:
        raise KeyboardInterrupt
    return code


def sweep(spec: Spec, *, out: Union[str, "os.PathLike[str]", None] = None, rerun_failed: bool = False,
          args: tuple[str, ...] = ()) -> SweepResults:
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
    lines go to stderr as it runs.

    Returns the records (:class:`SweepResults`, a list; ``.frame()`` makes a DataFrame), also
    when some trials failed: each record says how its trial ended. Raises :class:`UsageError`
    for a spec isorun refuses (nothing is started), :class:`KeyboardInterrupt` when the sweep
    was interrupted, and :class:`Error` if the command failed otherwise.
    """
    if os.environ.get("ISORUN_SWEEP_TRIAL"):
        raise UsageError("isorun.sweep() was called in a sweep's trial: the script that runs the sweep was imported "
                         "by its trials; put the sweep under if __name__ == '__main__':")
    program = _program()
    with tempfile.TemporaryDirectory(prefix="isorun-sweep-spec-") as folder:
        if isinstance(spec, Mapping):
            spec = dict(spec)
            if callable(spec.get("python")):
                spec["python"] = _target(spec["python"])
            path = os.path.join(folder, "spec.yaml")
            with open(path, "w", encoding="utf-8") as f:
                json.dump(spec, f, indent=2)  # JSON is YAML
        else:
            path = os.fspath(spec)
        command = [program, "sweep", path, "--no-progress", *args]
        if out is not None:
            command += ["--out", os.fspath(out)]
        if rerun_failed:
            command.append("--rerun-failed")
        env = dict(os.environ)
        env.setdefault("ISORUN_PYTHON", sys.executable)
        # The trials' interpreters find modules as this one does.
        env["PYTHONPATH"] = os.pathsep.join(p for p in [*sys.path, env.get("PYTHONPATH", "")] if p)
        env["ISORUN_STOP_WITH_PARENT"] = str(os.getpid())  # it stops its trials if this process dies
        lines: list[str] = []
        # A session of its own: a Ctrl-C at the terminal reaches this process alone, and it hands
        # the command exactly one SIGINT per interrupt, also where only this process is
        # interrupted (Jupyter's "interrupt the kernel").
        with subprocess.Popen(command, stderr=subprocess.PIPE, text=True, errors="replace", env=env,
                              start_new_session=True) as proc:
            code = _follow(proc, lines)
    said = "".join(lines[-5:]).strip()
    if code == 2:
        # The command's own words, without its prefix, and "the spec" for the file written here.
        errors = [l.strip().removeprefix("isorun: error: ") for l in lines if l.startswith("isorun: error: ")]
        message = errors[-1] if errors else said or "isorun sweep refused the spec"
        if isinstance(spec, dict):
            message = message.replace(path + ": ", "spec: ")
        raise UsageError(message)
    if code == 130:
        raise KeyboardInterrupt
    folder_out = next((o for o in map(_out_of, lines) if o), None)
    if code not in (0, 1) or folder_out is None:
        raise Error(f"isorun sweep ended with exit code {code}: {said}")
    return SweepResults(_records(folder_out), folder_out)

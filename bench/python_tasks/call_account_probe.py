"""Preloaded into the standby interpreters of ``bench/python_call_account.py``: wraps the Python
worker's steps of a call (private functions of ``isorun._worker``, as they are now) and appends
their CLOCK_MONOTONIC stamps, one JSON line per call, to the file ``ISORUN_ACCOUNT_LOG`` names."""

import json
import os
import time

import cloudpickle

import isorun._payload as payload
import isorun._worker as worker

# Opened now, while the interpreter waits: the call's path only writes one line to it, and that
# write is all of the probe's own cost between the stamps "entry_done" and the worker's `done`.
_LOG = os.open(os.environ["ISORUN_ACCOUNT_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
_stamps: dict[str, int] = {}
json.dumps({})  # its first use's setup, out of the call


def _wrap(fn, before: str | None, after: str | None):
    def wrapped(*args, **kwargs):
        if before:
            _stamps[before] = time.monotonic_ns()
        value = fn(*args, **kwargs)
        if after:
            _stamps[after] = time.monotonic_ns()
        return value

    return wrapped


worker._sync_environ = _wrap(worker._sync_environ, "environ", "environ_done")
worker._line_buffered_stdout = _wrap(worker._line_buffered_stdout, None, "stdout_done")
worker._flush = _wrap(worker._flush, "flush", "flush_done")
payload.cloudpickle.loads = _wrap(cloudpickle.loads, "unpickle", "unpickle_done")
_entry = worker._entry


def _entry_stamped(request):
    _stamps.clear()
    _stamps["entry"] = time.monotonic_ns()
    value = _entry(request)
    _stamps["entry_done"] = time.monotonic_ns()
    os.write(_LOG, (json.dumps(_stamps) + "\n").encode())
    return value


worker._entry = _entry_stamped  # serve() is handed the module's _entry after the preloads

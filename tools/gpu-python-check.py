#!/usr/bin/env python3
"""GPU checks of the isorun Python package (python/isorun) with PyTorch, run once on a GPU machine.

    PYTHONPATH=$BUILD/python python3 tools/gpu-python-check.py [--checks a,b] [--budget 90]

Checks, each in a child Python process of its own under its own time limit (and all of them
within --budget seconds), so that a hang is reported, with the stacks of every process involved,
instead of eating the run:

  executor-oversubscribe     isorun.Executor(gpus="all", mem_limit=CAP) with CAP about a third of
                             the GPU's free memory, and 3x as many calls as fit at once, each holding
                             most of CAP in a torch tensor for 0.5 s: every call succeeds, and the
                             device's used memory, sampled from outside (pynvml, else nvidia-smi),
                             never exceeds its total. Reports the peak and the concurrency seen.
  device-assert-then-healthy a call that trips a device-side assert (an out-of-bounds CUDA index)
                             raises a classified exception in the caller (no hang, no caller
                             crash), and the next call of the same function succeeds.
  cuda-tensor-result         a function that returns a CUDA tensor: says whether the caller gets an
                             error, a CPU copy or a CUDA tensor of its own; it must not hang.
  zygote-gpu                 start="zygote" with preload=["torch"] on gpu=0: a few small CUDA
                             calls succeed, and at least one ran in a worker forked from the zygote.
  standby-torch              standby interpreters with preload=["torch"], warm_context=True on
                             gpu=0 under mem_limit="2G": warm calls 50 ms apart; reports the median.

Each check prints `PASS name: detail`, `FAIL name: detail` or `SKIP name: reason`, then a line
`== N passed, M failed, K skipped`; the exit status is 0 only if nothing failed. A hung check is
`FAIL name: hung after N s`, followed by each involved process's /proc wchan and kernel stack and
the Python stacks (faulthandler) of the check and of its workers. (`--checks hang-selftest`, a
hidden check, hangs on purpose to show that report.)

Without a GPU (no working nvidia-smi, or no PyTorch with CUDA) every check is SKIP and the exit
status is 0. `--cpu-dry-run` (for machines without a GPU) runs the same harness and the same
isorun calls on a simulated GPU (ISORUN_SIMULATE_GPUS) with NumPy standing in for PyTorch: it
checks this script, not the GPU.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import uuid
from typing import Any, Callable, NamedTuple, Optional

# Every process a check starts inherits this variable (workers and zygotes get the caller's
# environment), so that its processes are found even where they are no longer its descendants.
TAG_ENV = "ISORUN_GPU_PYTHON_CHECK_TAG"
DRY_GPUS = "1x16G"  # the simulated GPU of --cpu-dry-run
DRY_TOTAL = 16 << 30
MIB = 1 << 20
GIB = 1 << 30


# ---------------------------------------------------------------------------------------------
# What runs in the workers. Module-level functions of __main__: isorun sends them by value
# (cloudpickle), so each imports what it needs itself. `dry` swaps PyTorch on CUDA for NumPy.


def hold_memory(nbytes: int, hold_s: float, dry: bool) -> dict:
    """Holds `nbytes` on the device for `hold_s` seconds; returns when it held it."""
    import os
    import time

    if dry:
        import numpy as np

        buf: Any = np.ones(nbytes, dtype=np.uint8)
        seen_total = 0
    else:
        import torch

        buf = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
        buf.fill_(1)  # touched, not only reserved
        torch.cuda.synchronize()
        seen_total = torch.cuda.mem_get_info()[1]  # the cap, as the worker's framework sees the device
    t0 = time.time()
    time.sleep(hold_s)
    t1 = time.time()
    del buf
    return {"pid": os.getpid(), "t0": t0, "t1": t1, "seen_total": seen_total}


def assert_or_sum(bad: bool, dry: bool) -> float:
    """bad: trips a device-side assert (an out-of-bounds index on the GPU); else a healthy sum (4.0)."""
    if dry:
        import numpy as np

        if bad:
            raise RuntimeError("CUDA error: device-side assert triggered (CPU stand-in)")
        return float(np.ones(4).sum())
    import torch

    if bad:
        x = torch.zeros(4, device="cuda")
        y = x[torch.tensor([10], device="cuda")]  # the index kernel asserts; the error shows at the sync
        torch.cuda.synchronize()
        return float(y.sum())
    return float(torch.ones(4, device="cuda").sum())


def cuda_tensor(dry: bool) -> Any:
    """A result that lives on the GPU: [0, 2, 4, 6]."""
    if dry:
        import numpy as np

        return np.arange(4, dtype=np.float32) * 2
    import torch

    return torch.arange(4, device="cuda", dtype=torch.float32) * 2


def small_cuda(dry: bool) -> dict:
    """A small computation on the GPU (14.0; 6.0 dry), and how the worker came to be."""
    import os

    import isorun._worker

    framework = "numpy" if dry else "torch"
    preloaded = framework in isorun._worker.modules_at_entry
    # /proc/self/environ is the environment block the process was exec'd with, which a fork copies:
    # a worker forked from the zygote still shows the zygote's ISORUN_PY_ZYGOTE=1 there, although
    # Python removed it from os.environ; an exec'd worker never had it.
    with open("/proc/self/environ", "rb") as f:
        forked = b"\0ISORUN_PY_ZYGOTE=1\0" in b"\0" + f.read()
    # Seconds since this process began (its fork or exec): an exec'd worker spends its imports here.
    with open("/proc/self/stat") as f:
        start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
    with open("/proc/uptime") as f:
        age = float(f.read().split()[0]) - start_ticks / os.sysconf("SC_CLK_TCK")
    if dry:
        import numpy as np

        value = float(np.arange(4.0).sum())
    else:
        import torch

        a = torch.arange(4.0, device="cuda")
        value = float(a @ a)
    return {"pid": os.getpid(), "value": value, "preloaded": preloaded, "forked": forked, "age": age}


def sleep_forever() -> None:
    """The hang of the hidden hang-selftest check."""
    import threading

    threading.Event().wait()


# ---------------------------------------------------------------------------------------------
# The checks, each run in a child process (`--child NAME`). Each returns (status, detail).


def _one_line(text: str, limit: int = 240) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _describe_exception(exc: BaseException) -> str:
    kind = type(exc)
    outcome = getattr(exc, "outcome", None) or getattr(exc, "isorun_outcome", None)
    how = f" [outcome {outcome.kind}, signal {outcome.signal}, exit {outcome.exit_code}]" if outcome else ""
    return f"{kind.__module__}.{kind.__qualname__}: {_one_line(str(exc), 160)}{how}"


class _Sampler(threading.Thread):
    """Samples, until stopped, the used memory of every GPU (from outside the workers: NVML or
    nvidia-smi, as another process would see it) and how many calls the executor runs."""

    def __init__(self, read: Optional[Callable[[], list]], executor: Any) -> None:
        super().__init__(daemon=True)
        self.read, self.executor = read, executor
        self.stop_event = threading.Event()
        self.peak_used: list[int] = []
        self.totals: list[int] = []
        self.samples = 0
        self.max_running = 0
        self.error = ""

    def run(self) -> None:
        while not self.stop_event.is_set():
            self.max_running = max(self.max_running, self.executor.running)
            if self.read is not None:
                try:
                    mem = self.read()
                except Exception as exc:  # noqa: BLE001 - said in the check's detail
                    self.error = _one_line(f"{type(exc).__name__}: {exc}")
                    mem = []
                if mem:
                    if not self.peak_used:
                        self.peak_used, self.totals = [0] * len(mem), [t for _, t in mem]
                    self.peak_used = [max(p, u) for p, (u, _) in zip(self.peak_used, mem)]
                    self.samples += 1
            self.stop_event.wait(0.01)


def _memory_reader() -> tuple[Callable[[], list], str]:
    """A function giving [(used, total)] bytes per GPU, through pynvml where importable."""
    try:
        import pynvml  # type: ignore[import-not-found]

        pynvml.nvmlInit()
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]

        def nvml() -> list:
            return [(m.used, m.total) for m in (pynvml.nvmlDeviceGetMemoryInfo(h) for h in handles)]

        nvml()
        return nvml, "NVML"
    except Exception:  # noqa: BLE001 - not installed, or no NVML through it: nvidia-smi instead
        pass

    def smi() -> list:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used,memory.total", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10, check=True).stdout
        return [(int(u) * MIB, int(t) * MIB) for u, t in (line.split(",") for line in out.strip().splitlines())]

    smi()
    return smi, "nvidia-smi"


def _max_overlap(intervals: list[tuple[float, float]]) -> int:
    events = sorted([(t0, 1) for t0, _ in intervals] + [(t1, -1) for _, t1 in intervals])
    now = best = 0
    for _, step in events:  # at equal times the end (-1) sorts first: touching holds do not overlap
        now += step
        best = max(best, now)
    return best


def check_executor_oversubscribe(dry: bool) -> tuple[str, str]:
    import isorun

    if dry:
        read, source = None, "not sampled (dry run: a simulated GPU)"
        gpus = [(0, DRY_TOTAL)]
    else:
        read, source = _memory_reader()
        gpus = read()
    # About three caps fit in the free memory of each GPU (the executor packs by free memory),
    # with a GiB to spare for what else holds the device.
    free = min(t - u for u, t in gpus)
    cap = max(((free - GIB) // 3) // (256 * MIB) * (256 * MIB), 256 * MIB)
    # Most of the cap, less room for the worker's CUDA context and torch's own (the cap counts them).
    hold = 8 * MIB if dry else min(int(cap * 0.8), cap - 1536 * MIB)
    n_calls = 9 * len(gpus)
    failures: list[str] = []
    ran: list[dict] = []
    with isorun.Executor(gpus="all", mem_limit=cap) as ex:
        plan = ex.plan
        sampler = _Sampler(read, ex)
        sampler.start()
        try:
            futures = [ex.submit(hold_memory, hold, 0.5, dry) for _ in range(n_calls)]
            for fut in futures:
                try:
                    ran.append(fut.result())
                except Exception as exc:  # noqa: BLE001 - every failure is said
                    failures.append(_describe_exception(exc))
        finally:
            sampler.stop_event.set()
            sampler.join()
    overlap = _max_overlap([(r["t0"], r["t1"]) for r in ran])
    seen = {r["seen_total"] // MIB for r in ran}
    if dry:
        memory = f"device memory {source}"
    else:
        peaks = ", ".join(f"GPU {i}: {p // MIB} of {t // MIB} MiB" for i, (p, t) in
                          enumerate(zip(sampler.peak_used, sampler.totals)))
        base = ", ".join(f"{u // MIB}" for u, _ in gpus)
        memory = f"peak used {peaks or 'none'} (before the calls {base} MiB; {source}, {sampler.samples} samples)"
    detail = (f"{len(ran)}/{n_calls} calls of mem_limit {cap // MIB} MiB, each holding {hold // MIB} MiB for 0.5 s, "
              f"plan '{plan}'; {memory}; max concurrency {overlap} (holds overlapping), executor.running max "
              f"{sampler.max_running}" + ("" if dry else f"; the workers' torch saw a device of {sorted(seen)} MiB"))
    if failures:
        return "FAIL", f"{len(failures)} call(s) failed, the first: {failures[0]}; {detail}"
    if not dry:
        if sampler.samples == 0:
            return "FAIL", f"no memory sample was taken ({sampler.error or 'no reading'}); {detail}"
        over = [i for i, (p, t) in enumerate(zip(sampler.peak_used, sampler.totals)) if p > t]
        if over:
            return "FAIL", f"used memory exceeded the total on GPU(s) {over}; {detail}"
        # What the calls added, as the driver counts it, within the caps that fit at once: each
        # worker (its context included) stayed under its cap, and no more caps ran than fit.
        fit = free // cap
        grew = [(i, p - u) for i, (p, (u, _)) in enumerate(zip(sampler.peak_used, gpus)) if p - u > fit * cap]
        if grew:
            return "FAIL", (f"the calls added more than {fit} caps ({fit * cap // MIB} MiB) of used memory on GPU(s) "
                            f"{', '.join(f'{i} (+{g // MIB} MiB)' for i, g in grew)}; {detail}")
    return "PASS", detail


def check_device_assert(dry: bool) -> tuple[str, str]:
    import isorun

    f = isorun.isolated(assert_or_sum, gpu=0, mem_limit="2G")
    t = time.monotonic()
    bad = f.try_call(True, dry)  # a Result: its exception is what calling f would raise here
    t_bad = time.monotonic() - t
    if bad.ok:
        return "FAIL", f"the out-of-bounds CUDA index raised nothing: the call returned {bad.value!r}"
    exc = bad.exception
    assert exc is not None
    # Classified: one of isorun's exceptions, or the function's own re-raised with the worker's
    # traceback (isorun sets remote_traceback on it).
    if not (isinstance(exc, isorun.Error) or hasattr(exc, "remote_traceback")):
        return "FAIL", f"an unclassified exception in the caller: {_describe_exception(exc)}"
    said = "" if "assert" in str(exc) else " (its message does not mention the assert)"
    t = time.monotonic()
    good = f.try_call(False, dry)
    t_good = time.monotonic() - t
    first = f"the assert raised {_describe_exception(exc)} in the caller after {t_bad:.1f} s{said}"
    if good.exception is not None:
        return "FAIL", f"{first}; then the healthy call failed: {_describe_exception(good.exception)}"
    if good.value != 4.0:
        return "FAIL", f"{first}; then the healthy call returned {good.value!r}, not 4.0"
    return "PASS", f"{first}; the next call of the same function returned 4.0 after {t_good:.1f} s"


def check_cuda_tensor_result(dry: bool) -> tuple[str, str]:
    import isorun

    f = isorun.isolated(cuda_tensor, gpu=0, mem_limit="2G")
    t = time.monotonic()
    r = f.try_call(dry)
    took = time.monotonic() - t
    if not r.ok:
        exc = r.exception
        assert exc is not None
        if not str(exc).strip():
            return "FAIL", f"an error without a message after {took:.1f} s: {_describe_exception(exc)}"
        return "PASS", f"a clear error after {took:.1f} s: {_describe_exception(exc)}"
    value = r.value
    kind = f"{type(value).__module__}.{type(value).__qualname__}"
    device = str(getattr(value, "device", "cpu"))
    values = [float(v) for v in value.tolist()]
    if values != [0.0, 2.0, 4.0, 6.0]:
        return "FAIL", f"a {kind} on {device} with the wrong values {values} after {took:.1f} s"
    if device.startswith("cuda"):
        return "PASS", (f"the caller got a CUDA tensor, on its own {device} ({kind}, values right, {took:.1f} s): "
                        "unpickling re-created it on the caller's GPU, so the caller now holds a CUDA context "
                        "(neither an error nor a CPU copy)")
    return "PASS", f"a CPU copy ({kind} on {device}, values right) after {took:.1f} s"


def check_zygote(dry: bool) -> tuple[str, str]:
    import isorun

    framework = "numpy" if dry else "torch"
    f = isorun.isolated(small_cuda, gpu=0, mem_limit="2G", start="zygote", preload=[framework])
    try:
        t = time.monotonic()
        f.warm_up()  # returns once the zygote has imported the preload (or failed to)
        ready = time.monotonic() - t
        runs, took = [], []
        for _ in range(3):
            t = time.monotonic()
            runs.append(f(dry))
            took.append(time.monotonic() - t)
    finally:
        isorun.stop_standby()  # the zygote too
    expected = 6.0 if dry else 14.0
    wrong = [r["value"] for r in runs if r["value"] != expected]
    forked = sum(r["forked"] for r in runs)
    ages = ", ".join(f"{r['age']:.2f}" for r in runs)
    detail = (f"zygote ready in {ready:.1f} s; {len(runs)} calls in {', '.join(f'{s:.2f}' for s in took)} s, "
              f"{forked}/{len(runs)} in forked workers (their age at the call "
              f"{ages} s), {framework} imported before the call in "
              f"{sum(r['preloaded'] for r in runs)}/{len(runs)}")
    if wrong:
        return "FAIL", f"wrong values {wrong} (expected {expected}); {detail}"
    if not forked:
        return "FAIL", f"no call ran in a forked worker: isorun fell back to exec'd ones (see stderr); {detail}"
    return "PASS", detail


def check_standby(dry: bool) -> tuple[str, str]:
    import isorun

    framework = "numpy" if dry else "torch"
    timed_calls = 3
    # Each standby interpreter serves one call, and its replacement imports torch for seconds: one
    # interpreter per call (and one for the first, untimed call) keeps every timed call warm.
    f = isorun.isolated(small_cuda, gpu=0, mem_limit="2G", standby=timed_calls + 1, preload=[framework],
                        warm_context=True)
    try:
        f.warm_up()  # returns once they are launched, not once they have imported torch
        t = time.monotonic()
        first = f(dry)  # waits for its interpreter's imports; the others, launched with it, are about as far
        first_ms = (time.monotonic() - t) * 1e3
        time.sleep(1.0)  # the others finish their imports and contexts
        runs, ms = [first], []
        for _ in range(timed_calls):
            time.sleep(0.05)
            t = time.monotonic()
            runs.append(f(dry))
            ms.append((time.monotonic() - t) * 1e3)
    finally:
        isorun.stop_standby()
    expected = 6.0 if dry else 14.0
    median = statistics.median(ms)
    each = ", ".join(f"{m:.1f}" for m in ms)
    detail = (f"median {median:.1f} ms of {timed_calls} warm calls 50 ms apart ({each} ms; "
              f"bench goal <= 20 ms {'met' if median <= 20 else 'NOT met'}); first call {first_ms:.0f} ms after "
              f"warm_up; {framework} imported before the call in {sum(r['preloaded'] for r in runs)}/{len(runs)}")
    wrong = [r["value"] for r in runs if r["value"] != expected]
    if wrong:
        return "FAIL", f"wrong values {wrong} (expected {expected}); {detail}"
    return "PASS", detail


def check_hang_selftest(dry: bool) -> tuple[str, str]:
    """Hidden: a call that never returns, to see the harness report a hang (never run by default)."""
    import isorun

    isorun.isolated(sleep_forever, gpu=0, mem_limit="1G")()
    return "FAIL", "the call that sleeps forever returned"


class Check(NamedTuple):
    name: str
    limit_s: float  # wall-clock limit of its child process
    run: Callable[[bool], tuple[str, str]]


CHECKS = [
    Check("executor-oversubscribe", 35, check_executor_oversubscribe),
    Check("device-assert-then-healthy", 20, check_device_assert),
    Check("cuda-tensor-result", 15, check_cuda_tensor_result),
    Check("zygote-gpu", 20, check_zygote),
    Check("standby-torch", 25, check_standby),
]
HIDDEN = [Check("hang-selftest", 8, check_hang_selftest)]


def child_main(name: str, result_path: str, dry: bool) -> int:
    # The parent sends SIGUSR1 before it kills a hung check: every thread's Python stack to stderr.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    check = next(c for c in CHECKS + HIDDEN if c.name == name)
    try:
        status, detail = check.run(dry)
    except Exception as exc:  # noqa: BLE001 - the check failed; its traceback goes to stderr
        traceback.print_exc()
        status, detail = "FAIL", f"the check raised {_describe_exception(exc)}"
    # Written whole (renamed into place) before the process exits: a hang at exit still has it.
    with open(result_path + ".tmp", "w") as f:
        json.dump({"status": status, "detail": _one_line(detail, 1000)}, f)
    os.replace(result_path + ".tmp", result_path)
    return 0


# ---------------------------------------------------------------------------------------------
# The harness: finds the GPU, runs each check in a child under its limit, reports.


def _read(path: str, binary: bool = False) -> Any:
    try:
        with open(path, "rb" if binary else "r") as f:
            return f.read()
    except OSError as exc:
        return b"" if binary else f"({exc.strerror})"


def _processes() -> dict[int, tuple[int, str, str]]:
    """pid: (ppid, state, comm) of every process."""
    out = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            stat = _read(f"/proc/{entry}/stat")
            if not stat.startswith(f"{entry} ("):
                continue  # gone since the listing (the error's text)
            head, tail = stat.rsplit(")", 1)
            fields = tail.split()
            out[int(entry)] = (int(fields[1]), fields[0], head.split("(", 1)[1])
    return out


def _involved(root: int, tag: str) -> list[int]:
    """The check's process, its descendants (through /proc/*/stat's ppid), and any other live
    process carrying its tag (a worker left behind, or re-parented): root first."""
    procs = _processes()
    found, queue = [root], [root]
    while queue:
        parent = queue.pop()
        for pid, (ppid, _, _) in procs.items():
            if ppid == parent and pid not in found:
                found.append(pid)
                queue.append(pid)
    marker = f"{TAG_ENV}={tag}".encode()
    for pid, (_, state, _) in procs.items():
        if pid not in found and state not in "ZX" and marker in _read(f"/proc/{pid}/environ", binary=True):
            found.append(pid)
    return found


def _describe_process(pid: int) -> list[str]:
    procs = _processes()
    if pid not in procs:
        return [f"  pid {pid}: gone"]
    ppid, state, comm = procs[pid]
    cmd = _one_line(_read(f"/proc/{pid}/cmdline", binary=True).replace(b"\0", b" ").decode(errors="replace"), 160)
    lines = [f"  pid {pid} ({comm}) state {state} ppid {ppid} wchan={_read(f'/proc/{pid}/wchan') or '0'}: {cmd}"]
    # Every thread's wait channel, counted: a thread in the driver stands out among futex waits.
    waits: dict[str, int] = {}
    try:
        tids = sorted(os.listdir(f"/proc/{pid}/task"))
    except OSError:
        tids = []
    for tid in tids:
        w = _read(f"/proc/{pid}/task/{tid}/wchan") or "0"
        waits[w] = waits.get(w, 0) + 1
    lines.append(f"    threads: {sum(waits.values())}: " + ", ".join(f"{w} x{n}" for w, n in sorted(waits.items())))
    stack = _read(f"/proc/{pid}/stack")
    lines.append("    kernel stack:" + ("".join(f"\n      {s}" for s in stack.splitlines()) if stack.strip()
                                        else f" {stack.strip() or '(empty)'}"))
    return lines


def _hang_report(proc: subprocess.Popen, tag: str, err_path: str) -> list[str]:
    """Before killing a hung check: its processes' /proc state, then their Python stacks."""
    pids = _involved(proc.pid, tag)
    lines = ["  processes (the check first), before any signal:"]
    for pid in pids:
        lines += _describe_process(pid)
    before = _read(err_path, binary=True).decode(errors="replace").splitlines()
    lines.append("  the check's stderr before the signals (last lines):")
    lines += [f"    {s}" for s in before[-30:]] or ["    (nothing)"]
    mark = len(_read(err_path, binary=True))
    procs = _processes()
    pythons = [p for p in pids[1:] if b"python" in _read(f"/proc/{p}/cmdline", binary=True)]
    try:
        os.kill(proc.pid, signal.SIGUSR1)  # its faulthandler.register: every thread's stack
        time.sleep(0.5)
        # isorun's workers have faulthandler enabled: SIGABRT prints their stacks (to their stderr,
        # which the check echoes to its own) as it ends them.
        for pid in pythons:
            os.kill(pid, signal.SIGABRT)
        time.sleep(1.5 if pythons else 0)
    except ProcessLookupError:
        pass
    for pid in reversed(pids):  # the processes this check started, and it: nothing else
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        lines.append(f"  the check's process {proc.pid} did not die within 10 s of SIGKILL "
                     f"(state {procs.get(proc.pid, (0, '?', ''))[1]})")
    stacks = _read(err_path, binary=True)[mark:].decode(errors="replace").splitlines()
    lines.append(f"  Python stacks (SIGUSR1 to the check, SIGABRT to {len(pythons)} python process(es) of it), "
                 "from the check's stderr:")
    lines += [f"    {s}" for s in stacks[-200:]] or ["    (nothing)"]
    return lines


def _left_behind(tag: str) -> tuple[int, list[str]]:
    """After the check's process exited: its processes still alive 2 s on, killed; (how many,
    their description)."""
    marker = f"{TAG_ENV}={tag}".encode()
    deadline = time.monotonic() + 2
    while True:
        left = [pid for pid, (_, state, _) in _processes().items()
                if state not in "ZX" and marker in _read(f"/proc/{pid}/environ", binary=True)]
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    lines = []
    for pid in left:
        lines += _describe_process(pid)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return len(left), lines


def _tail(path: str, n: int = 30) -> list[str]:
    return [f"    {s}" for s in _read(path, binary=True).decode(errors="replace").splitlines()[-n:]]


def run_check(check: Check, limit: float, env: dict[str, str], dry: bool, workdir: str) -> tuple[str, str, list[str]]:
    """(status, detail, lines to print under it) of one check, run in a child under `limit` s."""
    result_path = os.path.join(workdir, f"{check.name}.json")
    out_path, err_path = (os.path.join(workdir, f"{check.name}.{s}") for s in ("out", "err"))
    tag = f"{check.name}-{uuid.uuid4().hex[:12]}"
    cmd = [sys.executable, os.path.abspath(__file__), "--child", check.name, "--result", result_path]
    if dry:
        cmd.append("--cpu-dry-run")
    # Output to files, not pipes: a worker that outlives the check cannot hold the harness up.
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=err, env={**env, TAG_ENV: tag},
                                start_new_session=True)
    t = time.monotonic()
    try:
        rc = proc.wait(timeout=limit)
    except subprocess.TimeoutExpired:
        # Read before the stack dumps: a worker ended by them may let the check go on to a result.
        written = json.loads(_read(result_path)) if os.path.exists(result_path) else None
        after = f" at exit, after its result ({written['status']}: {written['detail']})" if written else ""
        return "FAIL", f"hung after {limit:.0f} s{after}", _hang_report(proc, tag, err_path)
    took = time.monotonic() - t
    n_left, left = _left_behind(tag)
    note = f"; {n_left} process(es) of it outlived it by 2 s (killed, described below)" if n_left else ""
    if not os.path.exists(result_path):
        how = f"signal {-rc}" if rc < 0 else f"status {rc}"
        return "FAIL", f"its process ended ({how}) after {took:.1f} s without a result{note}", \
            ["  its stderr (last lines):", *_tail(err_path)] + left
    result = json.loads(_read(result_path))
    status, detail = result["status"], f"{result['detail']} [{took:.1f} s]{note}"
    if rc != 0:
        how = f"signal {-rc}" if rc < 0 else f"status {rc}"
        status, detail = "FAIL", f"its process ended with {how} after its result ({result['status']}: {detail})"
    lines = left + (["  its stderr (last lines):", *_tail(err_path)] if status == "FAIL" else [])
    return status, detail, lines


def _gpu_missing() -> Optional[str]:
    """Why there is no GPU to check here, or None; and says what there is."""
    if shutil.which("nvidia-smi") is None:
        return "no nvidia-smi: no NVIDIA GPU here"
    try:
        r = subprocess.run(["nvidia-smi", "--query-gpu=index,name,driver_version,memory.total",
                            "--format=csv,noheader"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"nvidia-smi failed: {exc}"
    if r.returncode != 0 or not r.stdout.strip():
        return f"nvidia-smi failed (status {r.returncode}): {_one_line(r.stderr or r.stdout, 160)}"
    for line in r.stdout.strip().splitlines():
        print(f"gpu-python-check: GPU {line.strip()}")
    return None


PROBE = r"""
import json, sys
out = {"python": sys.version.split()[0]}
try:
    import isorun, isorun._core
    out["isorun"] = f"isorun {isorun.__version__} from {isorun.__file__}"
except Exception as e:
    out["isorun_error"] = f"{type(e).__name__}: {e}"
framework = sys.argv[1]
try:
    mod = __import__(framework)
    out["framework"] = f"{framework} {mod.__version__}"
    if framework == "torch":
        out["framework"] += f" (CUDA {mod.version.cuda})"
        out["cuda"] = bool(mod.cuda.is_available())
except Exception as e:
    out["framework_error"] = f"{type(e).__name__}: {e}"
print(json.dumps(out))
"""


def _probe(env: dict[str, str], dry: bool, limit: float) -> tuple[Optional[str], Optional[str]]:
    """(skip reason, fail reason) from what a child python imports: isorun, and torch with CUDA
    (numpy in a dry run). Run in a child: the first import of torch can be slow, and hang."""
    framework = "numpy" if dry else "torch"
    try:
        r = subprocess.run([sys.executable, "-c", PROBE, framework], capture_output=True, text=True, env=env,
                           timeout=limit)
        found = json.loads(r.stdout.strip().splitlines()[-1])
    except subprocess.TimeoutExpired:
        return None, f"importing isorun and {framework} took more than {limit:.0f} s"
    except (ValueError, IndexError):
        return None, f"the probe of isorun and {framework} failed: {_one_line(r.stderr, 300)}"
    print("gpu-python-check: python " + ", ".join(found[k] for k in ("python", "framework", "isorun") if k in found))
    if "framework_error" in found:
        return f"{framework} is not importable: {found['framework_error']}", None
    if not dry and not found.get("cuda"):
        return f"{found['framework']} has no CUDA here (torch.cuda.is_available() is False)", None
    if "isorun_error" in found:
        # The GPU is there, the package is not: this run checks nothing, and must not pass for a check.
        return None, ("this python cannot import the isorun package (PYTHONPATH=$BUILD/python?): "
                      f"{found['isorun_error']}")
    return None, None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checks", default=",".join(c.name for c in CHECKS),
                    help="comma-separated checks to run (default: all, in order)")
    ap.add_argument("--budget", type=float, default=90.0,
                    help="seconds for the whole run; a check that would start with less than 8 left is skipped")
    ap.add_argument("--cpu-dry-run", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child_main(args.child, args.result, args.cpu_dry_run)

    known = {c.name: c for c in CHECKS + HIDDEN}
    names = [n for n in args.checks.split(",") if n]
    unknown = [n for n in names if n not in known]
    if unknown:
        ap.error(f"unknown check(s) {', '.join(unknown)}; the checks: {', '.join(c.name for c in CHECKS)}")
    checks = [known[n] for n in names]
    deadline = time.monotonic() + args.budget
    dry = args.cpu_dry_run

    env = dict(os.environ)
    if dry:
        env["ISORUN_SIMULATE_GPUS"] = DRY_GPUS
        print(f"gpu-python-check: --cpu-dry-run: a simulated GPU ({DRY_GPUS}), NumPy in place of PyTorch")
        skip = None
    else:
        env.pop("ISORUN_SIMULATE_GPUS", None)  # the real GPU, whatever the shell had
        skip = _gpu_missing()
    fail = None
    if skip is None:
        skip, fail = _probe(env, dry, min(45.0, max(deadline - time.monotonic(), 1.0)))

    counts = {"PASS": 0, "FAIL": 0, "SKIP": 0}

    def report(status: str, name: str, detail: str, lines: Optional[list[str]] = None) -> None:
        counts[status] += 1
        print(f"{status} {name}: {detail}", flush=True)
        for line in lines or []:
            print(line, flush=True)

    with tempfile.TemporaryDirectory(prefix="gpu-python-check-") as workdir:
        for check in checks:
            left = deadline - time.monotonic()
            if skip or fail:
                report("SKIP" if skip else "FAIL", check.name, skip or fail or "")
            elif left < 8:
                report("SKIP", check.name, f"not run: the {args.budget:.0f} s budget is spent")
            else:
                status, detail, lines = run_check(check, min(check.limit_s, left), env, dry, workdir)
                report(status, check.name, detail, lines)
    print(f"== {counts['PASS']} passed, {counts['FAIL']} failed, {counts['SKIP']} skipped", flush=True)
    return 1 if counts["FAIL"] else 0


if __name__ == "__main__":
    sys.exit(main())

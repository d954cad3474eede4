#!/usr/bin/env python3
"""Replays an allocation trace through PyTorch's CUDA caching allocator: the peer that
`alloc_replay --backend cuda` is compared with (bench/README.md, "Allocator: trace replay").

    PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True python3 bench/torch_replay.py TRACE...

TRACE is a file from `alloc_replay --write NAME FILE` ("a ID SIZE STREAM" / "f ID" lines; stream
0 only). For each trace, like alloc_replay: ns per operation (p50, p99) under a cap of 1.25x the
peak request, p99 under 1.05x, and peak reserved / peak requested. The cap is
torch.cuda.set_per_process_memory_fraction. Each operation is timed around
torch.cuda.caching_allocator_alloc/delete, so the figures include ~0.3 us of Python per call.
The allocator's configuration is read once per process: run once per PYTORCH_CUDA_ALLOC_CONF.
"""
import os
import sys
import time


def read_trace(path):
    events = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            fields = line.split()
            if not fields:
                continue
            if fields[0] == "a" and len(fields) == 4 and fields[3] == "0":
                events.append((int(fields[1]), int(fields[2])))
            elif fields[0] == "f" and len(fields) == 2:
                events.append((int(fields[1]), 0))
            else:
                sys.exit(f"torch_replay: {path}:{n}: expected 'a ID SIZE 0' or 'f ID', got {line.strip()!r}")
    return events


def peak_requested(events):
    live, peak, size = 0, 0, {}
    for ident, n in events:
        if n:
            size[ident] = n
            live += n
            peak = max(peak, live)
        else:
            live -= size.pop(ident)
    return peak


def percentile(values, q):
    values = sorted(values)
    return values[int(q * (len(values) - 1))] if values else 0


def replay(torch, events, cap):
    """ns per operation, or None if the trace ran out of memory under `cap`; peak stats."""
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(min(1.0, cap / total), 0)
    ptr, ns = {}, []
    clock = time.perf_counter_ns
    try:
        for ident, n in events:
            t0 = clock()
            if n:
                ptr[ident] = torch.cuda.caching_allocator_alloc(n, 0)
            else:
                torch.cuda.caching_allocator_delete(ptr.pop(ident))
            ns.append(clock() - t0)
    except torch.cuda.OutOfMemoryError:
        ns = None
    for p in ptr.values():
        torch.cuda.caching_allocator_delete(p)
    stats = torch.cuda.memory_stats(0)
    return ns, stats.get("reserved_bytes.all.peak", 0), stats.get("requested_bytes.all.peak", 0)


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    import torch

    if not torch.cuda.is_available():
        sys.exit("torch_replay: no CUDA device visible to PyTorch")
    conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "") or "(default)"
    print(f"PyTorch {torch.__version__}, PYTORCH_CUDA_ALLOC_CONF={conf}")
    print(f"  {'trace':<22} {'p50 ns':>8} {'p99 ns':>8} {'p99@1.05x ns':>12} {'reserved/requested':>19}")
    for path in sys.argv[1:]:
        events = read_trace(path)
        peak = peak_requested(events)
        ns, reserved, requested = replay(torch, events, 1.25 * peak)
        tight, _, _ = replay(torch, events, 1.05 * peak)
        if ns is None:
            print(f"  {os.path.basename(path):<22} out of memory under 1.25x the peak request")
            continue
        p99_tight = f"{percentile(tight, 0.99):12.0f}" if tight is not None else f"{'out of memory':>12}"
        ratio = reserved / requested if requested else 0
        print(f"  {os.path.basename(path):<22} {percentile(ns, 0.5):8.0f} {percentile(ns, 0.99):8.0f} {p99_tight} {ratio:19.4f}")


if __name__ == "__main__":
    main()

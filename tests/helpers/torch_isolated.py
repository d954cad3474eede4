"""PyTorch through the isorun package on GPU 0 (tools/gpu-check.sh): a function under
mem_limit="2G" sees a 2 GiB device and raises isorun.OutOfMemory past it; a warm standby
interpreter with preload=["torch"] serves a CUDA call with torch imported and its context made
before the call. Prints one JSON line."""

import json

import isorun


def device_total():
    import torch

    return torch.cuda.mem_get_info()[1]


def too_much():
    import torch

    return torch.empty(3 << 30, dtype=torch.uint8, device="cuda").numel()


def trivial():
    import isorun._worker
    import torch

    return {"sum": float(torch.ones(4, device="cuda").sum()),
            "torch_at_entry": "torch" in isorun._worker.modules_at_entry}


if __name__ == "__main__":
    out = {"total": isorun.isolated(device_total, gpu=0, mem_limit="2G")()}
    try:
        isorun.isolated(too_much, gpu=0, mem_limit="2G")()
        out["oom"] = "none"
    except isorun.OutOfMemory as e:
        out["oom"] = "isorun.OutOfMemory" if isinstance(e, MemoryError) else "wrong type"
    warm = isorun.isolated(trivial, gpu=0, mem_limit="2G", standby=1, preload=["torch"], warm_context=True)
    warm.warm_up()
    out["warm"] = warm()
    isorun.stop_standby()
    print(json.dumps(out))

"""PyTorch under `isorun --gpu 0 --mem-limit 2G -- python3 torch_cap.py` (tools/gpu-check.sh):
prints one JSON line with what the program saw of the cap."""
import json
import os
import subprocess

import torch

free, total = torch.cuda.mem_get_info()
out = {"total": total, "free": free}
try:
    big = torch.empty(3 << 30, dtype=torch.uint8, device="cuda")
    out["oom"] = False
    del big
except torch.OutOfMemoryError:
    out["oom"] = True

# A normal training step still runs under the cap.
model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 10)).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.randn(256, 1024, device="cuda")
y = torch.randint(0, 10, (256,), device="cuda")
loss = torch.nn.functional.cross_entropy(model(x), y)
loss.backward()
opt.step()
torch.cuda.synchronize()
out["loss"] = float(loss)
out["max_reserved"] = torch.cuda.max_memory_reserved()

# What the driver says this process uses (nvidia-smi), in MiB.
smi = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                     capture_output=True, text=True).stdout
out["used_mib"] = next((int(u) for p, u in (l.split(",") for l in smi.splitlines() if l.strip())
                        if int(p) == os.getpid()), -1)
print(json.dumps(out))

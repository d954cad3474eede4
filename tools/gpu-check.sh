#!/usr/bin/env bash
# The GPU checks, with a pass/fail summary, on a machine with an NVIDIA driver and a built tree
# (tools/build.sh here, or a tree that ../shared/gpu/run.sh unpacked on a GPU machine):
#   tools/gpu-check.sh            (build folder: $ISORUN_BUILD_DIR, else build/)
# Runs each gpu-labelled test case on its own, then the command-line checks a new user would
# try, and checks the figures the tests report (context size, device memory under the cap,
# memory release times) against their goals. Exit status 0 only if everything passed.
set -uo pipefail
unset ISORUN_SIMULATE_GPUS
root=$(cd "$(dirname "$0")/.." && pwd)
build=${ISORUN_BUILD_DIR:-$root/build}
bin=$build/bin
log=$(mktemp -d /tmp/isorun-gpu-check-XXXXXX)
trap 'rm -rf "$log"' EXIT
declare -a summary
failed=0
skipped=0

record() {  # record NAME PASS|FAIL|SKIP [DETAIL]
  summary+=("$(printf '%-4s %s%s' "$2" "$1" "${3:+  ($3)}")")
  case $2 in
    PASS) ;;
    SKIP) skipped=$((skipped + 1)) ;;
    *) failed=$((failed + 1)) ;;
  esac
}

if ! "$bin/isorun" gpus | grep -q '^GPU inventory: NVML'; then
  echo "gpu-check: no GPU found through NVML; nothing to check here"; exit 77
fi
"$bin/isorun" gpus
uuid=$("$bin/isorun" gpus --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["gpus"][0]["uuid"])')

# 1. Every gpu-labelled test case, one by one (its figures go to the log).
while IFS= read -r name; do
  [ -n "$name" ] || continue
  # A comma separates test specs for Catch2, so escape it; --warn NoTests fails a name that
  # matched nothing instead of passing it without running anything.
  if "$bin/test_gpu" --warn NoTests "${name//,/\\,}" > "$log/case.out" 2>&1 &&
     grep -q 'in 1 test case' "$log/case.out"; then record "test: $name" PASS; else
    record "test: $name" FAIL "see output below"; echo "---- $name"; tail -40 "$log/case.out"; fi
  cat "$log/case.out" >> "$log/all.out"
done < <("$bin/test_gpu" --list-test-names-only)

# 2. What a new user types.
if out=$("$bin/isorun" --gpu 0 --mem-limit 2G digits 2> "$log/digits.err") &&
   python3 -c 'import json,sys; r=json.loads(sys.argv[1]); assert r["device"]=="cuda:"+sys.argv[2] and r["accuracy"]>=0.95, r' "$out" "$uuid" 2>> "$log/digits.err"; then
  record "isorun --gpu 0 --mem-limit 2G digits" PASS "$(python3 -c 'import json,sys; print("accuracy %.4f" % json.loads(sys.argv[1])["accuracy"])' "$out")"
else
  record "isorun --gpu 0 --mem-limit 2G digits" FAIL "$(tail -1 "$log/digits.err")"
fi

# 3. The cap for any program: PyTorch under --mem-limit 2G sees a 2 GiB GPU, gets its own OOM
#    error past it, still trains, and the driver's count for it stays under the cap.
if python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2> /dev/null; then
  if out=$("$bin/isorun" --gpu 0 --mem-limit 2G -- python3 "$root/tests/helpers/torch_cap.py" 2> "$log/torch.err") &&
     python3 -c 'import json,sys; r=json.loads(sys.argv[1]); assert r["total"] <= 2<<30 and r["oom"] and 0 <= r["used_mib"] <= 2048, r' "$out" 2>> "$log/torch.err"; then
    record "PyTorch under --mem-limit 2G -- python3" PASS "$(python3 -c 'import json,sys; r=json.loads(sys.argv[1]); print("mem_get_info total %d MiB, 3 GiB refused, step ran, nvidia-smi %d MiB" % (r["total"]>>20, r["used_mib"]))' "$out")"
  else
    record "PyTorch under --mem-limit 2G -- python3" FAIL "$(tail -3 "$log/torch.err" | tr '\n' ' ')"
  fi
  # 3b. A memory timeline for any program: the same PyTorch script's page shows what it held
  #     against the cap and, at the 3 GiB the cap refused, who held what.
  if "$bin/isorun" -q --gpu 0 --mem-limit 2G --memory-timeline "$log/torch.html" -- python3 "$root/tests/helpers/torch_cap.py" \
       > /dev/null 2> "$log/torch-timeline.err" &&
     grep -q 'class="reserved"' "$log/torch.html" && grep -q 'by process, largest first' "$log/torch.html"; then
    record "--memory-timeline with PyTorch under --mem-limit 2G" PASS "$(grep -o '[0-9]* events' "$log/torch.html" | head -1)"
  else
    record "--memory-timeline with PyTorch under --mem-limit 2G" FAIL "$(tail -3 "$log/torch-timeline.err" | tr '\n' ' ')"
  fi
  # 4. A sweep over a command: the Python example, every trial with PyTorch on GPU 0 under the cap.
  if (cd "$root" && "$bin/isorun" sweep examples/python/sweep.yaml --gpus 0 --mem-limit 2G --out "$log/pysweep" \
        --no-progress > "$log/pysweep.out" 2> "$log/pysweep.err") &&
     python3 -c 'import json,sys; rs=[json.loads(l) for l in open(sys.argv[1])]; assert len(rs)==8 and all(r["outcome"]=="success" and r["result"]["device"]=="cuda" and r["device"]!="cpu" for r in rs), rs' "$log/pysweep/results.jsonl" 2>> "$log/pysweep.err"; then
    record "isorun sweep examples/python/sweep.yaml --gpus 0 --mem-limit 2G" PASS "$(python3 -c 'import json,sys; rs=[json.loads(l) for l in open(sys.argv[1])]; print("8/8 on the GPU with PyTorch, best accuracy %.3f, peak %d MiB" % (max(r["result"]["accuracy"] for r in rs), max(r["peak_reserved"] for r in rs)>>20))' "$log/pysweep/results.jsonl")"
  else
    record "isorun sweep examples/python/sweep.yaml --gpus 0 --mem-limit 2G" FAIL "$(tail -3 "$log/pysweep.err" | tr '\n' ' ')"
  fi
fi

# 4a. The cap that counts everything: each framework allocates until its own OOM error under a
# 16 GiB cap; NVML, nvidia-smi and the framework see the cap as the device; at least 95% of the
# cap (less the context) is usable; what the driver counts for the process stays under the cap.
cap=$((16 << 30))
for fw in torch-expandable cupy-async jax; do
  module=${fw%%-*}
  python3 -c "import $module" 2> /dev/null || { record "$fw under --mem-limit 16G" SKIP "no $module here"; continue; }
  if out=$("$bin/isorun" --gpu 0 --mem-limit 16G -- python3 "$root/tests/helpers/cap_frameworks.py" "$fw" 2> "$log/$fw.err") &&
     python3 -c 'import json,sys; r=json.loads(sys.argv[1]); cap=int(sys.argv[2]); assert r["nvml_total"] == cap and r["smi_total"] == cap and r["framework_total"] <= cap and r["nvml_used"] <= cap and r["smi_mine"] <= cap and (r["framework"] == "jax" or r["got"] >= 0.95 * (cap - (600 << 20))), r' "$out" "$cap" 2>> "$log/$fw.err"; then
    record "$fw under --mem-limit 16G" PASS "$(python3 -c 'import json,sys; r=json.loads(sys.argv[1]); print("got %d MiB, NVML total %d MiB, nvidia-smi %d MiB for it" % (r["got"]>>20, r["nvml_total"]>>20, r["smi_mine"]>>20))' "$out")"
  else
    record "$fw under --mem-limit 16G" FAIL "$(tail -3 "$log/$fw.err" | tr '\n' ' ')"
  fi
done

# 4b. PyTorch through the Python package (isorun.isolated), where this python3 imports it (the
# package built for this machine's Python: pip install ., or a CMake build here).
if python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2> /dev/null; then
  if ! PYTHONPATH="$build/python${PYTHONPATH:+:$PYTHONPATH}" python3 -c 'import isorun._core' 2> "$log/pkg.err"; then
    # Not isorun's failure: the package was built for another Python (build it for this one).
    record "PyTorch through import isorun" SKIP "this python3 cannot import the package: $(tail -1 "$log/pkg.err")"
  elif out=$(PYTHONPATH="$build/python${PYTHONPATH:+:$PYTHONPATH}" python3 "$root/tests/helpers/torch_isolated.py" 2> "$log/pkg.err") &&
       python3 -c 'import json,sys; r=json.loads(sys.argv[1]); assert r["total"] <= 2<<30 and r["oom"] == "isorun.OutOfMemory" and r["warm"] == {"sum": 4.0, "torch_at_entry": True}, r' "$out" 2>> "$log/pkg.err"; then
    record "PyTorch through import isorun, mem_limit=\"2G\" and a warm standby" PASS "$(python3 -c 'import json,sys; r=json.loads(sys.argv[1]); print("mem_get_info total %d MiB, 3 GiB raised isorun.OutOfMemory, warm call with torch preloaded" % (r["total"]>>20))' "$out")"
  else
    record "PyTorch through import isorun, mem_limit=\"2G\" and a warm standby" FAIL "$(tail -3 "$log/pkg.err" | tr '\n' ' ')"
  fi
fi

# 5. Figures the tests reported, against their goals.
released=0
while read -r ms what; do
  released=$((released + 1))
  if [ "$ms" -le 2000 ]; then record "memory back to baseline within 2 s after $what" PASS "${ms} ms"
  else record "memory back to baseline within 2 s after $what" FAIL "${ms} ms"; fi
done < <(sed -n 's/^gpu-check: release after \(.*\): \([0-9]*\) ms$/\2 \1/p' "$log/all.out")
# The release tests report five figures; fewer means they did not get that far.
[ "$released" -eq 5 ] || record "memory release figures reported" FAIL "$released of 5"
grep -h '^gpu-check:' "$log/all.out" | grep -v 'release after' | sed 's/^gpu-check: /     /' > "$log/figures"

echo
echo "== isorun GPU check: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)"
printf '%s\n' "${summary[@]}"
echo "figures:"; cat "$log/figures"
echo "== $((${#summary[@]} - failed - skipped)) passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]

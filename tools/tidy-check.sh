#!/usr/bin/env bash
# Runs clang-tidy (.clang-tidy's checks) over the product's sources, counts the warnings per
# check, and compares the counts with tools/tidy-baseline.txt: fails if any count grew.
#   tools/tidy-check.sh            check (prints the table; a grown check's warnings are listed)
#   tools/tidy-check.sh --update   rewrite the baseline with today's counts
# Needs clang-tidy (Debian: apt-get install clang-tidy) and a configured build: it reads
# build/compile_commands.json (or $ISORUN_BUILD_DIR's); tools/build.sh makes it. The sources are
# those of alloc/ serialization/ worker/ runner/ preload/ html/ sweep/ cli/ that the build compiles
# (not the tests, benchmarks or examples; not CUDA sources), one clang-tidy per core. A warning
# in a header counts once, however many sources include it. The full output is kept in
# <build>/tidy.log.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
update=0
if [ "${1:-}" = "--update" ]; then update=1; shift; fi
[ $# -eq 0 ] || { echo "usage: tools/tidy-check.sh [--update]" >&2; exit 2; }
build=${ISORUN_BUILD_DIR:-$root/build}
baseline=$root/tools/tidy-baseline.txt
command -v clang-tidy > /dev/null || {
  echo "tidy-check: clang-tidy is not installed (apt-get install -y clang-tidy)" >&2
  exit 2
}
[ -f "$build/compile_commands.json" ] || {
  echo "tidy-check: no $build/compile_commands.json; configure the build first (tools/build.sh)" >&2
  exit 2
}

sources=$(mktemp) outputs=$(mktemp -d) log=$build/tidy.log
trap 'rm -rf "$sources" "$outputs"' EXIT
python3 - "$build/compile_commands.json" "$root" > "$sources" << 'EOF'
import json, os, sys
entries, root = json.load(open(sys.argv[1])), sys.argv[2]
dirs = ("alloc", "serialization", "worker", "runner", "preload", "html", "sweep", "cli")
files = set()
for e in entries:
    path = os.path.relpath(os.path.join(e["directory"], e["file"]), root)
    if path.split(os.sep)[0] in dirs and path.endswith((".cpp", ".cc", ".c")):
        files.add(path)
print("\n".join(sorted(files)))
EOF
count=$(wc -l < "$sources")
[ "$count" -gt 0 ] || { echo "tidy-check: no product sources in $build/compile_commands.json" >&2; exit 2; }
start=$SECONDS
echo "tidy-check: clang-tidy over $count sources, $(nproc) at a time ($(clang-tidy --version | grep -o 'version [0-9.]*'))..."
# Each source's output into a file of its own, then all of them into the log, in order.
status=0
xargs -a "$sources" -P "$(nproc)" -I{} sh -c \
  'out=$3/$(printf %s "$2" | tr / _).log; clang-tidy -p "$1" --quiet "$2" > "$out" 2>&1 || echo "== clang-tidy exit $?: $2" >> "$out"' \
  _ "$build" {} "$outputs" || status=$?
cat "$outputs"/*.log > "$log"
echo "tidy-check: done in $((SECONDS - start)) s; output in $log"
if grep -qE '^== clang-tidy exit|^/[^:]+:[0-9]+:[0-9]+: error:' "$log"; then
  echo "tidy-check: clang-tidy could not check every source:" >&2
  grep -E '^== clang-tidy exit|^/[^:]+:[0-9]+:[0-9]+: error:' "$log" | head -20 >&2
  exit 2
fi
[ "$status" -eq 0 ] || { echo "tidy-check: xargs failed ($status)" >&2; exit 2; }

python3 - "$log" "$baseline" "$root" "$update" << 'EOF'
import collections, os, re, sys
log, baseline, root, update = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "1"
warning = re.compile(r"^(/[^:]+):(\d+):(\d+): warning: (.*) \[([^\]]+)\]$")
seen = {}
for line in open(log, errors="replace"):
    m = warning.match(line.rstrip("\n"))
    if m:
        path, row, col, text, checks = m.groups()
        where = os.path.relpath(path, root) if path.startswith(root + "/") else path  # (a system header)
        seen[(where, int(row), int(col), checks)] = text
now = collections.Counter(checks for (_, _, _, checks) in seen)
was = collections.Counter()
if os.path.exists(baseline):
    for line in open(baseline):
        line = line.strip()
        if line and not line.startswith("#"):
            n, check = line.split()
            was[check] = int(n)
if update:
    with open(baseline, "w") as f:
        f.write("# clang-tidy warnings per check in the product's sources (tools/tidy-check.sh): a count may\n"
                "# shrink, never grow. Rewritten by tools/tidy-check.sh --update.\n")
        for check in sorted(now):
            f.write(f"{now[check]} {check}\n")
    print(f"tidy-check: {baseline} rewritten: {sum(now.values())} warnings in {len(now)} checks")
    sys.exit(0)
grown = [c for c in now if now[c] > was[c]]
width = max([len(c) for c in set(now) | set(was)] + [5])
print(f"  {'check':<{width}}  baseline   now")
for check in sorted(set(now) | set(was)):
    mark = "  <- grew" if check in grown else ("  (fewer: tools/tidy-check.sh --update)" if now[check] < was[check] else "")
    print(f"  {check:<{width}}  {was[check]:>8}  {now[check]:>4}{mark}")
print(f"  {'total':<{width}}  {sum(was.values()):>8}  {sum(now.values()):>4}")
if grown:
    print("tidy-check: more warnings than the baseline allows; those of the checks that grew:", file=sys.stderr)
    for (where, row, col, checks), text in sorted(seen.items()):
        if checks in grown:
            print(f"  {where}:{row}:{col}: {text} [{checks}]", file=sys.stderr)
    print("fix them (or, where a warning is wrong, add a NOLINT(check) comment saying why)", file=sys.stderr)
    sys.exit(1)
print("tidy-check: no check has more warnings than the baseline")
EOF

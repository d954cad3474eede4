#!/usr/bin/env bash
# Checks that the C/C++ files commits change are formatted as .clang-format says, whole files.
#   tools/format-check.sh            the files changed by the last commit (HEAD~1..HEAD)
#   tools/format-check.sh RANGE      the files changed in a git range, e.g. main..HEAD or origin/main...
#   tools/format-check.sh --all      every tracked C/C++ file
# The tree was formatted once (the commit is in .git-blame-ignore-revs), so a file a commit
# touches is checked whole: formatting never drifts back in through the lines nobody changed.
# Fails naming the files and the command that formats them. Needs clang-format (Debian:
# apt-get install clang-format).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
range=${1:-HEAD~1..HEAD}
if [ $# -gt 1 ] || { [[ $range == -* ]] && [ "$range" != --all ]; }; then
  echo "usage: tools/format-check.sh [RANGE | --all]   (default HEAD~1..HEAD)" >&2
  exit 2
fi
command -v clang-format > /dev/null || {
  echo "format-check: clang-format is not installed (apt-get install -y clang-format)" >&2
  exit 2
}
exts=('*.c' '*.cc' '*.cpp' '*.cxx' '*.h' '*.hpp' '*.cu' '*.cuh')
if [ "$range" = --all ]; then
  mapfile -t changed < <(git ls-files -- "${exts[@]}")
else
  [[ $range == *..* ]] || range="$range..HEAD"
  base=${range%%..*}
  base=${base:-HEAD}
  if git rev-parse --verify --quiet "$base^{commit}" > /dev/null; then
    mapfile -t changed < <(git diff --name-only --diff-filter=d "$range" -- "${exts[@]}")
  elif [ "$(git rev-parse --is-shallow-repository)" = true ]; then
    echo "format-check: $base is not in this shallow clone; fetch more history (git fetch --deepen=1) or give a range" >&2
    exit 2
  elif [ "$base" = HEAD~1 ]; then
    # The first commit has no parent: its files are what it changed.
    mapfile -t changed < <(git ls-files -- "${exts[@]}")
  else
    echo "format-check: no commit $base" >&2
    exit 2
  fi
fi
files=()
for f in "${changed[@]}"; do [ -f "$f" ] && files+=("$f"); done
if [ ${#files[@]} -eq 0 ]; then
  echo "format-check: no C/C++ files changed in $range"
  exit 0
fi
bad=()
for f in "${files[@]}"; do clang-format --dry-run --Werror "$f" > /dev/null 2>&1 || bad+=("$f"); done
if [ ${#bad[@]} -eq 0 ]; then
  echo "format-check: ${#files[@]} C/C++ file(s) of $range formatted ($(clang-format --version | grep -o 'version [0-9.]*'))"
  exit 0
fi
for f in "${bad[@]}"; do clang-format "$f" | diff -u --label "$f" --label "$f (formatted)" "$f" - >&2 || true; done
echo "format-check: ${#bad[@]} of ${#files[@]} C/C++ file(s) changed in $range are not formatted as .clang-format says" >&2
echo "(the diff above shows how they should read); format them with:  clang-format -i ${bad[*]}" >&2
exit 1

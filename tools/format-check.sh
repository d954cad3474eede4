#!/usr/bin/env bash
# Checks that the C/C++ lines that commits change are formatted as .clang-format says.
#   tools/format-check.sh            the lines changed by the last commit (HEAD~1..HEAD)
#   tools/format-check.sh RANGE      the lines changed in a git range, e.g. main..HEAD or origin/main...
# Only changed lines (git clang-format): the code base is not reformatted at once, and a commit
# that touches a file is not made to reformat all of it. Fails showing how the lines should read,
# with the command that formats them. Needs clang-format (Debian: apt-get install clang-format,
# which brings git-clang-format).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
range=${1:-HEAD~1..HEAD}
if [ $# -gt 1 ] || [[ $range == -* ]]; then
  echo "usage: tools/format-check.sh [RANGE]   (default HEAD~1..HEAD)" >&2
  exit 2
fi
command -v clang-format > /dev/null || {
  echo "format-check: clang-format is not installed (apt-get install -y clang-format)" >&2
  exit 2
}
[[ $range == *..* ]] || range="$range..HEAD"
base=${range%%..*}
base=${base:-HEAD}
if ! git rev-parse --verify --quiet "$base^{commit}" > /dev/null; then
  if [ "$(git rev-parse --is-shallow-repository)" = true ]; then
    echo "format-check: $base is not in this shallow clone; fetch more history (git fetch --deepen=1) or give a range" >&2
    exit 2
  fi
  if [ "$base" != HEAD~1 ]; then
    echo "format-check: no commit $base" >&2
    exit 2
  fi
  # The first commit has no parent: its files are what it changed.
  mapfile -t changed < <(git ls-tree -r --name-only HEAD)
else
  mapfile -t changed < <(git diff --name-only --diff-filter=d "$range" --)
fi
files=()
for f in "${changed[@]}"; do
  case "$f" in
    *.c | *.cc | *.cpp | *.cxx | *.h | *.hpp | *.cu | *.cuh) [ -f "$f" ] && files+=("$f") ;;
  esac
done
if [ ${#files[@]} -eq 0 ]; then
  echo "format-check: no C/C++ files changed in $range"
  exit 0
fi
head=${range##*..}
head=${head:-HEAD}
if [ "$(git rev-parse --verify --quiet HEAD~1)" = "" ] && [ "$base" = HEAD~1 ]; then
  # The first commit: every line is new; each file is checked whole.
  bad=()
  for f in "${files[@]}"; do clang-format --dry-run --Werror "$f" > /dev/null 2>&1 || bad+=("$f"); done
  [ ${#bad[@]} -eq 0 ] && { echo "format-check: ${#files[@]} C/C++ file(s), all formatted"; exit 0; }
  echo "format-check: not formatted: ${bad[*]}; run: clang-format -i ${bad[*]}" >&2
  exit 1
fi
diff=$(git clang-format --diff --extensions c,cc,cpp,cxx,h,hpp,cu,cuh "$base" "$head" -- "${files[@]}" 2>&1) || true
if ! grep -q '^@@' <<< "$diff"; then
  echo "format-check: the lines $range changed in ${#files[@]} C/C++ file(s) are formatted ($(clang-format --version | grep -o 'version [0-9.]*'))"
  exit 0
fi
printf '%s\n' "$diff" >&2
echo "format-check: lines changed in $range are not formatted as .clang-format says (the diff above shows how they" >&2
echo "should read); format them with:  git clang-format $base" >&2
exit 1

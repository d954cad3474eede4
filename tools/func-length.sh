#!/usr/bin/env bash
# Checks that no product function is longer than a limit (default 80 lines): a long function is
# a list of steps that wants names. Spans are Universal Ctags' (first line to closing line,
# comments and blanks included, a lambda counted in its enclosing function too), over the
# product folders (tests, benchmarks, examples and tools are not product).
#   tools/func-length.sh              fails naming each function over 80 lines
#   tools/func-length.sh --top N      lists the N longest functions (no verdict)
#   FUNC_LIMIT=60 tools/func-length.sh
# Needs Universal Ctags (Debian: apt-get install universal-ctags).
set -euo pipefail
cd "$(dirname "$0")/.."
limit=${FUNC_LIMIT:-80}
top=
if [ "${1:-}" = --top ] && [ -n "${2:-}" ]; then
  top=$2
elif [ $# -gt 0 ]; then
  echo "usage: tools/func-length.sh [--top N]" >&2
  exit 2
fi
if ! ctags --version 2> /dev/null | grep -q 'Universal Ctags'; then
  echo "func-length: Universal Ctags is not installed (apt-get install -y universal-ctags)" >&2
  exit 2
fi
mapfile -t files < <(git ls-files -- alloc serialization worker runner preload html sweep cli python \
  | grep -E '\.(c|cc|cpp|h|hpp|cu|cuh|py)$' | grep -Ev '(^|/)tests?/')
# One line per function: span, where it starts, its name (a lambda as "lambda in" its enclosing one).
spans=$(ctags --languages=C++,CUDA,Python --map-C++=+.cu --map-C++=+.cuh --kinds-C++=f --kinds-Python=fm \
  --fields=+ne -f - "${files[@]}" 2> /dev/null | awk -F'\t' '{
    line = ""; end = ""; scope = ""
    for (i = 4; i <= NF; i++) {
      if ($i ~ /^line:/) line = substr($i, 6)
      else if ($i ~ /^end:/) end = substr($i, 5)
      else if ($i ~ /^(function|class|member|struct|namespace):/) scope = substr($i, index($i, ":") + 1)
    }
    if (line == "" || end == "") next
    name = $1
    if (name ~ /^__anon/) name = "lambda in " scope
    else if (scope != "") name = scope "::" name
    gsub(/__anon[0-9a-f]+/, "(anonymous)", name)
    printf "%d\t%s:%s\t%s\n", end - line + 1, $2, line, name
  }' | sort -t$'\t' -k1,1nr -k2,2)
if [ -n "$top" ]; then
  head -n "$top" <<< "$spans" | column -t -s$'\t'
  exit 0
fi
over=$(awk -F'\t' -v limit="$limit" '$1 > limit' <<< "$spans")
count=$(grep -c . <<< "$spans" || true)
if [ -z "$over" ]; then
  echo "func-length: $count product functions, none over $limit lines (longest: $(head -n1 <<< "$spans" | cut -f1,3 | tr '\t' ' '))"
  exit 0
fi
column -t -s$'\t' <<< "$over" >&2
echo "func-length: $(grep -c . <<< "$over") of $count product functions are over $limit lines; split each into named steps" >&2
exit 1

#!/usr/bin/env bash
# The wheel that tools/wheel.sh builds, installed into a fresh venv (no system
# site-packages, no build tree on sys.path) and checked as a user meets it:
#   - `pip install dist/isorun-*.whl` (its dependency, cloudpickle, from the index) timed: goal 15 s;
#     the wheel's size: goal 40 MB (bench/README.md);
#   - `auditwheel show`, and `ldd` of every ELF file in the installed package: each library
#     resolves inside the package or to the manylinux allow-list (no -dev package needed);
#   - `isorun --version` and a capped call from the venv alone;
#   - the Python suite (python/tests) against the installed package, run from outside the tree.
#   tools/wheel-check.sh [DIST]   (builds DIST's wheel first where it holds none)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dist=${1:-$root/dist}
python=${PYTHON:-python3}
ls "$dist"/isorun-*.whl > /dev/null 2>&1 || "$root/tools/wheel.sh" "$dist"
wheel=$(ls "$dist"/isorun-*.whl | head -1)
work=$(mktemp -d /tmp/isorun-wheel-check-XXXXXX)
trap 'rm -rf "$work"' EXIT
"$python" -m venv "$work/venv"
py=$work/venv/bin/python
export PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1
start=$(date +%s.%N)
"$py" -m pip install --quiet "$wheel"
install_s=$(echo "$(date +%s.%N) - $start" | bc)
size_mb=$(echo "scale=1; $(stat -c %s "$wheel") / 1000000" | bc)
printf 'wheel: %s, %s MB (goal <= 40); pip install into a fresh venv %.1f s (goal <= 15)\n' \
  "$(basename "$wheel")" "$size_mb" "$install_s"
"$python" -m auditwheel show "$wheel"
cd "$work"
pkg=$("$py" -c 'import isorun, os; print(os.path.dirname(isorun.__file__))')
case $pkg in "$work"/venv/*) ;; *) echo "isorun was imported from $pkg, not the venv"; exit 1 ;; esac
# Every ELF file of the package: its libraries found, inside the package or on the allow-list.
allowed='^(libc|libm|libdl|librt|libpthread|libgcc_s|libstdc\+\+|ld-linux-x86-64|linux-vdso|libutil|libresolv)\.so'
bad=0
while IFS= read -r f; do
  file -b "$f" | grep -q ELF || continue
  while read -r name _ where _; do
    [ -n "$name" ] || continue
    if [ "$where" = "not" ]; then echo "$f: $name not found"; bad=1
    elif [[ $where == "$pkg"/* || $where == "$work"/venv/* ]] || [[ $name =~ $allowed ]]; then :
    elif [[ $name == /* ]]; then :  # the interpreter named by path (ld-linux)
    else echo "$f: $name resolves outside the wheel and the allow-list: $where"; bad=1; fi
  done < <(ldd "$f" 2> /dev/null | sed 's/^[[:space:]]*//' | grep -v 'statically linked')
done < <(find "$pkg" "$work/venv/lib" -path '*isorun*' -type f \( -name '*.so*' -o -perm -u+x \))
[ $bad -eq 0 ] || exit 1
"$work/venv/bin/isorun" --version
# A capped call (on the simulated GPU the tests use: no GPU needed).
ISORUN_SIMULATE_GPUS=1x16G "$py" -c 'import isorun; assert isorun.isolated(lambda a, b: a + b, gpu=0, mem_limit="1G")(2, 3) == 5'
"$py" -m pip install --quiet pytest numpy
# The suite against the installed package: pytest puts python/tests (not python/) on sys.path,
# and the check above made sure that `import isorun` finds the venv's.
ISORUN_TEST_FAKE_CUDA_DIR=${ISORUN_TEST_FAKE_CUDA_DIR:-} "$py" -m pytest -q -p no:cacheprovider "$root/python/tests"
echo "wheel check passed"

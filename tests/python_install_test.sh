#!/usr/bin/env bash
# `pip install .` of the repository into a fresh venv, then the installed package checked from
# outside the source tree: its layout (the extension, libisorun, the cap library, the isorun
# command), the `isorun` console script, and a part of python/tests against it. The pip build
# folder is kept in BUILD/python-pip, so a rerun rebuilds only what changed.
#   tests/python_install_test.sh SOURCE BUILD PYTHON
set -euo pipefail
src=$1 build=$2 python=$3
if ! "$python" -c 'import venv, ensurepip' 2> /dev/null; then
  echo "python install test skipped: $python has no venv/ensurepip"
  exit 77
fi
work=$(mktemp -d /tmp/isorun-pip-XXXXXX)
trap 'rm -rf "$work"' EXIT
# The venv sees the interpreter's own packages (scikit-build-core, nanobind, cloudpickle,
# numpy, pytest: tools/setup.sh installs them), so nothing is downloaded.
"$python" -m venv --system-site-packages "$work/venv"
py=$work/venv/bin/python
PIP_ROOT_USER_ACTION=ignore "$py" -m pip install --quiet --no-build-isolation --no-deps \
  --config-settings=build-dir="$build/python-pip" "$src" > "$work/pip.log" 2>&1 || { tail -40 "$work/pip.log"; exit 1; }
cd "$work"
pkg=$("$py" -c 'import isorun, os; print(os.path.dirname(isorun.__file__))')
case $pkg in "$work"/venv/*) ;; *) echo "isorun was imported from $pkg, not the venv"; exit 1 ;; esac
for f in lib/libisorun.so.0 lib/libisorun_cuda_cap.so lib/isorun-command-shim lib/isorun-cli bin/isorun; do
  [ -e "$pkg/$f" ] || { echo "the installed package lacks $f"; ls -R "$pkg"; exit 1; }
done
ls "$pkg"/_core*.so > /dev/null
"$work/venv/bin/isorun" --help > /dev/null
# The front end runs a command itself, and hands a task to isorun-cli.
[ "$("$work/venv/bin/isorun" --cpu -q -- echo front)" = front ]
"$work/venv/bin/isorun" --cpu tasks > /dev/null
"$py" -c 'import isorun; assert isorun.isolated(lambda a, b: a + b)(2, 3) == 5'
ISORUN_TEST_FAKE_CUDA_DIR=${ISORUN_TEST_FAKE_CUDA_DIR:-} "$py" -m pytest -q -p no:cacheprovider \
  "$src/python/tests/test_call.py" "$src/python/tests/test_arrays.py" "$src/python/tests/test_cap.py"
echo "python install test passed"

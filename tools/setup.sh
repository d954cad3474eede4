#!/usr/bin/env bash
# Installs the Debian packages isorun needs, if any are missing. Safe to run repeatedly.
set -euo pipefail
packages=(build-essential cmake pkg-config libboost1.81-dev libcereal-dev catch2 nlohmann-json3-dev
          libxxhash-dev libyaml-cpp-dev zlib1g-dev libbenchmark-dev libmimalloc-dev libjemalloc-dev
          libcli11-dev                 # the command line's parser (cli/options.cpp)
          clang-14 libclang-rt-14-dev  # for tools/fuzz.sh (libFuzzer)
          python3 python3-numpy python3-dev  # the Python example; the package (python/)
          bc file)                     # tools/wheel-check.sh
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "isorun setup: installing ${missing[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" > /dev/null
fi
# Headless Chromium renders the sweep report in the `browser`-labelled test. It is large and
# optional: where it cannot be installed, that test is skipped, and nothing else needs it.
if ! command -v chromium > /dev/null 2>&1 && [ -z "${ISORUN_NO_BROWSER:-}" ]; then
  echo "isorun setup: installing chromium (for the report's browser test; ISORUN_NO_BROWSER=1 skips it)"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  { $sudo apt-get update -qq > /dev/null 2>&1 &&
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends chromium > /dev/null 2>&1; } ||
    echo "isorun setup: chromium could not be installed; the browser test will be skipped"
fi
# A single-node Slurm cluster runs the `slurm`-labelled tests (tests/slurm/cluster.sh); optional
# like Chromium: without it those tests are skipped.
if ! command -v slurmctld > /dev/null 2>&1 && [ -z "${ISORUN_NO_SLURM:-}" ]; then
  echo "isorun setup: installing slurmctld slurmd slurm-client munge (for the Slurm tests; ISORUN_NO_SLURM=1 skips it)"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  { $sudo apt-get update -qq > /dev/null 2>&1 &&
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends slurmctld slurmd slurm-client munge \
      > /dev/null 2>&1; } || echo "isorun setup: Slurm could not be installed; the Slurm tests will be skipped"
fi
# The Python example runs `python3` from PATH: where that is not Debian's (pyenv, a venv), it
# needs NumPy too.
if ! python3 -c 'import numpy' 2> /dev/null && python3 -m pip --version > /dev/null 2>&1; then
  echo "isorun setup: installing numpy for $(command -v python3)"
  PIP_ROOT_USER_ACTION=ignore python3 -m pip install --quiet numpy > /dev/null
fi
# The scikit-learn examples (examples/python/sklearn_asha.py, the docs' Python blocks, which
# python/tests/test_docs.py runs) likewise, with pip. Not as a Debian package: python3-sklearn
# needs libboost1.74-dev (through pythran), which conflicts with libboost1.81-dev above; where
# pip cannot install it (Debian's own python3 refuses: PEP 668), those tests are skipped, saying so.
if ! python3 -c 'import sklearn' 2> /dev/null && python3 -m pip --version > /dev/null 2>&1; then
  echo "isorun setup: installing scikit-learn for $(command -v python3)"
  PIP_ROOT_USER_ACTION=ignore python3 -m pip install --quiet scikit-learn > /dev/null 2>&1 ||
    echo "isorun setup: pip could not install scikit-learn; the docs' scikit-learn examples will be skipped"
fi
# Searches through Optuna (search: {type: optuna}, python/tests/test_search.py) and its CMA-ES
# sampler's cmaes, likewise with pip; where pip cannot, those tests are skipped, saying so.
if ! python3 -c 'import optuna, cmaes' 2> /dev/null && python3 -m pip --version > /dev/null 2>&1; then
  echo "isorun setup: installing optuna and cmaes for $(command -v python3)"
  PIP_ROOT_USER_ACTION=ignore python3 -m pip install --quiet optuna cmaes > /dev/null 2>&1 ||
    echo "isorun setup: pip could not install optuna; the Optuna search tests will be skipped"
fi
# The trackers (track: {mlflow: ...}, {tensorboard: ...}; python/tests/test_track.py): MLflow with
# its SQLite store, and TensorBoard, likewise with pip; where pip cannot, those tests are skipped.
if ! python3 -c 'import mlflow, sqlalchemy, alembic, tensorboard' 2> /dev/null && python3 -m pip --version > /dev/null 2>&1; then
  echo "isorun setup: installing mlflow-skinny, sqlalchemy, alembic and tensorboard for $(command -v python3)"
  PIP_ROOT_USER_ACTION=ignore python3 -m pip install --quiet mlflow-skinny sqlalchemy alembic tensorboard > /dev/null 2>&1 ||
    echo "isorun setup: pip could not install the trackers' packages; their tests will be skipped"
fi
# The Python package (python/, `pip install .`): the python3 on PATH needs its development files,
# nanobind and scikit-build-core to build it, cloudpickle to run it and pytest to test it. Where
# pip cannot install for that python3 (Debian's own refuses: PEP 668), the package is not built
# and its test does not run; a venv or pyenv python3 on PATH has them installed here.
python_needs=()
for m in nanobind scikit_build_core cloudpickle pytest; do
  python3 -c "import $m" 2> /dev/null || python_needs+=("${m//_/-}")
done
if [ ${#python_needs[@]} -gt 0 ] && python3 -m pip --version > /dev/null 2>&1; then
  echo "isorun setup: installing ${python_needs[*]} for $(command -v python3)"
  PIP_ROOT_USER_ACTION=ignore python3 -m pip install --quiet "${python_needs[@]}" > /dev/null 2>&1 ||
    echo "isorun setup: pip could not install ${python_needs[*]}; the Python package will not be built"
fi

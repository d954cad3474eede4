#!/usr/bin/env bash
# Lints the Python package (python/isorun) as pyproject.toml's [tool.ruff] and [tool.mypy] say:
# ruff (errors, bug patterns, modern syntax, import order) and mypy (types). Installs both with pip
# where they are missing (as root in CI).
#   tools/py-lint.sh          check
#   tools/py-lint.sh --fix    let ruff fix what it can (imports, ...), then check
set -euo pipefail
cd "$(dirname "$0")/.."
fix=()
if [ "${1:-}" = "--fix" ]; then fix=(--fix); shift; fi
[ $# -eq 0 ] || { echo "usage: tools/py-lint.sh [--fix]" >&2; exit 2; }
# Pinned where installed here, so that a new release of either does not fail CI on its own.
for tool in ruff==0.17.6 mypy==2.4.1; do
  python3 -c "import ${tool%%=*}" 2> /dev/null && continue
  PIP_ROOT_USER_ACTION=ignore python3 -m pip install --quiet --disable-pip-version-check "$tool" || {
    echo "py-lint: pip could not install $tool for $(command -v python3) (Debian's own python3 refuses:" \
      "PEP 668); put a venv's or pyenv's python3 first on PATH" >&2
    exit 2
  }
done
status=0
echo "py-lint: $(python3 -m ruff --version)"
python3 -m ruff check "${fix[@]}" || status=1
echo "py-lint: $(python3 -m mypy --version)"
python3 -m mypy || status=1
exit $status

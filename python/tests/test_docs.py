"""The documentation runs as written: every ```python block of README.md and docs/python.md, and
the scripts of examples/python, each as a script of its own in an output folder of its own (CPU
only, NumPy and scikit-learn; a block marked ``<!-- docs-test: skip: REASON -->`` just before
its fence is skipped with that reason)."""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOCS = ["README.md", "docs/python.md"]
SKIP = re.compile(r"<!--\s*docs-test:\s*skip:\s*(.*?)\s*-->")
HAS_SKLEARN = importlib.util.find_spec("sklearn") is not None


def _blocks(doc: str) -> list[tuple[str, str, str]]:
    """(id, source, skip reason or "") of each python block of `doc`."""
    lines = (ROOT / doc).read_text().splitlines(keepends=True)
    found, i = [], 0
    while i < len(lines):
        if lines[i].strip() == "```python":
            start = i + 1
            end = next(j for j in range(start, len(lines)) if lines[j].strip() == "```")
            before = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
            skip = SKIP.search(before)
            found.append((f"{doc}:{start}", "".join(lines[start:end]), skip.group(1) if skip else ""))
            i = end
        i += 1
    return found


BLOCKS = [b for doc in DOCS for b in _blocks(doc)]
EXAMPLES = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "examples/python").glob("*.py")
                  if "import isorun" in p.read_text())


def _run(argv: list[str], cwd: pathlib.Path, source: str) -> subprocess.CompletedProcess:
    if "sklearn" in source and not HAS_SKLEARN:
        pytest.skip("scikit-learn is not installed (tools/setup.sh installs it)")
    p = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, env=os.environ.copy())
    assert p.returncode == 0, f"stdout:\n{p.stdout}\nstderr:\n{p.stderr}"
    return p


def _sweep_results_are_metrics(out: pathlib.Path) -> None:
    """A sweep's trials return metrics: numbers, not arrays that become JSON lists."""
    for journal in out.rglob("results.jsonl"):
        for line in journal.read_text().splitlines():
            record = json.loads(line)
            for name, value in (record.get("result") or {}).items():
                assert not isinstance(value, (list, dict)), f"{journal}: result {name} is not a metric"


def test_the_docs_have_python_blocks():
    assert len(BLOCKS) >= 5 and EXAMPLES


@pytest.mark.parametrize("where, source, skip", BLOCKS, ids=[b[0] for b in BLOCKS])
def test_a_python_block_of_the_docs_runs_as_written(where, source, skip, tmp_path):
    if skip:
        pytest.skip(skip)
    script = tmp_path / "block.py"
    script.write_text(source)
    _run([sys.executable, str(script)], tmp_path, source)
    _sweep_results_are_metrics(tmp_path)


@pytest.mark.parametrize("example", EXAMPLES)
def test_an_example_script_runs(example, tmp_path):
    source = (ROOT / example).read_text()
    p = _run([sys.executable, str(ROOT / example), str(tmp_path / "out")], tmp_path, source)
    _sweep_results_are_metrics(tmp_path)
    if example.endswith("sklearn_asha.py"):
        assert "pruned" in p.stdout  # ASHA stopped some trials early

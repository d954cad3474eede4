"""The version is written once, in VERSION: the package, the command and the packaging agree with it."""

from __future__ import annotations

import os
import re
import subprocess

import pytest

import isorun

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")


def _version_file() -> str:
    with open(os.path.join(ROOT, "VERSION")) as f:
        return f.readline().strip()


def test_version_file_holds_a_version():
    assert re.fullmatch(r"[0-9]+\.[0-9]+\.[0-9]+\S*", _version_file())


def test_package_version_is_the_version_file():
    assert isorun.__version__ == _version_file()
    from isorun import __version__

    assert __version__ == _version_file()
    assert "__version__" in dir(isorun)


def test_command_version_is_the_version_file():
    # The command the package carries (isorun/bin/isorun), built with CMake's project version.
    command = os.path.join(os.path.dirname(isorun.__file__), "bin", "isorun")
    out = subprocess.run([command, "--version"], capture_output=True, text=True, check=True).stdout
    assert _version_file() in out.split()


def test_pyproject_takes_the_version_file():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        config = tomllib.load(f)
    assert "version" not in config["project"] and "version" in config["project"]["dynamic"]
    # What scikit-build-core's regex provider finds in the file it names.
    provider = config["tool"]["scikit-build"]["metadata"]["version"]
    assert provider["provider"] == "scikit_build_core.metadata.regex"
    with open(os.path.join(ROOT, provider["input"])) as f:
        found = re.search(provider["regex"], f.read(), re.MULTILINE)
    assert found and found.group("value") == _version_file()

# The compiled extension isorun._core (python/src/module.cpp and its parts, nanobind), for type
# checkers: its names are not described here, each is Any.
from typing import Any

def __getattr__(name: str) -> Any: ...

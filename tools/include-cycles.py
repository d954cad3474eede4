#!/usr/bin/env python3
"""Checks that no library folder has an include cycle between its rooms.

A room is a .cpp with its .hpp (same base name); room A depends on room B when a file of A
includes a header of B. A cycle between rooms means no part can be read, tested or replaced
without the others; the parts of a library should stand on one another in layers.

    tools/include-cycles.py            fails naming each cycle and its arrows
    tools/include-cycles.py FOLDER...  the given folders only
"""

import os
import re
import subprocess
import sys

# Every library folder but two that each still hold a cycle (`tools/include-cycles.py runner
# serialization` names them); each joins the list once it has none.
FOLDERS = ["alloc", "worker", "preload", "html", "sweep", "cli", "python/src"]
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def rooms_of(folder: str) -> dict[str, list[str]]:
    tracked = subprocess.run(["git", "ls-files", "--", folder], capture_output=True, text=True, check=True)
    rooms: dict[str, list[str]] = {}
    for path in tracked.stdout.split():
        if path.endswith((".cpp", ".hpp", ".h", ".cu", ".cuh")) and "/tests/" not in path:
            rooms.setdefault(os.path.splitext(os.path.basename(path))[0], []).append(path)
    return rooms


def arrows(rooms: dict[str, list[str]]) -> dict[str, set[str]]:
    by_path = {path: room for room, paths in rooms.items() for path in paths}
    graph: dict[str, set[str]] = {room: set() for room in rooms}
    for room, paths in rooms.items():
        for path in paths:
            with open(path, encoding="utf-8") as f:
                for name in INCLUDE.findall(f.read()):
                    # The header this include names, if it is one of this folder's files.
                    for candidate, other in by_path.items():
                        if other != room and (candidate.endswith("/" + name) or candidate == name):
                            graph[room].add(other)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one room (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def main() -> int:
    os.chdir(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    folders = sys.argv[1:] or FOLDERS
    bad = 0
    total = 0
    for folder in folders:
        rooms = rooms_of(folder)
        if not rooms:
            print(f"include-cycles: {folder} has no C/C++ files", file=sys.stderr)
            return 2
        total += len(rooms)
        graph = arrows(rooms)
        for component in cycles(graph):
            bad += 1
            print(f"include-cycles: {folder}: a cycle between {', '.join(component)}:", file=sys.stderr)
            for room in component:
                print(f"  {room} -> {', '.join(sorted(graph[room] & set(component)))}", file=sys.stderr)
    if bad:
        print(f"include-cycles: {bad} cycle(s); move what both sides need into a header of its own", file=sys.stderr)
        return 1
    print(f"include-cycles: {total} rooms in {len(folders)} folders, no cycle")
    return 0


if __name__ == "__main__":
    sys.exit(main())

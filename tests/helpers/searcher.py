"""A scripted searcher for the tests of isorun's searcher protocol (docs/sweeps.md#search).

It proposes {"x": 2 * number} for ask `number`, appends every message it gets to LOG (one JSON
line each, and {"answered": ...} for each answer) and answers as the protocol says. MODE changes it:
  serial     answers {"wait": true} while a trial it proposed has not been told of
  done:N     says done once N trials have been told of
  crash:N    exits (status 3) when asked for trial N
  hang:N     never answers ask N
  journaled:N  answers ask N once the sweep's journal (out/results.jsonl beside LOG) holds N records
  garbage:N  answers ask N with a line that is not JSON
  waitstr:N  answers ask N with {"wait": "yes"} (not a boolean)
  doneint:N  answers ask N with {"done": 1} (not a boolean)
  noparams:N answers ask N with {"params": {}} (none of the parameters it was given)
  exit       exits (status 5) at hello
  flood:N    writes N MiB of lines to its stderr at hello, then goes on as usual
  orphan:N   when asked for trial N, leaves a child that calls setsid() and keeps its stdout
             open (its pid in LOG.orphan), then exits (status 3)

Usage: searcher.py LOG [MODE]"""

import json
import os
import sys
import time

log_path = sys.argv[1]
mode = sys.argv[2] if len(sys.argv) > 2 else ""
kind, _, arg = mode.partition(":")
n = int(arg) if arg else -1
outstanding = set()
told = 0


def answer(obj):
    with open(log_path, "a") as log:
        log.write(json.dumps({"answered": obj}, sort_keys=True) + "\n")
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


for line in sys.stdin:
    message = json.loads(line)
    with open(log_path, "a") as log:
        log.write(json.dumps(message, sort_keys=True) + "\n")
    op = message["op"]
    if op == "hello" and kind == "exit":
        sys.exit(5)
    if op == "hello" and kind == "flood":
        for _ in range(n * 1024):
            sys.stderr.write("e" * 1023 + "\n")
        sys.stderr.flush()
    if op == "ask":
        number = message["number"]
        if kind == "done" and told >= n:
            answer({"done": True})
        elif kind == "serial" and outstanding and not message.get("replay"):
            answer({"wait": True})
        elif kind == "crash" and number == n:
            sys.exit(3)
        elif kind == "orphan" and number == n:
            written, wrote = os.pipe()
            if os.fork() == 0:
                os.setsid()  # out of the searcher's process group too
                with open(log_path + ".orphan", "w") as f:
                    f.write(f"{os.getpid()}\n")
                os.write(wrote, b"1")
                time.sleep(3600)
                os._exit(0)
            os.read(written, 1)  # its pid is in the file before the searcher exits
            os._exit(3)
        elif kind == "hang" and number == n:
            time.sleep(3600)
        elif kind == "journaled" and number == n:
            journal = os.path.join(os.path.dirname(log_path), "out", "results.jsonl")
            while not os.path.exists(journal) or len(open(journal).read().splitlines()) < n:
                time.sleep(0.01)  # (the sweep journals while its searcher thinks)
            outstanding.add(number)
            answer({"params": {"x": 2 * number}})
        elif kind == "garbage" and number == n:
            sys.stdout.write("proposing x now\n")
            sys.stdout.flush()
        elif kind == "waitstr" and number == n:
            answer({"wait": "yes"})
        elif kind == "doneint" and number == n:
            answer({"done": 1})
        elif kind == "noparams" and number == n:
            answer({"params": {}})
        else:
            outstanding.add(number)
            answer({"params": {"x": 2 * number}})
    elif op == "tell":
        outstanding.discard(message["number"])
        told += 1
        answer({})
    else:
        answer({})

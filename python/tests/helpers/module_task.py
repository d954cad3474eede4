"""A module-level function for calls that the worker imports by name (not sent by value)."""

import os


def pid_of_worker():
    return os.getpid()

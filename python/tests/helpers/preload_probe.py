"""A module that nothing imports but a preload: its presence in a worker says it was preloaded."""

import os
import time

imported_at = time.monotonic()
imported_by = os.getpid()

"""A preload whose import never ends (a framework stuck at import): a zygote that imports it is
never ready."""

import threading

threading.Event().wait()

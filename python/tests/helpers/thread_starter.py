"""A preload that starts a thread at import, as a library's thread pool would: a zygote that
imported it must not fork."""

import os
import threading

imported_by = os.getpid()
threading.Thread(target=threading.Event().wait, daemon=True).start()

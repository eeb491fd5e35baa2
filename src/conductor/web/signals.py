"""SIGINT and SIGTERM as a graceful stop of an asyncio program (the server, the replay).

The handlers go on the running loop (``loop.add_signal_handler``), so they are installed
whatever disposition the process inherited: a non-interactive shell starts background jobs
with SIGINT ignored, and asyncio's own Ctrl-C handling is then absent.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Callable, Iterator

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
"""The signals that ask for a graceful stop."""


@contextlib.contextmanager
def on_stop_signals(on_signal: Callable[[signal.Signals], None]) -> Iterator[None]:
    """While inside, each of :data:`STOP_SIGNALS` calls ``on_signal(sig)`` on the running
    loop; where a handler cannot be installed (not the main thread, no Unix signals) that
    signal keeps its default."""
    loop = asyncio.get_running_loop()
    installed: list[signal.Signals] = []
    for sig in STOP_SIGNALS:
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(sig, on_signal, sig)
            installed.append(sig)
    try:
        yield
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)

"""Uploads that run while training goes on: one at a time, on a thread, errors handed back.

    uploads = Uploads()
    uploads.submit(lambda: mirror.upload([...]), what="checkpoint of step 40")
    ...                 # training continues while the thread uploads
    uploads.join()      # before the next upload's local prune, at the end, before exiting

A failed upload is raised (once) by the next `submit` or `join`, so the caller decides what it
means: the trainer stops every rank with the store's error, and the checkpoints already
complete in the store stay as they are.
"""

from __future__ import annotations

import contextvars
import threading
import time
from collections.abc import Callable


class Uploads:
    """One background upload at a time."""

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        # Seconds the last upload took, from submit to its end (for the log and benchmarks).
        self.last_s = 0.0

    @property
    def busy(self) -> bool:
        """Whether an upload is in flight."""
        return self._thread is not None and self._thread.is_alive()

    def submit(self, work: Callable[[], None], *, what: str) -> None:
        """Run `work` on a new thread once the previous upload has ended (its error raised here)."""
        self.join()
        # The caller's context goes along: log lines from the thread carry its rank and node.
        context = contextvars.copy_context()
        self._thread = threading.Thread(
            target=context.run,
            args=(self._run, work),
            name=f"trainbox-upload {what}",
            # Not a daemon: interpreter exit waits for an upload in flight rather than cut it.
            daemon=False,
        )
        self._thread.start()

    def join(self) -> None:
        """Wait for the upload in flight; raise its error (once) if it failed."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        error, self._error = self._error, None
        if error is not None:
            raise error

    def _run(self, work: Callable[[], None]) -> None:
        started = time.perf_counter()
        try:
            work()
        except BaseException as err:  # the caller's thread decides what it means
            self._error = err
        finally:
            self.last_s = time.perf_counter() - started

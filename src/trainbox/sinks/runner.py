"""What a sink is, and the runner that feeds it the metrics records on a background thread: a
slow or failing sink never slows or stops the training step."""

from __future__ import annotations

import atexit
import functools
import queue
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from trainbox.logs import log

# Records waiting for the sinks; past this, new ones are dropped (and counted) rather than wait.
QUEUE_LIMIT = 10_000
# How long closing waits for the sinks to take what is queued, at the end of a run.
CLOSE_TIMEOUT_S = 30.0


class Sink(Protocol):
    """What `logging.sinks` factories return."""

    def write(self, record: Mapping[str, Any]) -> None:
        """Take one metrics record (a JSON-ready dict with `kind`, `step` and numbers)."""

    def close(self) -> None:
        """Flush and let go of files or connections: the run is over."""


class SinkRunner:
    """Feeds records to sinks on one daemon thread; `put` never blocks the caller."""

    def __init__(self, sinks: Sequence[Sink]) -> None:
        self.sinks = list(sinks)
        self.queue: queue.Queue[Mapping[str, Any] | None] = queue.Queue(QUEUE_LIMIT)
        self.dropped = 0
        self.thread: threading.Thread | None = None
        self.closed = False

    def put(self, record: Mapping[str, Any]) -> None:
        """Hand one record to the sinks (dropped, with one warning, if they fall far behind)."""
        if not self.sinks or self.closed:
            return
        if self.thread is None:
            self.thread = threading.Thread(target=self._drain, name="trainbox-sinks", daemon=True)
            self.thread.start()
            atexit.register(self.close)  # the CLI exits right after the run: drain first
        try:
            self.queue.put_nowait(record)
        except queue.Full:
            self.dropped += 1
            if self.dropped == 1:
                log.warning("metrics sinks fall behind; dropping records", limit=QUEUE_LIMIT)

    def close(self) -> None:
        """Let the sinks take what is queued (up to CLOSE_TIMEOUT_S), then close them."""
        if self.closed:
            return
        self.closed = True
        if self.thread is not None:
            self.queue.put(None)
            self.thread.join(CLOSE_TIMEOUT_S)
        for sink in self.sinks:
            _guarded(sink, "close", sink.close)

    def _drain(self) -> None:
        while (record := self.queue.get()) is not None:
            for sink in list(self.sinks):
                if not _guarded(sink, "write", functools.partial(sink.write, record)):
                    self.sinks.remove(sink)  # one warning, not one per record


def _guarded(sink: Sink, action: str, call: Callable[[], None]) -> bool:
    try:
        call()
    except Exception as err:  # a tracking outage must never end a training run
        log.warning("metrics sink failed; it gets no more records", sink=type(sink).__name__,
                    action=action, error=f"{type(err).__name__}: {err}")  # fmt: skip
        return False
    return True

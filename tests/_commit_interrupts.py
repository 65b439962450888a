"""An interrupt that lands as a commit is being made, as a Ctrl+C does: SIGUSR1 raised in
the committing thread at the fault point `commit.view_commit` (the journal holds the
handler's exception until the commit is done, so the caller gets it for a committed
write), and a handler that raises a given exception."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator

from journal._local.files import FileOps


class SignalAtNextCommit(FileOps):
    """Raises SIGUSR1 as the next commit's LMDB transaction is about to commit, once
    `armed`; disarms itself."""

    armed = False

    def point(self, name: str, detail: object = None) -> None:
        if self.armed and name == "commit.view_commit":
            self.armed = False
            signal.raise_signal(signal.SIGUSR1)


@contextlib.contextmanager
def raising_on_sigusr1(error: BaseException) -> Iterator[None]:
    """SIGUSR1's handler raises `error` inside the block; the previous one after it."""

    def interrupt(signum: int, frame: object) -> None:
        raise error

    previous = signal.signal(signal.SIGUSR1, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGUSR1, previous)

"""The simulated disk of `tests/_disk.py` shared by several processes.

Each process that writes the store opens a `SharedDisk` on the same state directory (kept
outside the store). Every operation takes an exclusive `flock` on the directory's lock
file, loads what the disk holds (each file's synced content and unsynced writes, each
directory's synced entries, the inode generations, whether the power is off), performs
the operation as `SimulatedDisk` does, and saves the state again. So the syncs of every
writer process count, and a power cut (`power_off()` in the parent, then SIGKILL of every
writer, then `power_cut()`) leaves what the disk held at that moment, whichever process
synced it. After `power_off()` every operation of every process fails with EIO ("the
power is off"), as for one process: no writer can acknowledge anything once the power is
gone, and a writer killed between an operation and the save of its state is one whose
operation came after the power went.
"""

from __future__ import annotations

import fcntl
import os
import pickle
import random
import threading
from types import TracebackType

from _disk import SimulatedDisk

__all__ = ["SharedDisk"]

_STATE = "state.pickle"
_LOCK = "lock"


class _SharedLock:
    """A re-entrant lock across the threads of this process and every process using the
    same state directory; the state is loaded on the outermost entry and saved on its
    exit."""

    def __init__(self, disk: SharedDisk) -> None:
        self.disk = disk
        self.threads = threading.RLock()
        self.depth = 0
        self.fd = -1

    def __enter__(self) -> None:
        self.threads.acquire()
        if self.depth == 0:
            self.fd = os.open(os.path.join(self.disk.state_dir, _LOCK), os.O_RDWR | os.O_CREAT)
            fcntl.flock(self.fd, fcntl.LOCK_EX)
            self.disk.load_state()
        self.depth += 1

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.depth -= 1
        try:
            if self.depth == 0:
                try:
                    self.disk.save_state()
                finally:
                    os.close(self.fd)  # (releases the flock)
                    self.fd = -1
        finally:
            self.threads.release()


class SharedDisk(SimulatedDisk):
    """`SimulatedDisk` whose state lives in `state_dir`, shared by every process."""

    def __init__(self, root: str, state_dir: str, rng: random.Random) -> None:
        super().__init__(root, rng)
        self.state_dir = state_dir
        os.makedirs(state_dir, exist_ok=True)
        self._lock = _SharedLock(self)  # type: ignore[assignment]

    def load_state(self) -> None:
        try:
            with open(os.path.join(self.state_dir, _STATE), "rb") as f:
                state = pickle.load(f)
        except FileNotFoundError:
            return
        self._files, self._generations, self._listings, self.dead = state

    def save_state(self) -> None:
        state = (self._files, self._generations, self._listings, self.dead)
        temporary = os.path.join(self.state_dir, f"{_STATE}.{os.getpid()}.tmp")
        with open(temporary, "wb") as f:
            pickle.dump(state, f, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(temporary, os.path.join(self.state_dir, _STATE))

    def power_off(self) -> None:
        """From now on every operation of every process fails (the power is gone)."""
        with self._lock:
            self.dead = True

    def power_on(self) -> None:
        """After `power_cut()`: the disk works again (the next boot)."""
        with self._lock:
            self.dead = False

"""Zeros ahead of the active segment's writer, written off the commit path (SPEC.md 3.2).

A large active segment is kept preallocated with real, synced zeros several MiB past its
last frame by one daemon thread per writable log, so a commit's sync flushes its frame
and not megabytes of zeros as well (measured on 58 KB batches: an inline 4 MiB step made
the batch that took it cost ~11 ms, and p99 of batches 11 ms against 3-4 ms).

Several processes may write one store, and a filler runs without the store's write lock,
so growing a segment file is guarded by the *extension lock*: an exclusive `flock` on the
segment file, through a descriptor of its own. A filler writes zeros only while it holds
it, only at the file's size as it finds it under the lock, and only while no newer
segment exists; a writer takes it whenever its frame would end past the file's size, and
a rotation holds it from cutting the sealed segment's zeros until the next segment
exists. So zeros never land on a frame (frames below the size are never written by a
filler), and never on a sealed segment. A filler that fails is logged and rests for
`RETRY_S`; meanwhile writers preallocate inline as before, so the error (a full disk)
reaches a commit and is reported there.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import threading
import time
from collections.abc import Iterator
from typing import Final

from ..forking import ForkPause
from .files import FileOps, open_regular
from .frames import COMPRESSED_SUFFIX, SEGMENT_SUFFIX, segment_name

__all__ = [
    "AHEAD_BYTES",
    "INLINE_BYTES",
    "KEEP_FREE_BYTES",
    "STEP_BYTES",
    "ZeroFiller",
    "extension_lock",
    "zeros_fit",
]

_log = logging.getLogger("journal")

# How far ahead of the writer's end the filler keeps zeros, and in what steps (each step
# holds the extension lock while it is written and synced). Not further: a reader at the
# active tail reads every zero after the last frame (to tell a torn tail from damage).
AHEAD_BYTES: Final = 4 << 20
STEP_BYTES: Final = 1 << 20
# What a writer preallocates itself when it runs out of zeros and no filler is working;
# a segment of at most this size is preallocated whole by its first append, no filler.
INLINE_BYTES: Final = 4 << 20
# Zeros ahead are a speed-up: they never take the file system's last `KEEP_FREE_BYTES`,
# so a disk near full keeps its space for frames and the view (a step that would is a
# failure, and writes nothing).
KEEP_FREE_BYTES: Final = 16 << 20
RETRY_S: Final = 1.0  # a failed filler rests this long (writers preallocate inline)
_IDLE_S: Final = 5.0  # an idle filler thread ends; the next request starts another
_STOP_WAIT_S: Final = 5.0


@contextlib.contextmanager
def extension_lock(fd: int) -> Iterator[None]:
    """Hold the extension lock of the segment file open as `fd` (see the module docstring).
    `flock` belongs to the open file description, so a filler's own descriptor excludes
    its process's writer too; the lock is released explicitly, not by closing, because a
    forked child may share the description."""
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)


def zeros_fit(ops: FileOps, fd: int, length: int) -> bool:
    """Whether `length` bytes of zeros ahead may be written to the file system of `fd`:
    it keeps `KEEP_FREE_BYTES` free after them."""
    return ops.free_bytes(fd) >= length + KEEP_FREE_BYTES


class _NoRoom(OSError):
    """A step not written: it would leave less than `KEEP_FREE_BYTES` free. (Not naming
    the step's length: a segment's last steps are shorter each time, and a different
    message is a new failure, a warning again at every retry.)"""

    def __init__(self) -> None:
        super().__init__(
            errno.ENOSPC,
            "the file system would keep less than "
            f"{KEEP_FREE_BYTES >> 20} MiB free after them, and zeros ahead leave its last "
            f"{KEEP_FREE_BYTES >> 20} MiB to frames and the view",
        )


class ZeroFiller:
    """The zero-filling thread of one writable log. `want` asks for zeros up to an offset
    of a segment (the latest request replaces older ones), `working` says whether a writer
    may leave the zeros to it, `stop` ends the thread (a later `want` starts another)."""

    def __init__(self, ops: FileOps, *, sync: bool) -> None:
        self._ops = ops
        self._sync = sync
        self._pid = os.getpid()
        # (Entered as `with self._lock`, as `ExpiryTimer`'s: a Ctrl+C in a close's `stop`.)
        self._lock = threading.RLock()
        self._cv = threading.Condition(self._lock)
        self._request: tuple[str, int, int] | None = None  # directory, base, end offset
        self._thread: threading.Thread | None = None
        self._resting_until = 0.0
        self._failure: str | None = None  # the last failure logged, until a step works
        self._wrote = False  # whether the last step wrote zeros
        # Held while a step has the segment open: fork() waits for it, so a child never
        # inherits a filler's descriptor (or its lock).
        self.busy = threading.Lock()
        _FILLERS.add(self)

    @property
    def working(self) -> bool:
        """False while the filler rests after a failure, and in a forked child."""
        return os.getpid() == self._pid and time.monotonic() >= self._resting_until

    def want(self, directory: str, base_position: int, end_offset: int) -> None:
        """Ask for zeros in segment `base_position` up to `end_offset` (not waiting)."""
        if not self.working:
            return  # (in a forked child the thread is not there: touch none of its locks)
        with self._lock:
            self._request = (directory, base_position, end_offset)
            if self._thread is None:
                thread = threading.Thread(target=self._run, name="journal-zerofill", daemon=True)
                self._ops.point("zerofill.start")
                # Recorded once started: a Ctrl+C inside `start()` left a thread that
                # never ran recorded, and `stop()` then failed to join it ("cannot join
                # thread before it is started"), a traceback in place of the interrupt.
                # (One that started meanwhile finds itself not recorded and ends.)
                thread.start()
                self._thread = thread
            else:
                self._cv.notify()

    def stop(self) -> None:
        """End the thread, waiting (bounded) for a step in flight."""
        if os.getpid() != self._pid:
            return
        with self._lock:
            thread, self._thread = self._thread, None
            self._request = None
            self._cv.notify_all()
        if thread is not None and thread is not threading.current_thread():
            thread.join(_STOP_WAIT_S)

    def _run(self) -> None:
        me = threading.current_thread()
        while True:
            with self._lock:
                while self._thread is me and self._request is None:
                    if not self._cv.wait(_IDLE_S) and self._request is None:
                        self._thread = None  # idle: the next request starts a thread
                if self._thread is not me:
                    return
                request = self._request
            assert request is not None
            try:
                more = self._step(*request)
            except Exception as e:  # logged, and writers preallocate inline meanwhile
                self._failed(request[1], e)
                self._resting_until = time.monotonic() + RETRY_S
                more = False
            else:
                if self._failure is not None and self._wrote:
                    # (Only a step that wrote zeros: one with nothing to do proves nothing.)
                    self._failure = None
                    _log.info("zero-filling segments ahead of the writer works again")
            with self._lock:
                if not more and self._request is request:
                    self._request = None

    def _failed(self, base_position: int, error: Exception) -> None:
        """Log a failed step: a warning the first time, then (the same failure, retried
        every `RETRY_S`: a full disk stays full) at debug level until a step works."""
        failure = f"{type(error).__name__}: {error}"
        repeated = failure == self._failure
        self._failure = failure
        if isinstance(error, _NoRoom):
            _log.log(
                logging.DEBUG if repeated else logging.WARNING,
                "no zeros are written ahead of the writer of segment %s until space is "
                "freed: %s (appends go on, their syncs may cost more)",
                segment_name(base_position),
                error.strerror,
            )
            return
        if isinstance(error, OSError) and error.errno == errno.EFBIG:
            # (The process's file size limit, `ulimit -f`: appends go on up to it, and a
            # frame past it fails with its own advice. A warning at every append of the
            # CLI alarmed for nothing.)
            _log.log(
                logging.DEBUG if repeated else logging.INFO,
                "no zeros are written ahead of the writer of segment %s past this process's "
                "file size limit (`ulimit -f`): %s",
                segment_name(base_position),
                error.strerror,
            )
            return
        _log.log(
            logging.DEBUG if repeated else logging.WARNING,
            "could not zero-fill segment %s ahead of the writer (%s); appends preallocate "
            "it themselves for the next %.0f s%s",
            segment_name(base_position),
            error,
            RETRY_S,
            ""
            if repeated
            else " (the filler retries; the same failure is logged at debug "
            "level until it works again)",
        )

    def _step(self, directory: str, base_position: int, end_offset: int) -> bool:
        """Write one step of zeros at the end of the segment; False once nothing is left
        (`_wrote` says whether it wrote any)."""
        self._wrote = False
        with self.busy:
            try:
                fd = open_regular(os.path.join(directory, segment_name(base_position)), os.O_WRONLY)
            except FileNotFoundError:
                return False  # sealed and compressed meanwhile
            try:
                with extension_lock(fd):
                    stat = os.fstat(fd)
                    size = stat.st_size
                    if size >= end_offset or stat.st_nlink == 0:
                        return False
                    if _newer_segment_exists(directory, base_position):
                        return False  # sealed: its zeros were cut and must stay cut
                    length = min(STEP_BYTES, end_offset - size)
                    self._ops.point("zerofill.step", (segment_name(base_position), size, length))
                    if not zeros_fit(self._ops, fd, length):
                        raise _NoRoom()
                    # A step that fails midway leaves what it wrote: a writer that saw the
                    # file grow may have put a frame there already (without this lock).
                    self._ops.fill_zeros(fd, size, length, sync=self._sync)
                    self._wrote = True
            finally:
                os.close(fd)
        self._ops.point("zerofill.filled", (segment_name(base_position), size + length))
        return size + length < end_offset


def _newer_segment_exists(directory: str, base_position: int) -> bool:
    for name in os.listdir(directory):
        if (
            name[:20].isdigit()
            and name.endswith((SEGMENT_SUFFIX, COMPRESSED_SUFFIX))
            and len(name) in (24, 28)
            and int(name[:20]) > base_position
        ):
            return True
    return False


# Every filler of this process: fork() waits until none has a segment open.
_FILLERS: Final[ForkPause[ZeroFiller]] = ForkPause()

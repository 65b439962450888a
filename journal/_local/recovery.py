"""What a writer that crashed or failed left unfinished in the segments directory,
finished by the next writer under the write lock (SPEC 7.1, `CatchUp`): temporary files
of processes that are gone, a plain segment beside its complete compressed copy, the
sidecars and marks whose segment is gone, the sidecars of sealed segments that are
missing or damaged (`finish_interrupted`), and a newest segment whose creation a crash
interrupted (`discard_unborn_tail`). `process_alive`: whether a process of this host
lives (the owner of a temporary file)."""

from __future__ import annotations

import contextlib
import logging
import os

from .files import fsync_dir
from .frames import SEGMENT_HEADER_SIZE, SIDECAR_SUFFIX, segment_name, sidecar_name
from .log import SegmentLog, segments_of
from .os_marks import mark_base
from .segments import open_segment, summarize_segment
from .sidecar import read_summary, sidecar_intact, write_summary

__all__ = ["discard_unborn_tail", "finish_interrupted", "process_alive"]

_log = logging.getLogger("journal")


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):  # (a number no process can have)
        return False
    except PermissionError:
        return True
    return True


def finish_interrupted(log: SegmentLog, *, rebuilding: bool = False) -> None:
    """Clean up after a writer that crashed mid-seal or mid-write (caller holds the
    write lock): delete temporary files of processes that are gone, a plain segment
    beside its complete `.zst` (a `.zst` is only renamed into place once complete),
    and write the sidecars of sealed segments that are missing or fail their checksum
    (`rebuilding`, before a view is rebuilt from the sidecars: that fail any of
    `read_summary`'s checks)."""
    for name in os.listdir(log.directory):
        if not name.endswith(".tmp"):
            continue
        parts = name.split(".")
        pid = int(parts[-2]) if len(parts) >= 3 and parts[-2].isdigit() else None
        if pid is not None and process_alive(pid):
            continue  # a live writer (e.g. a compaction) is still producing it
        with contextlib.suppress(FileNotFoundError):
            log.ops.unlink(os.path.join(log.directory, name))
    # Under the segment-files lock: another writer's committed retention pass deletes
    # dead segments' files after its commit, outside the writer lock, and a segment
    # deleted between the listing and its sidecar check was read here (the open
    # failed with StoreUnavailable, No such file or directory).
    with log.files_lock():
        names = os.listdir(log.directory)
        segments = segments_of(names)
        for s in segments:
            plain = os.path.join(log.directory, segment_name(s.base_position))
            if s.compressed and os.path.exists(plain):
                log.ops.unlink(plain)
        _delete_orphan_sidecars(log, names, {s.base_position for s in segments})
        for s in segments[:-1]:
            log.ops.point("open.sidecar_check", s.base_position)
            # The checksum only, but for a rebuild: decoding every sidecar and checking
            # it is consistent cost about a microsecond a frame of the store at every
            # open (175 ms for 200,000 single-event frames); `read_summary` does that
            # where one is used, and takes one that fails as absent.
            if rebuilding:
                intact = read_summary(log.directory, s.base_position) is not None
            else:
                intact = sidecar_intact(log.directory, s.base_position)
            if not intact:
                name = sidecar_name(s.base_position)
                if os.path.lexists(os.path.join(log.directory, name)):
                    # (A missing one is an interrupted seal's; a damaged one is news.)
                    _log.warning("the sidecar %s is damaged: rewriting it from its segment", name)
                elif not s.compressed and log.compress_sealed:
                    # A seal killed before its compressed copy was in place: finished
                    # as it began, or the segment stayed plain for good (SPEC 3.4).
                    try:
                        log.seal(s.base_position)
                        continue
                    except OSError as e:  # (a full disk: commits go on, plain)
                        _log.warning(
                            "could not compress the sealed segment %s (%s): it stays plain",
                            segment_name(s.base_position),
                            e,
                        )
                write_summary(
                    log.directory,
                    summarize_segment(log.directory, s.base_position, log.ops),
                    log.ops,
                    log.permissions,
                )
        fsync_dir(log.directory, log.ops)


def _delete_orphan_sidecars(log: SegmentLog, names: list[str], bases: set[int]) -> None:
    """Delete the sidecars whose segment is gone (caller holds the write lock and the
    segment-files lock): a retention pass deletes a dead segment's files one after
    another, and one stopped between them (killed, a power cut, an I/O error it logs)
    left the sidecar, which nothing reads, for good (until 2026-12-06; the store's
    size counted it). No other step makes a sidecar before its segment exists. So
    for the marks of "os" writers (`os_marks.py`; a writer makes one only in a segment
    it writes). `names`: the directory's listing, under that lock."""
    for name in names:
        sidecar = name.endswith(SIDECAR_SUFFIX) and len(name) == 24 and name[:20].isdigit()
        base = int(name[:20]) if sidecar else mark_base(name)
        if base is not None and base not in bases:
            kind = "sidecar" if sidecar else "mark"
            _log.info("deleting the %s %s: its segment is gone", kind, name)
            with contextlib.suppress(FileNotFoundError):
                log.ops.unlink(os.path.join(log.directory, name))


def discard_unborn_tail(log: SegmentLog) -> None:
    """Delete a newest plain segment shorter than its header: a creation interrupted
    by a crash (stores written before segments were born by rename). Caller holds the
    write lock."""
    segments = log.segments()
    if not segments or segments[-1].compressed:
        return
    path = os.path.join(log.directory, segment_name(segments[-1].base_position))
    fd = open_segment(path, os.O_RDONLY)  # (a FIFO is damage, not an unborn segment)
    try:
        size = os.fstat(fd).st_size
    finally:
        os.close(fd)
    if size < SEGMENT_HEADER_SIZE:
        log.ops.unlink(path)
        fsync_dir(log.directory, log.ops)

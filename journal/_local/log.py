"""The segments directory: ordered segments, the active writer, rotation and sealing
(what a crashed writer left unfinished is finished by `recovery.py`). Positions are
store-wide and dense across segments."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import struct
import threading
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from ..errors import JournalCorrupt, StoreIncompatible
from ..records import Record, encode_frame_body_into
from .compression import compress_segment
from .cut_tails import cut_tails_beside
from .files import (
    DEFAULT_FILE_OPS,
    DEFAULT_PERMISSIONS,
    FileOps,
    NotRegularFile,
    Permissions,
    fsync_dir,
    open_regular,
    write_again,
    write_atomic,
)
from .frames import (
    COMPRESSED_SUFFIX,
    DEFAULT_SEGMENT_BYTES,
    FRAME_HEADER_SIZE,
    SEGMENT_HEADER_SIZE,
    SEGMENT_SUFFIX,
    FrameInfo,
    segment_name,
)
from .segments import LogHole, SegmentReader, open_segment, summarize_segment
from .sidecar import FrameDigest, SegmentSummary, read_summary, write_summary
from .writer import SegmentWriter
from .zerofill import ZeroFiller

__all__ = ["FEED_FLOOR_FILE", "SegmentLog", "segments_of"]

_log = logging.getLogger("journal")

# A frame buffer up to this size is reused by the next append (the common batch fits).
_REUSED_FRAME_BYTES = 4 << 20

# `segments/feed-floor`: b"jff1", the floor (u64), a CRC32 of both (big-endian).
FEED_FLOOR_FILE = "feed-floor"
_FEED_FLOOR = struct.Struct(">4sQI")
_FEED_FLOOR_MAGIC = b"jff1"


@dataclass
class _Segment:
    base_position: int
    compressed: bool


class SegmentLog:
    """The segments directory: ordered segments, the active writer, rotation and sealing.

    Positions are store-wide and dense: each frame's first position is the previous frame's
    last position + 1, across segment boundaries.
    """

    def __init__(
        self,
        directory: str,
        store_id: bytes,
        *,
        segment_bytes: int = DEFAULT_SEGMENT_BYTES,
        sync: bool = True,
        compress_sealed: bool = False,
        ops: FileOps = DEFAULT_FILE_OPS,
        permissions: Permissions = DEFAULT_PERMISSIONS,
        cut_tails: str | None = None,
    ) -> None:
        if segment_bytes < 4096:
            raise ValueError("segment_bytes must be at least 4096")
        self.directory = directory
        self.store_id = store_id
        self.segment_bytes = segment_bytes
        self.sync = sync
        self.compress_sealed = compress_sealed
        self.ops = ops
        self.permissions = permissions
        # Where a writer keeps the bytes it cuts off after the last whole frame (SPEC 3.3).
        self.cut_tails = cut_tails_beside(directory) if cut_tails is None else cut_tails
        self._writer: SegmentWriter | None = None
        # Writes the active segment's zeros ahead of the writer (a thread only while asked).
        self._filler = ZeroFiller(ops, sync=sync)
        # The buffer `append_records` encodes frames into, kept between appends.
        self._frame = bytearray()
        # Where the log ended before an append whose frame could not be cut off again
        # (the undo's own write or sync failed): cut there before anything else happens.
        self._cut_pending: tuple[int, int, int] | None = None
        # Segments a sync of which failed (durability "os": frames written unsynced; any:
        # a synced write): their next sync writes their frames again first (`_synced`).
        self._sync_failed: set[int] = set()
        # (`keeping_files_lock`: the thread keeping, and the descriptor kept, if any.)
        self._keeper: int | None = None
        self._kept: int | None = None
        # With sync on: (segment, end offset, next position) up to which this process
        # knows the log is on disk (its catch-up synced it, then its own synced appends
        # followed): a catch-up at that head owes no sync (`sync_segment`).
        self._durable: tuple[int, int, int] | None = None

    # -- discovery ---------------------------------------------------------------------

    def segments(self) -> list[_Segment]:
        """Every segment in base order (a base present in both forms counts once)."""
        return segments_of(os.listdir(self.directory))

    def files(self, end: tuple[int, int] | None) -> tuple[int, int, int]:
        """(segment files, bytes of every file in the directory: sidecars included, and the
        active segment's bytes past `end`, (base, offset) where its frames end: zeros)."""
        segments = size = ahead = 0
        for name in os.listdir(self.directory):
            if name.endswith((SEGMENT_SUFFIX, COMPRESSED_SUFFIX)):
                segments += 1
            with contextlib.suppress(FileNotFoundError):
                size += (found := os.path.getsize(os.path.join(self.directory, name)))
                if end is not None and name == segment_name(end[0]):
                    ahead = max(0, found - end[1])
        return segments, size, ahead

    def bases(self) -> list[int]:
        return [s.base_position for s in self.segments()]

    # -- the lifecycle feed's floor (SPEC 7.7) ---------------------------------------------

    def feed_floor(self) -> int | None:
        """The highest position whose lifecycle feed entry a view of this store pruned
        (`segments/feed-floor`), so a view rebuilt from the log knows it; None when the
        file is missing (a store from before it was kept) or damaged (logged)."""
        path = os.path.join(self.directory, FEED_FLOOR_FILE)
        try:
            with os.fdopen(open_regular(path, os.O_RDONLY), "rb") as f:
                raw = f.read(_FEED_FLOOR.size + 1)
        except FileNotFoundError:
            return None
        except NotRegularFile:
            raw = b""  # damaged (replaced when the floor is next recorded)
        if len(raw) == _FEED_FLOOR.size:
            magic, floor, crc = _FEED_FLOOR.unpack(raw)
            if magic == _FEED_FLOOR_MAGIC and crc == zlib.crc32(raw[:-4]):
                return int(floor)
        _log.warning("%s is damaged: lifecycle cursors are judged from the log instead", path)
        return None

    def record_feed_floor(self, position: int) -> None:
        """Raise the recorded floor to `position` (or record it where none is): written
        and synced before the pruned records leave the log (the caller holds the writer
        lock)."""
        current = self.feed_floor()
        if current is not None and position <= current:
            return
        body = _FEED_FLOOR_MAGIC + position.to_bytes(8, "big")
        data = body + zlib.crc32(body).to_bytes(4, "big")
        write_atomic(
            os.path.join(self.directory, FEED_FLOOR_FILE), data, self.ops, self.permissions
        )

    def file_versions(self) -> list[tuple[str, int, int]]:
        """(name, inode, compressed size) of every segment file: what retention and
        compaction change (a run over the segments that failed or disagreed while these
        changed is repeated: `reader_views.while_files_change`, verify)."""
        found = []
        for name in sorted(os.listdir(self.directory)):
            if name.endswith((SEGMENT_SUFFIX, COMPRESSED_SUFFIX)):
                with contextlib.suppress(FileNotFoundError):
                    st = os.stat(os.path.join(self.directory, name))
                    size = st.st_size if name.endswith(COMPRESSED_SUFFIX) else 0
                    found.append((name, st.st_ino, size))
        return found

    @contextlib.contextmanager
    def files_lock(self, *, readonly: bool = False, keep: bool = False) -> Iterator[None]:
        """Serialises replacing and deleting sealed segment files across processes.

        Deletion happens after the writer's transaction commits (outside the LMDB lock),
        a compaction swap under it: this flock keeps the two from interleaving. `readonly`
        takes it through a read-only descriptor of the existing file (a reader that must
        create nothing; flock needs no write access). With `keep`, in the thread that is
        in `keeping_files_lock`, it stays held until that ends (a compaction swap: until
        its transaction is over), and it is taken again there without waiting."""
        me = threading.get_ident()
        if self._kept is not None and self._keeper == me:
            yield  # (held by this thread's commit already)
            return
        path = os.path.join(self.directory, ".files.lock")
        fd = (
            open_regular(path, os.O_RDONLY)
            if readonly
            else self.permissions.open_or_create(path, os.O_RDWR)
        )
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            if keep and self._keeper == me:
                self._kept, fd = fd, -1
            yield
        finally:
            if fd >= 0:
                os.close(fd)

    @contextlib.contextmanager
    def keeping_files_lock(self) -> Iterator[None]:
        """A writer's write transaction (entered before it, left after it): a compaction
        swap in it keeps the segment-files lock until the transaction is over, so nobody
        holding that lock sees the new files beside a view that does not know them yet
        (`verify`, SPEC 9); and no longer (the writer lock comes first: SPEC 8)."""
        self._keeper = threading.get_ident()
        try:
            yield
        finally:
            self._keeper = None
            kept, self._kept = self._kept, None
            if kept is not None:
                os.close(kept)

    def moved_past(self, segment: int, end_offset: int, next_position: int, fd: int = -1) -> bool:
        """Whether frames or segments exist past `end_offset` of `segment` (a 24-byte probe
        of that segment, through `fd` when the caller has it open)."""
        own = fd < 0
        if own:
            try:
                fd = open_segment(os.path.join(self.directory, segment_name(segment)), os.O_RDONLY)
            except FileNotFoundError:
                return True  # sealed and compressed since: a newer segment exists
        try:
            probe = self.ops.pread(fd, FRAME_HEADER_SIZE, end_offset)
            # A file ending before `end_offset` lost committed frames (cut while open):
            # "moved", so the caller re-attaches, which refuses the hole.
            cut = len(probe) < FRAME_HEADER_SIZE and os.fstat(fd).st_size < end_offset
        finally:
            if own:
                os.close(fd)
        if probe.strip(b"\0") or cut:
            return True
        if len(probe) == FRAME_HEADER_SIZE:
            # Preallocated zeros follow: nobody appended, and nobody sealed this segment
            # (sealing truncates the zeros first).
            return False
        # The file ends at `end_offset`: sealed, if a segment after it exists. (Not the
        # one named after `next_position` when no frame is in it: that is this segment,
        # born without zeros on a disk near full, and nothing moved.)
        if next_position > segment and os.path.exists(
            os.path.join(self.directory, segment_name(next_position))
        ):
            return True
        # Sealed: the segment after it may be compressed, or deleted already (retention:
        # every frame in it dead) with later ones present. (Only the plain file starting
        # at `next_position` was looked for: a read-only reader whose head was at the end
        # of a sealed segment then saw no change at any refresh, ever again.)
        return any(base > segment for base in self.bases())

    # -- writing -----------------------------------------------------------------------

    def start_first_segment(self) -> None:
        """Create the first segment of an empty log (caller holds the write lock)."""
        self.permissions.make_dirs(self.directory)
        self.close()
        self._writer = self._create_segment(1)

    def writer_at(self, segment: int, end_offset: int, next_position: int) -> bool:
        """Whether this process's writer sits exactly at the given end of the log and
        nobody (another process, a crashed writer) wrote or rotated past it since."""
        writer = self._writer
        return (
            writer is not None
            and writer.base_position == segment
            and writer.end_offset == end_offset
            and writer.next_position == next_position
            and not self.moved_past(segment, end_offset, next_position, writer.fileno())
        )

    def attach_writer(
        self, segment: int, end_offset: int, next_position: int, keep_cut: bool = True
    ) -> None:
        """Position the writer after the committed frames ending at `end_offset` of
        `segment` (known from the view), opening that segment if it is not the open one.
        `keep_cut`: bytes past the end are cut after a copy is kept (`SegmentWriter.attach`);
        False where the view itself recorded that end (nothing past it ever committed)."""
        writer = self._writer
        if writer is None or writer.base_position != segment:
            if writer is not None:
                writer.close()
                self._writer = None
            plain = os.path.join(self.directory, segment_name(segment))
            packed = os.path.join(self.directory, segment_name(segment, compressed=True))
            if not os.path.exists(plain) and os.path.exists(packed):
                # The head ends a sealed, compressed segment whose successor was never
                # born (or was discarded unborn): start it (SPEC 3.4).
                self._writer = self._create_segment(next_position)
                return
            self._writer = writer = self._open_segment(segment)
        try:
            writer.attach(end_offset, next_position, keep_cut=keep_cut)
        except OSError:
            self._unsynced_after_failure(segment)  # (a torn tail's cut's sync)
            raise

    def writer_end(self) -> tuple[int, int, int]:
        """(segment, end offset, next position) of the writer: where an append starts."""
        writer = self.writer
        return writer.base_position, writer.end_offset, writer.next_position

    def owe_cut(self, before: tuple[int, int, int]) -> None:
        """Owe the cut of the frame appended at `before` (segment, end offset, next
        position) by a batch that did not commit: `undo_append` makes it, else the next
        commit (`cut_pending_frames`)."""
        self._cut_pending = before
        # (Its synced write moved `_durable` past `before`: another writer may commit a
        # frame that ends just there, unsynced, in its place. A commit's catch-up syncs.)
        self._durable = None

    def undo_append(
        self,
        head: tuple[int, int, int] | None,
        frame: tuple[FrameInfo, list[Record]] | None = None,
    ) -> bool:
        """Cut off the frame `owe_cut` names, whose sync or view update failed (the
        transaction did not commit), so no later catch-up publishes what no caller was
        told succeeded. If the append started a new segment, that segment keeps only its
        header (the sealed one is complete). If the cut itself fails (the disk still
        refuses), the writer is dropped and the cut stays owed: `cut_pending_frames`
        makes it before the next commit.

        The caller holds the write lock again (a new transaction: the failed one released
        it), and `head` is its view's (segment, end offset, next position): everything
        past it is uncommitted, and nothing before it may be cut. Another writer
        may have taken the lock meanwhile and indexed the frame (as after a crash between
        sync and view update) and committed after it; or the failed transaction's
        catch-up had indexed another writer's refused frame before this one, which that
        writer has cut since (with this one after it), committing others there maybe.
        Then the cut is not made where this frame began (it cut acknowledged frames, or
        found the log ending before that place: `LogHole`); the next catch-up attaches
        the writer at the head.

        Returns True when `frame` (where it was written, and its records) lies before the
        head, unchanged: another writer indexed it, and it is committed."""
        before = self._cut_pending
        if before is None:
            return False
        self._cut_pending = None
        base, end_offset, next_position = before
        writer = self._writer
        if head is not None and (
            head[2] > next_position or (head[0], head[1]) > (base, end_offset)
        ):
            # (The writer is not at the head: the next catch-up re-attaches it.)
            return frame is not None and head[2] > frame[0].last_position and self._holds(*frame)
        try:
            if writer is None:
                pass  # the append failed while rotating, before any frame was written
            # (No copy of the cut is kept: it is this process's own frame, no caller was
            # told of it, and the head checked above says nobody committed it since.)
            elif writer.base_position == base:
                writer.attach(end_offset, next_position, keep_cut=False)
            else:
                writer.attach(SEGMENT_HEADER_SIZE, writer.base_position, keep_cut=False)
        except LogHole:
            if head is None or (head[0], head[1], head[2]) == before:
                raise  # (the committed frames themselves were cut: damage)
            self.close()  # the frames before this one were cut, and it with them
        except OSError:
            self._cut_pending = before
            self._unsynced_after_failure(base, *([] if writer is None else [writer.base_position]))
            self.close()
            raise
        return False

    def cut_pending_frames(self, head: tuple[int, int, int]) -> None:
        """Make a cut owed (`owe_cut`) that `undo_append` did not make (caller holds the
        write lock, before catch-up).

        `head` is the view's (segment, end offset, next position). If its next position
        is still the one before the failed append, nobody committed since, and everything
        past the head is a frame no caller was told succeeded: the head's segment is cut
        back to the head and segments after it to their header (the head may name the end
        of a segment or the start of the next one: the same place in the log). If another
        writer committed meanwhile, it indexed the frame, as after a crash between sync and
        view update: nothing is left to cut. Raises `OSError` while the disk still
        refuses; then no commit may proceed."""
        if self._cut_pending is None:
            return
        segment, end_offset, next_position = head
        if next_position == self._cut_pending[2]:
            for base in self.bases():
                if base >= segment:
                    self._cut_back(base, end_offset if base == segment else SEGMENT_HEADER_SIZE)
        self._cut_pending = None

    def _cut_back(self, base_position: int, end_offset: int) -> None:
        try:
            fd = open_segment(os.path.join(self.directory, segment_name(base_position)), os.O_RDWR)
        except FileNotFoundError:
            return  # sealed and compressed by the failed append's rotation: complete
        try:
            if os.fstat(fd).st_size > end_offset:
                self.ops.ftruncate(fd, end_offset)
                self.ops.fsync(fd)
        except OSError:
            self._unsynced_after_failure(base_position)
            raise
        finally:
            os.close(fd)

    def sync_indexed(self, start: tuple[int, int], end: tuple[int, int]) -> None:
        """Make the frames a catch-up found past the head, from `start` to `end` ((segment,
        offset) each), durable before they are indexed, when commits sync (durability
        "fsync"). No commit acknowledged them, and their writer may have died before its
        sync, or met a failed sync and then a failed cut (SPEC 14.4): after a failed
        writeback Linux marks the pages clean without writing them, so a sync writes
        nothing; the bytes are written again and synced. Else a power cut could leave a
        hole of zeros before frames acknowledged after them (the store then unreadable)."""
        if not self.sync:
            return
        one = start[0] == end[0]  # (the common case: no listing of the directory)
        for base in [start[0]] if one else [b for b in self.bases() if start[0] <= b <= end[0]]:
            try:
                fd = open_segment(os.path.join(self.directory, segment_name(base)), os.O_RDWR)
            except FileNotFoundError:
                continue  # compressed: its copy was synced before it replaced the plain file
            try:
                offset = start[1] if base == start[0] else SEGMENT_HEADER_SIZE
                stop = end[1] if base == end[0] else os.fstat(fd).st_size
                write_again(self.ops, fd, offset, stop)
                self.ops.fdatasync(fd)
            finally:
                os.close(fd)

    def sync_segment(self, head: tuple[int, int, int]) -> None:
        """Sync the plain segment of the view's `head` (segment, end offset, next position)
        with durability "fsync", unless this process knows the log is on disk up to it:
        the frames other writers committed there, before this writer's commit builds on
        them. A writer with durability "os" leaves its frames in the page cache, and a
        synced write covers only its own frame's range: a power cut left zeros before the
        acknowledged append. Sealed segments were synced at their seal. Nothing dirty: a
        cheap call (but a flush of the disk's cache still)."""
        if not self.sync or self._durable == head:
            return
        failed = [base for base in self._sync_failed if base <= head[0]]
        # (Where this writer's own synced write failed, the frames are written again first.)
        self.sync_indexed((min(failed), SEGMENT_HEADER_SIZE) if failed else head[:2], head[:2])
        self._sync_failed.difference_update(failed)
        self._durable = head

    def synced_to(self, head: tuple[int, int, int]) -> None:
        """The log is on disk up to `head` (a catch-up wrote and synced what it indexed)."""
        if self.sync:
            self._durable = head

    def _synced(self, writer: SegmentWriter, sync: Callable[[], None]) -> None:
        """Run `sync` (a sync of the active segment, or its seal's `finish`). With
        durability "os" the frames were written without a sync; after a failed one Linux
        marks their pages clean without writing them, and the next sync writes nothing
        (SPEC 14.4). So a failure is remembered, and the next sync of that segment writes
        its frames again first: until 2026-12-06 a seal after a failed `sync_committed`
        "succeeded", and a power cut left the sealed segment's frames zeros (JournalCorrupt
        where retention and compaction took its records for durable)."""
        base = writer.base_position
        if base in self._sync_failed:
            write_again(self.ops, writer.fileno(), SEGMENT_HEADER_SIZE, writer.end_offset)
        try:
            sync()
        except OSError:
            self._unsynced_after_failure(base)
            raise
        self._sync_failed.discard(base)

    def _unsynced_after_failure(self, *bases: int) -> None:
        """A sync of `bases` failed: with durability "os", `_sync_failed` remembers them."""
        if not self.sync:
            self._sync_failed.update(bases)

    def _create_segment(self, base_position: int) -> SegmentWriter:
        return SegmentWriter.create(
            self.directory,
            self.store_id,
            base_position,
            sync=self.sync,
            segment_bytes=self.segment_bytes,
            ops=self.ops,
            permissions=self.permissions,
            filler=self._filler,
            cut_tails=self.cut_tails,
        )

    def _open_segment(self, base_position: int) -> SegmentWriter:
        """Open an existing segment for appending; one of another store is refused (a
        writer never appends to a segment whose header names another store id)."""
        with SegmentReader(self.directory, base_position, self.ops) as reader:
            if reader.header.store_id != self.store_id:
                raise StoreIncompatible(
                    f"segment {reader.name} belongs to another store (its header names "
                    f"store {reader.header.store_id.hex()}, store.json "
                    f"{self.store_id.hex()}): do not mix segment files or store.json of "
                    "different stores"
                )
        return SegmentWriter(
            self.directory,
            base_position,
            sync=self.sync,
            segment_bytes=self.segment_bytes,
            ops=self.ops,
            filler=self._filler,
            permissions=self.permissions,
            cut_tails=self.cut_tails,
        )

    @property
    def writer(self) -> SegmentWriter:
        if self._writer is None:
            raise RuntimeError(
                "the segment log is not open for writing: call start_first_segment() or "
                "attach_writer()"
            )
        return self._writer

    @property
    def next_position(self) -> int:
        return self.writer.next_position

    def append(self, body: bytes, count: int, digest: FrameDigest | None = None) -> FrameInfo:
        """Append one frame of `count` records, rotating first if the segment is full."""
        frame = bytearray(FRAME_HEADER_SIZE)
        frame += body
        return self._append_frame(frame, count, digest)

    def append_records(self, records: list[Record], digest: FrameDigest | None = None) -> FrameInfo:
        """`append` of the frame holding `records`, encoded straight into a buffer this
        log reuses (after room for the frame header): no body object, no copy of it."""
        frame = self._frame
        self._frame = bytearray()  # (while in use: a failure never leaves it half-written)
        encode_frame_body_into(records, frame, FRAME_HEADER_SIZE)
        info = self._append_frame(frame, len(records), digest)
        if len(frame) <= _REUSED_FRAME_BYTES:
            self._frame = frame  # a larger one is not kept: its memory goes back
        return info

    def _holds(self, info: FrameInfo, records: list[Record]) -> bool:
        """Whether the frame of exactly `records` lies where `info` says."""
        expected = bytearray()
        encode_frame_body_into(records, expected, 0)
        try:
            with SegmentReader(self.directory, info.segment, self.ops) as reader:
                found, body = reader.read_frame(info.offset)
                return found == info and body == expected
        except (OSError, JournalCorrupt):
            return False  # (cut off, or something else written there)

    def _append_frame(self, frame: bytearray, count: int, digest: FrameDigest | None) -> FrameInfo:
        writer = self.writer
        if writer.frame_count and writer.end_offset + len(frame) > self.segment_bytes:
            self.rotate()
            writer = self.writer
        try:
            info = writer.append_frame(frame, writer.next_position, count, digest)
        except OSError:  # (with sync on, a failed sync: its pages may never reach the disk)
            self._sync_failed.add(writer.base_position)
            raise
        if self._durable is not None and self._durable[2] == info.first_position:
            # (Synced, after what was on disk: the rotation's seal synced the segment.)
            self._durable = (writer.base_position, writer.end_offset, writer.next_position)
        return info

    def sync_committed(self) -> None:
        """Make the frames committed to the active segment durable, when commits do not
        sync them (durability "os"): before retention deletes segment files, or a
        compaction swap drops frames, that the records among them (a trim, a snapshot, an
        eviction) made dead. Else a power cut leaves a log that lacks both the events and
        the record that removed them, which a rebuild reports as lost (SPEC 9, "Events
        the log lacks"). Sealed segments were synced at their seal."""
        if not self.sync and self._writer is not None:
            self._synced(self._writer, self._writer.sync)

    def rotate(self, *, compress: bool = True) -> int:
        """Seal the active segment and start a new one; returns the sealed segment's base.
        `compress=False`: not compressed even with `compress_sealed` (`compact()`'s seal,
        whose compaction writes the compressed copy of its live frames next)."""
        writer = self.writer
        sealed = writer.base_position
        next_position = writer.next_position
        known = writer.summary()
        try:
            # No filler may grow the segment again between the cut and the next segment's
            # birth (after it, fillers see that it is sealed).
            with writer.extension_locked():
                self._synced(writer, writer.finish)
                self._writer = None  # (if the next segment cannot be created, none is
                # open: the next commit's catch-up re-attaches to the segment the view names)
                self._writer = self._create_segment(next_position)
        finally:
            if self._writer is not writer:
                writer.close()
        self.seal(sealed, known, compress=compress)
        return sealed

    def seal(
        self, base_position: int, known: SegmentSummary | None = None, *, compress: bool = True
    ) -> SegmentSummary:
        """Write the sidecar of a sealed segment (compressing it first if configured and
        `compress`).

        `known` is the writer's in-memory summary; without it the segment is scanned (once:
        by the compression, when it is compressed).
        """
        compress = compress and self.compress_sealed
        if compress:
            _, summary = compress_segment(
                self.directory,
                base_position,
                ops=self.ops,
                permissions=self.permissions,
                summarize=known is None,
            )
            if known is not None:
                known.blocks, summary = summary.blocks, known
        else:
            summary = (
                known
                if known is not None
                else summarize_segment(self.directory, base_position, self.ops)
            )
        write_summary(self.directory, summary, self.ops, self.permissions)
        if compress:
            self.ops.unlink(os.path.join(self.directory, segment_name(base_position)))
            fsync_dir(self.directory, self.ops)
        return summary

    def close(self) -> None:
        """Close the writer and end the zero-filler's thread (the next writer restarts it)."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        self._filler.stop()

    # -- reading -----------------------------------------------------------------------

    def summary(self, base_position: int) -> SegmentSummary | None:
        return read_summary(self.directory, base_position)

    def frames(
        self, from_position: int = 1, *, bases: Sequence[int] | None = None
    ) -> Iterator[tuple[FrameInfo, memoryview]]:
        """Every frame holding positions >= `from_position`, in order, across segments.

        The highest segment is read as the active one (its unfinished tail ends the
        iteration); every other segment must verify completely.
        """
        all_bases = list(bases) if bases is not None else self.bases()
        start = 0
        for i, base in enumerate(all_bases):
            if base <= from_position:
                start = i
        for i in range(start, len(all_bases)):
            base = all_bases[i]
            active = i == len(all_bases) - 1
            offset = SEGMENT_HEADER_SIZE
            if not active and base <= from_position:
                summary = read_summary(self.directory, base)
                if summary is not None:
                    offset = summary.frame_at_or_before(from_position)
            with SegmentReader(self.directory, base, self.ops) as reader:
                for info, body in reader.frames(offset, tail=active):
                    if info.last_position >= from_position:
                        yield info, body


def segments_of(names: list[str]) -> list[_Segment]:
    """The segments a listing of the segments directory names, in base order."""
    found: dict[int, bool] = {}
    for name in names:
        if name.endswith(COMPRESSED_SUFFIX) and name[:20].isdigit() and len(name) == 28:
            found[int(name[:20])] = True
        elif name.endswith(SEGMENT_SUFFIX) and name[:20].isdigit() and len(name) == 24:
            found.setdefault(int(name[:20]), False)
    return [_Segment(base, found[base]) for base in sorted(found)]

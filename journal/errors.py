"""The journal's error hierarchy: every error has a stable `code`, a gRPC-style `status`
and a message that says what to do next.

The root class `JournalError` and the cursor/page-token errors live in `cursors` (the bottom
of the dependency graph) and are re-exported here, so `except journal.JournalError` catches
every error the distribution raises.
"""

from cursors import (
    CursorExpired,
    CursorForeign,
    CursorFuture,
    CursorMalformed,
    InvalidPageToken,
    JournalError,
    KeyRingError,
    TokenError,
)

__all__ = [
    "ArchiveInvalid",
    "CursorExpired",
    "CursorForeign",
    "CursorFuture",
    "CursorMalformed",
    "ExportIncomplete",
    "IdempotencyKeyReused",
    "IllegalTransition",
    "InvalidArgument",
    "InvalidPageToken",
    "JournalClosed",
    "JournalCorrupt",
    "JournalError",
    "KeyRingError",
    "OrdinalConflict",
    "OutcomeUnknown",
    "OwnerBusy",
    "ReadOnlyStore",
    "SessionExists",
    "SessionNotFound",
    "SessionNotWritable",
    "StoreIncompatible",
    "StoreNotFound",
    "StoreUnavailable",
    "TokenError",
    "TurnSettled",
    "Unsupported",
    "WriteOutcomeUnknown",
]


class JournalCorrupt(JournalError):
    """Bytes the log already committed no longer verify (checksum, framing or header).

    Raised where a reader meets damage it must not skip: anywhere except the unfinished tail
    of the active segment, which is "not yet written" rather than corrupt. `segment` is the
    file name and `offset` the byte offset (in the uncompressed segment) of the damage, or
    `index` (offset 0) for the LMDB view, which `verify(fix=True)` rebuilds from the log.
    """

    code = "JOURNAL_CORRUPT"
    status = "DATA_LOSS"

    def __init__(self, segment: str, offset: int, detail: str, *, way: str | None = None) -> None:
        """`way`: what to do, instead of restoring `segment` (the damage is elsewhere:
        `segment` only locates it, like the frame after a lost segment file's events)."""
        self.segment = segment
        self.offset = offset
        self.detail = detail
        if segment == "index":
            # The view is derived from the log: its damage is repaired, not restored.
            super().__init__(f"corrupt journal view (index/): {detail}")
            return
        if way is None:
            way = "run `journal verify` to list all damage, and restore the segment from a backup"
        super().__init__(
            f"corrupt journal data in segment {segment} at byte offset {offset}: {detail}; {way}"
        )


class StoreIncompatible(JournalError):
    """The files belong to another store or to a format version this code cannot read."""

    code = "STORE_INCOMPATIBLE"
    status = "FAILED_PRECONDITION"


class InvalidArgument(JournalError):
    """The call's arguments are wrong (type, size, range; a store path that is a file, or
    where no store may be created: a directory of other files, inside another store);
    nothing was written."""

    code = "INVALID_ARGUMENT"
    status = "INVALID_ARGUMENT"


class SessionExists(JournalError):
    """`create_session` named a session that already exists (in any state)."""

    code = "SESSION_EXISTS"
    status = "ALREADY_EXISTS"

    @classmethod
    def imported_over(cls, taken: list[str], meanwhile: bool = False) -> "SessionExists":
        """The error of an import of which the ids `taken` exist in the store already
        (`meanwhile`: created by another writer while it ran); nothing was imported."""
        names = ", ".join(map(repr, taken[:10])) + (" ..." if len(taken) > 10 else "")
        when = " (created meanwhile by another writer)" if meanwhile else " already"
        return cls(
            f"{len(taken)} of the archive's sessions "
            f"{'exists' if len(taken) == 1 else 'exist'} in this store{when} ({names}): "
            "nothing was imported; import them under other ids (rename=, or `journal "
            "import --as NEW_ID` / `--rename OLD=NEW`)"
        )


class SessionNotFound(JournalError):
    """No session by that id exists (never created, or evicted)."""

    code = "SESSION_NOT_FOUND"
    status = "NOT_FOUND"


class IllegalTransition(JournalError):
    """The lifecycle transition is not allowed from the session's current state."""

    code = "ILLEGAL_TRANSITION"
    status = "FAILED_PRECONDITION"


class SessionNotWritable(JournalError):
    """Appends are refused: the session is suspended (resume it) or terminal."""

    code = "SESSION_NOT_WRITABLE"
    status = "FAILED_PRECONDITION"


class OrdinalConflict(JournalError):
    """`expected_last_ordinal` did not match the session's last ordinal; nothing written."""

    code = "ORDINAL_CONFLICT"
    status = "ABORTED"

    def __init__(self, message: str, *, expected: int, actual: int) -> None:
        self.expected = expected
        self.actual = actual
        super().__init__(message)


class IdempotencyKeyReused(JournalError):
    """An idempotency key was used again with different events; nothing written."""

    code = "IDEMPOTENCY_KEY_REUSED"
    status = "FAILED_PRECONDITION"


class ReadOnlyStore(JournalError):
    """A write was attempted on a journal opened with `readonly=True`."""

    code = "READ_ONLY"
    status = "FAILED_PRECONDITION"


class StoreUnavailable(JournalError):
    """The store's files cannot be opened, created, written, synced or read (permissions,
    a file in the way, a full disk, an I/O error), or a `nats://` store's servers do not
    answer (or its client, nats-py of the `jetstream` extra, is not installed). `errno`
    is the OS error number when an OS call failed (None otherwise). A write that raises
    it was not committed, except where that is not known: a `nats://`
    store's write whose replies stopped mid-write (SPEC 16.3), or a local store's write
    whose frame could not be cut off again (SPEC 14.4), raises the subclass
    `WriteOutcomeUnknown`."""

    code = "STORE_UNAVAILABLE"
    status = "UNAVAILABLE"

    def __init__(self, message: str, *, errno: int | None = None) -> None:
        super().__init__(message)
        self.errno = errno


class WriteOutcomeUnknown(StoreUnavailable):
    """A write whose outcome is not known: it may have committed, or may commit later.
    Look (get_session, read) before writing it again; an append retried with the same
    idempotency key is safe. Catch it before `StoreUnavailable`, whose writes were not
    committed: its status is UNKNOWN, not UNAVAILABLE, since "retry once the store
    answers" would write it twice if it committed (the CLI exits 8, not 9).

    Raised by a `nats://` store whose replies stopped mid-write, an import's commit
    included (SPEC 16.3): the batch was sent and may be stored later. And by a local
    store when a commit failed after its frame was written and the disk also refused to
    cut the frame off again (SPEC 14.4): this journal's next commit cuts it (not
    committed), but if the journal is closed or this process ends first, or another
    process writes first, that writer indexes it (committed). Both were a plain
    `StoreUnavailable` until 2026-12-06. Also when the view was found damaged after the
    frame was written (the cut needs its write transaction): the view's rebuild
    (`verify(fix=True)`) indexes the frame, committed."""

    code = "WRITE_OUTCOME_UNKNOWN"
    status = "UNKNOWN"


class Unsupported(JournalError):
    """The store's engine cannot do what was asked (for example importing an archive into
    a `nats://` store); the message names the limitation and the nearest thing that
    works. Nothing was changed."""

    code = "UNSUPPORTED"
    status = "UNIMPLEMENTED"


class StoreNotFound(JournalError):
    """The path holds no store and `create=False` was given; or a `nats://` store's
    stream was deleted while the journal was open (SPEC 16: no retry mends it)."""

    code = "STORE_NOT_FOUND"
    status = "NOT_FOUND"


class JournalClosed(JournalError):
    """The journal was closed by this process; open it again to continue."""

    code = "JOURNAL_CLOSED"
    status = "FAILED_PRECONDITION"

    @classmethod
    def already(cls) -> "JournalClosed":
        """The error of a call on a journal that is closed."""
        return cls("this journal is closed; open it again with Journal.open()")

    @classmethod
    def meanwhile(cls, call: str = "the call ran") -> "JournalClosed":
        """The error of a call that another thread's `close()` cut short (`call`: while
        what happened)."""
        return cls(
            f"this journal was closed (by another thread) while {call}; open it again "
            "with Journal.open()"
        )

    @classmethod
    def mid_write(cls) -> "JournalClosed":
        """The error of a write that another thread's `close()` cut short after it may
        have reached the store (a networked engine's request in flight)."""
        return cls(
            "this journal was closed (by another thread) while the change was being "
            "written: it may have committed (the servers may have stored it); open it "
            "again with Journal.open() and look (get_session) before writing it again "
            "(an append retried with the same idempotency_key is safe)"
        )

    @classmethod
    def closing(cls, request_id: str, session_id: str) -> "JournalClosed":
        """The error of a turn started once its journal's close had begun."""
        return cls(
            f"turn {request_id!r} of session {session_id!r} did not start: this journal is "
            "closing (its close() waits for the turns running and starts no new one); "
            "open it again with Journal.open() to run it"
        )

    @classmethod
    def during_turn(cls, request_id: str, session_id: str, what: str) -> "JournalClosed":
        """The error of a write of a running turn (`what` it wrote) that the journal's
        close refused or cut short."""
        return cls(
            f"this journal was closed while turn {request_id!r} of session {session_id!r} "
            f"ran, so {what} could not be written: unless the turn's result was, the "
            "session's next owner records the turn as failed (WATCH_OUTCOME_UNKNOWN). A "
            "close() from another thread waits for a running turn's block to end; one "
            "from inside the block, on a thread running an asyncio event loop, or cut "
            "short by a Ctrl+C does not: close the journal once the turn has ended"
        )

    @classmethod
    def inherited(cls, why: str) -> "JournalClosed":
        """The error of a journal used in a forked child of the process that opened it
        (`why`: what does not survive fork)."""
        return cls(
            "this journal was opened in a parent process; a forked child must call "
            f"Journal.open() itself ({why})"
        )


class OwnerBusy(JournalError):
    """`own()` found the session's owner lease held by a live process (after waiting up
    to `wait_s`); `pid` is that owner's process id (0 when it is not known yet)."""

    code = "OWNER_BUSY"
    status = "FAILED_PRECONDITION"

    def __init__(self, message: str, *, pid: int) -> None:
        self.pid = pid
        super().__init__(message)

    @classmethod
    def held(cls, session_id: str, pid: int, holder: str, this_process: bool) -> "OwnerBusy":
        """The error of an `own()` that found the lease held by `holder` (process `pid`,
        0 if unknown), which is a thread of this very process when `this_process`."""
        if this_process:
            return cls(
                f"session {session_id!r} is owned by this process already: release that "
                "Owner (or leave its `with` block) before owning the session again, or, "
                "if another thread of this process owns it for a while, pass a longer "
                "wait_s",
                pid=pid,
            )
        return cls(
            f"session {session_id!r} is owned by {holder}: wait for it to finish, or pass "
            "a longer wait_s",
            pid=pid,
        )


class OutcomeUnknown(JournalError):
    """A turn was started and never settled, and its owner process is gone (or the
    session ended first): whether its effects happened is unknown. `request_id` names the
    turn; `cursor` is that of the last event delivered (resume from it after recovery;
    None when nothing was delivered and the watch started without a cursor).
    `session_ended` is True when the session is terminal: nobody can settle the turn any
    more, so resuming raises this again (everything up to `cursor` was delivered)."""

    code = "WATCH_OUTCOME_UNKNOWN"
    status = "UNKNOWN"

    def __init__(
        self,
        message: str,
        *,
        request_id: str,
        cursor: str | None,
        session_ended: bool = False,
    ) -> None:
        self.request_id = request_id
        self.cursor = cursor
        self.session_ended = session_ended
        super().__init__(message)


class TurnSettled(JournalError):
    """`owner.turn(request_id)` named a turn of the session that has ended already: a
    request id runs once, so a retry is answered with the outcome recorded, not run
    again. `request_id` names it; `result` is its recorded result (the `turn_result`
    data: `{"status": ..., "error": {...}}`); `cursor` is that of its `turn_result`
    event, None while this owner has not recorded it yet (its write failed; it is
    recorded before the owner's next turn)."""

    code = "TURN_SETTLED"
    status = "ALREADY_EXISTS"

    def __init__(
        self, message: str, *, request_id: str, result: dict[str, object], cursor: str | None
    ) -> None:
        self.request_id = request_id
        self.result = result
        self.cursor = cursor
        super().__init__(message)


class ArchiveInvalid(JournalError):
    """An archive given to `import_sessions` cannot be imported; nothing was written.
    `read_archive_contents` raises it for the same archives, with the same fields.

    `reason` says why, one of `ARCHIVE_REASONS` (SPEC.md, "Archives"); `offset` is the
    position in the archive's decompressed content where the problem was found (0 when
    it concerns the whole archive)."""

    code = "ARCHIVE_INVALID"
    status = "INVALID_ARGUMENT"

    def __init__(self, reason: str, detail: str, *, offset: int = 0) -> None:
        self.reason = reason
        self.detail = detail
        self.offset = offset
        # (A file's bytes are compressed: a content offset said as "at byte N" read as a
        # place in the file, and "at byte 0" of a file cut at 100 bytes as nothing.)
        where = f" at byte {offset} of its decompressed content" if offset else ""
        super().__init__(f"invalid archive ({reason}){where}: {detail}; nothing was imported")


class ExportIncomplete(JournalError):
    """A session lost history it was being exported with (evicted, trimmed by retention
    or compacted while the export read it); nothing was left at the destination path.
    Export again: the new export starts from what is retained then."""

    code = "EXPORT_INCOMPLETE"
    status = "ABORTED"

"""session-journal: an event-sourced journal and replay engine for agent runtimes.

The public API is what this module exports; every other module is private.
"""

from __future__ import annotations

from .archive import ARCHIVE_REASONS as ARCHIVE_REASONS
from .archive import ArchiveLimits as ArchiveLimits
from .archive_contents import read_archive_contents as read_archive_contents
from .arguments import DEFAULT_PAGE_BYTES as DEFAULT_PAGE_BYTES
from .arguments import MAX_BATCH_BYTES as MAX_BATCH_BYTES
from .arguments import MAX_BATCH_EVENTS as MAX_BATCH_EVENTS
from .arguments import MAX_EVENT_BYTES as MAX_EVENT_BYTES
from .arguments import MAX_PAGE_SIZE as MAX_PAGE_SIZE
from .arguments import REPLAY_PAGE_BYTES as REPLAY_PAGE_BYTES
from .errors import ArchiveInvalid as ArchiveInvalid
from .errors import CursorExpired as CursorExpired
from .errors import CursorForeign as CursorForeign
from .errors import CursorFuture as CursorFuture
from .errors import CursorMalformed as CursorMalformed
from .errors import ExportIncomplete as ExportIncomplete
from .errors import IdempotencyKeyReused as IdempotencyKeyReused
from .errors import IllegalTransition as IllegalTransition
from .errors import InvalidArgument as InvalidArgument
from .errors import InvalidPageToken as InvalidPageToken
from .errors import JournalClosed as JournalClosed
from .errors import JournalCorrupt as JournalCorrupt
from .errors import JournalError as JournalError
from .errors import KeyRingError as KeyRingError
from .errors import OrdinalConflict as OrdinalConflict
from .errors import OutcomeUnknown as OutcomeUnknown
from .errors import OwnerBusy as OwnerBusy
from .errors import ReadOnlyStore as ReadOnlyStore
from .errors import SessionExists as SessionExists
from .errors import SessionNotFound as SessionNotFound
from .errors import SessionNotWritable as SessionNotWritable
from .errors import StoreIncompatible as StoreIncompatible
from .errors import StoreNotFound as StoreNotFound
from .errors import StoreUnavailable as StoreUnavailable
from .errors import TokenError as TokenError
from .errors import TurnSettled as TurnSettled
from .errors import Unsupported as Unsupported
from .errors import WriteOutcomeUnknown as WriteOutcomeUnknown
from .facade import Journal as Journal
from .fold_codecs import Codec as Codec
from .fold_codecs import JsonCodec as JsonCodec
from .folds import STATE_CHANGED as STATE_CHANGED
from .folds import Fold as Fold
from .follow import Stream as Stream
from .models import AppendResult as AppendResult
from .models import ArchiveContents as ArchiveContents
from .models import ArchivedSession as ArchivedSession
from .models import CompactionReport as CompactionReport
from .models import Event as Event
from .models import EventIn as EventIn
from .models import ExportReport as ExportReport
from .models import ImportedFrom as ImportedFrom
from .models import ImportedSession as ImportedSession
from .models import ImportReport as ImportReport
from .models import LifecycleEvent as LifecycleEvent
from .models import LifecycleEventType as LifecycleEventType
from .models import OwnerInfo as OwnerInfo
from .models import Page as Page
from .models import RetentionPolicy as RetentionPolicy
from .models import RetentionReport as RetentionReport
from .models import SessionMetadata as SessionMetadata
from .models import SessionPage as SessionPage
from .models import SessionState as SessionState
from .models import Snapshot as Snapshot
from .models import StoreStats as StoreStats
from .models import VerifyProblem as VerifyProblem
from .models import VerifyReport as VerifyReport
from .records import TURN_RESULT as TURN_RESULT
from .records import TURN_STARTED as TURN_STARTED
from .subscriptions import Subscription as Subscription
from .turns import Owner as Owner
from .turns import Turn as Turn

__version__ = "0.1.0"

__all__ = [
    "ARCHIVE_REASONS",
    "DEFAULT_PAGE_BYTES",
    "MAX_BATCH_BYTES",
    "MAX_BATCH_EVENTS",
    "MAX_EVENT_BYTES",
    "MAX_PAGE_SIZE",
    "REPLAY_PAGE_BYTES",
    "STATE_CHANGED",
    "TURN_RESULT",
    "TURN_STARTED",
    "AppendResult",
    "ArchiveContents",
    "ArchiveInvalid",
    "ArchiveLimits",
    "ArchivedSession",
    "Codec",
    "CompactionReport",
    "CursorExpired",
    "CursorForeign",
    "CursorFuture",
    "CursorMalformed",
    "Event",
    "EventIn",
    "ExportIncomplete",
    "ExportReport",
    "Fold",
    "IdempotencyKeyReused",
    "IllegalTransition",
    "ImportReport",
    "ImportedFrom",
    "ImportedSession",
    "InvalidArgument",
    "InvalidPageToken",
    "Journal",
    "JournalClosed",
    "JournalCorrupt",
    "JournalError",
    "JsonCodec",
    "KeyRingError",
    "LifecycleEvent",
    "LifecycleEventType",
    "OrdinalConflict",
    "OutcomeUnknown",
    "Owner",
    "OwnerBusy",
    "OwnerInfo",
    "Page",
    "ReadOnlyStore",
    "RetentionPolicy",
    "RetentionReport",
    "SessionExists",
    "SessionMetadata",
    "SessionNotFound",
    "SessionNotWritable",
    "SessionPage",
    "SessionState",
    "Snapshot",
    "StoreIncompatible",
    "StoreNotFound",
    "StoreStats",
    "StoreUnavailable",
    "Stream",
    "Subscription",
    "TokenError",
    "Turn",
    "TurnSettled",
    "Unsupported",
    "VerifyProblem",
    "VerifyReport",
    "WriteOutcomeUnknown",
    "__version__",
    "read_archive_contents",
]

# Public classes report the module users import them from (pickle, repr, docs), as trio
# does; the cursor errors keep theirs (`cursors` is a public package of its own).
for _name in __all__:
    _obj = globals()[_name]
    if isinstance(_obj, type) and _obj.__module__.startswith("journal."):
        _obj.__module__ = "journal"
del _name, _obj

"""`journal compact`, `journal verify` and `journal stats`: long-running store maintenance,
with a progress bar on a terminal (`progress_bar`, shared with export and import)."""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import click

import journal
from cursors import KeyRing
from journal.arguments import check_store_path
from journal.store_owner import (
    no_store_at,
    refuse_another_users_private_store,
    refuse_unfinished,
)

from .interrupts import CtrlC, ctrl_c_noted, said_if_interrupted, said_if_stopped
from .output import (
    CommandFailed,
    NumberOption,
    Settings,
    Share,
    WholeNumber,
    is_nats,
    pass_settings,
)
from .rendering import plural


@contextmanager
def progress_bar(label: str, enabled: bool) -> Iterator[Callable[[int, int], None] | None]:
    """A click progress bar on stderr when it is a terminal; a no-op otherwise."""
    if not enabled or not sys.stderr.isatty():
        yield None
        return
    bar = click.progressbar(length=1, label=label, file=sys.stderr)
    state = {"done": 0}

    def update(done: int, total: int) -> None:
        bar.length = max(total, 1)
        bar.update(done - state["done"])
        state["done"] = done

    with bar:
        yield update


@click.command()
@click.option(
    "--dead-share",
    cls=NumberOption,
    type=Share(0.0, 1.0),
    metavar="X",
    default=0.5,
    show_default=True,
    help="Rewrite a sealed segment when at least this share of it is dead.",
)
@pass_settings
def compact(settings: Settings, dead_share: float) -> None:
    """Reclaim space: apply retention, delete dead segments, rewrite mostly dead ones.

    The active segment is sealed first (the next append starts a new one) when at least
    1 MiB (half a segment, if less) and --dead-share of its frames' bytes are dead, so its
    space comes back too.

    Positions, ordinals and cursors do not change; writers and watchers may keep running.
    On a nats:// store (no segments) it applies the retention policy only.

    It does not compact a session into a snapshot: the snapshot is the application's
    state, made where its events are folded (in Python, a fold's snapshot(compact=True)
    or Journal.compact_session); `journal sessions snapshot ID` prints one.
    """
    output = settings.output
    finished = False

    def said(_: KeyboardInterrupt) -> str:
        return _compact_interrupted(is_nats(settings.store), ctrl_c.reported, finished)

    with said_if_interrupted(said), ctrl_c_noted() as ctrl_c:
        with (
            settings.open() as store,
            progress_bar("compacting", output.format == "text") as bar,
        ):
            # (A local compaction applies retention itself; JetStream's has nothing else.)
            retention = store.apply_retention() if is_nats(settings.store) else None
            report = store.compact(dead_share=dead_share, progress=ctrl_c.progress(bar))
        finished = True
        ctrl_c.check()
    if retention is not None:
        output.emit(
            {
                "trimmed_sessions": retention.trimmed_sessions,
                "evicted_sessions": retention.evicted_sessions,
            },
            f"retention: {_count(len(retention.evicted_sessions), 'session')} evicted, "
            f"{len(retention.trimmed_sessions)} trimmed",
        )
    trimmed, evicted = (
        (report.trimmed_sessions, report.evicted_sessions)
        if retention is None
        else (retention.trimmed_sessions, retention.evicted_sessions)
    )
    if retention is None and (trimmed or evicted) and not output.json:
        # (A local compaction's own retention passes: said in text only when they did
        # something, so a store without a window prints one line, as before.)
        output.emit(
            {}, f"retention: {_count(len(evicted), 'session')} evicted, {len(trimmed)} trimmed"
        )
    record: dict[str, object] = {
        "trimmed_sessions": trimmed,
        "evicted_sessions": evicted,
        "segments_rewritten": report.segments_rewritten,
        "segments_deleted": report.segments_deleted,
        "bytes_before": report.bytes_before,
        "bytes_after": report.bytes_after,
        "live_bytes_copied": report.live_bytes_copied,
        "seconds": round(report.seconds, 3),
        "active_frame_bytes": report.active_frame_bytes,
        "active_dead_bytes": report.active_dead_bytes,
    }
    text = (
        f"compacted: {_count(len(report.segments_rewritten), 'segment')} rewritten, "
        f"{len(report.segments_deleted)} deleted; sealed bytes {report.bytes_before:,} -> "
        f"{report.bytes_after:,} in {report.seconds:.2f} s"
        if retention is None
        # (a stream has no segments: "0 segments rewritten; sealed bytes 0 -> 0" said
        # nothing there)
        else "nothing else to compact: the NATS servers compact the stream's files"
    )
    why = None if retention is not None else nothing_reclaimed(report)
    record["nothing_reclaimed"] = why
    if why is not None:
        because = NOTHING_RECLAIMED[why].format(dead_share=dead_share, active=active_frames(report))
        text += f"\nnothing reclaimed: {because}"
    output.emit(record, text)


# Why a compaction of a local store reclaimed nothing, as its report tells (the JSON
# summary's `nothing_reclaimed`, SPEC 13), and what the text says of it.
NOTHING_RECLAIMED = {
    "only_active_segment": (
        "there is no sealed segment, only the active one{active}; compact seals it (and "
        "compacts it) once at least 1 MiB (half a segment, if less) and --dead-share "
        "{dead_share} of its frames' bytes are dead, and a writer seals it when it is full. "
        "The events of one append share a frame, which stays while any record in it lives: "
        "the append that created a session also holds the session's creation record, "
        "which lives as long as the session (`journal sessions create ID` creates one in a "
        "frame of its own)"
    ),
    "reclaimed_meanwhile": (
        "this run rewrote and deleted no segment; the sealed bytes went down meanwhile, "
        "by another process's compaction or retention pass (the bytes above are the "
        "store's, before and after this run)"
    ),
    "below_dead_share": (
        "no sealed segment is all dead, or at least --dead-share {dead_share} dead. Events "
        "die when their session's retention window trims them (`journal retention`), when "
        "a snapshot compacts them, or when their session is evicted; the events of one "
        "append leave the disk together, once all of them are dead"
    ),
}


def active_frames(report: journal.CompactionReport) -> str:
    """What the seal's decision found in the active segment, as "only the active one"
    goes on in `NOTHING_RECLAIMED` (its frames' bytes, without the zeros ahead of them)."""
    frames, dead = report.active_frame_bytes, report.active_dead_bytes
    if not frames:
        return ""
    if dead is None:
        return f", whose frames hold {frames:,} bytes"
    # (The share rounded down: passed as --dead-share, it seals the segment, where the
    # nearest, 0.34 for 336 of 1,000, sealed nothing.)
    hundredths = dead * 100 // frames
    share = f"{hundredths // 100}.{hundredths % 100:02d}"
    return f", whose frames hold {frames:,} bytes, {dead:,} of them dead ({share})"


def nothing_reclaimed(report: journal.CompactionReport) -> str | None:
    """Why a local compaction reclaimed nothing (a key of `NOTHING_RECLAIMED`), or None
    when it did reclaim: no sealed bytes before means no sealed segment, even after the
    seal a compaction makes when the active segment is worth it."""
    if report.segments_rewritten or report.segments_deleted:
        return None
    if report.bytes_after < report.bytes_before:
        return "reclaimed_meanwhile"
    return "only_active_segment" if report.bytes_before == 0 else "below_dead_share"


@click.command()
@click.option(
    "--fix",
    is_flag=True,
    help="Rewrite bad sidecars and rebuild the index; cut the active segment at damage "
    'that a power cut of a store written with durability "os" left (a copy is kept in '
    "cut-tails/).",
)
@click.option(
    "--cut-durable",
    is_flag=True,
    help='With --fix: cut at such damage also where only durability "fsync" writers wrote '
    "the segment (damage to the disk: the events after it were durable; a copy is kept). "
    "Restore the segment from a backup instead when you have one.",
)
@pass_settings
def verify(settings: Settings, fix: bool, cut_durable: bool) -> None:
    """Check every frame checksum, every sidecar and the index against the log.

    Exits non-zero (7) when a problem remains; --fix repairs what can be repaired.
    """
    if cut_durable and not fix:
        raise click.UsageError("--cut-durable goes with --fix (it says what the fix may cut)")
    if cut_durable and is_nats(settings.store):
        raise click.UsageError("--cut-durable is for stores on disk: a nats:// store has none")
    repair: bool | str = "cut-durable" if cut_durable else fix and not is_nats(settings.store)
    output = settings.output
    finished = False

    def said(how: str) -> str:
        return _verify_interrupted(fix, ctrl_c, finished, how)

    # (SIGTERM and SIGHUP too: their default action left the view it rebuilds in the
    # temporary directory, SPEC section 9)
    with said_if_stopped(said), ctrl_c_noted() as ctrl_c:
        with (
            settings.open(write=fix, repair=repair) as store,
            progress_bar("verifying", output.format == "text") as bar,
        ):
            report = store.verify(fix=fix, progress=ctrl_c.progress(bar))
        finished = True
        ctrl_c.check()
    for problem in report.problems:
        output.emit(
            {"segment": problem.segment, "offset": problem.offset, "problem": problem.what},
            f"{problem.segment} @ {problem.offset}: {problem.what}",
        )
    # (The library's `fixed` says the view was rebuilt, which --fix does whenever the log
    # is intact; the user asks whether anything was wrong and is now repaired.)
    repaired = report.fixed and bool(report.problems)
    summary: dict[str, object] = {
        "ok": report.ok,
        "fixed": repaired,
        "segments": report.segments,
        "frames": report.frames,
        "records": report.records,
    }
    if is_nats(settings.store):
        # (a stream has no segments or frames: its report counts sessions and events,
        # SPEC 16; the JSON keeps the report's own keys too, which scripts read)
        summary |= {"sessions": report.frames, "events": report.records}
        checked = f"{plural(report.frames, 'session')}, {plural(report.records, 'event')}"
    else:
        checked = (
            f"{plural(report.segments, 'segment')}, {plural(report.frames, 'frame')}, "
            f"{plural(report.records, 'record')}"
        )
    summary["problems"] = len(report.problems)
    text = f"verify: {checked}, {plural(len(report.problems), 'problem')}"
    if repaired:
        text += " (repaired)"
    elif fix and report.ok:
        text += " (--fix: nothing left to repair)"
    tails, kept_in = _cut_tails(settings.store)
    if tails:
        summary["cut_tails"] = tails
        text += (
            f"\nnote: {plural(tails, 'cut tail')} kept in {kept_in}: bytes a writer cut off "
            "after a segment's last whole frame (a torn write, or a damaged last frame), or "
            "from damage on (what verify --fix cut); "
            "inspect, then delete them"
        )
    output.emit(summary, text)
    if not report.ok:
        advice = (
            "they remain after --fix: restore the damaged segments from a backup"
            if fix
            else "`journal verify --fix` rebuilds sidecars and the index; restore damaged "
            "segments from a backup"
        )
        raise CommandFailed(
            f"{plural(len(report.problems), 'problem')} in the store: {advice}",
            code="VERIFY_FAILED",
            status="DATA_LOSS",
        )


def _compact_interrupted(nats: bool, reported: tuple[int, int] | None, finished: bool) -> str:
    """What an interrupted compaction did. Each step of one is whole or not done (SPEC 8:
    a retention pass is a commit, a rewritten segment is renamed into place under the
    writer lock, its temporary copy removed otherwise), so any point leaves a consistent
    store; the last progress report (`reported`: sealed segments gone through, of all)
    says how far it got."""
    again = "run `journal compact` again to finish"
    if finished:
        return "interrupted after the compaction finished (its report was not printed)"
    if nats:
        return (
            f"interrupted: the retention pass may have trimmed some sessions (each whole); {again}"
        )
    if reported is None:
        return (
            "interrupted before any sealed segment was rewritten (the retention pass may "
            f"have deleted all-dead segments, and the active segment may have been sealed); {again}"
        )
    done, total = reported
    return (
        f"interrupted after {done} of {plural(total, 'sealed segment')}: each was rewritten "
        f"whole or left as it was, so the store is consistent; {again}"
    )


def _verify_interrupted(fix: bool, ctrl_c: CtrlC, finished: bool, how: str) -> str:
    """What an interrupted verify did (`how`: "interrupted", "stopped by SIGTERM"). The
    check only reads; --fix rewrites bad sidecars (each replaced whole) and rebuilds the
    index in one commit, both after the last progress report (`ctrl_c.reported`: bytes
    of the log checked, of all), so a Ctrl+C raised at a report, or before the last,
    changed nothing."""
    if finished:
        what = "the check and its repairs" if fix else "the check"
        return (
            f"{how} after {what} finished (the report was not printed): run "
            "`journal verify` to see it"
        )
    done, total = ctrl_c.reported or (0, 0)
    if not fix or total == 0 or done < total or ctrl_c.raised_at_report:
        checked = (
            f"with {done * 100 // total}% of the log checked"
            if total
            else "before any segment was checked"
        )
        return (
            f"{how}: the check stopped {checked}; nothing in the store was changed; "
            f"run `journal verify{' --fix' if fix else ''}` again for a full check"
        )
    return (
        f"{how} as the repairs were made: bad sidecars rewritten so far stay (each "
        "was replaced whole), and the index was rebuilt in one commit or not at all; run "
        "`journal verify --fix` again: it repairs what is left"
    )


def _cut_tails(store: str) -> tuple[int, str]:
    """How many copies of cut-off bytes a local store keeps (SPEC 3.3), and where."""
    if is_nats(store):
        return 0, ""
    directory = os.path.join(store, "cut-tails")  # (SPEC 7: the store's layout)
    try:
        names = os.listdir(directory)
    except OSError:
        return 0, directory
    return sum(name.endswith(".tail") for name in names), directory


@click.command()
@pass_settings
def stats(settings: Settings) -> None:
    """Sizes of the store: sessions by state, segments and bytes on disk."""
    output = settings.output
    with settings.open(write=False) as store:
        found = store.stats()
    counts = found.sessions
    record = {
        "sessions": counts,
        "segments": found.segments,
        "segment_bytes": found.segment_bytes,
        "preallocated_bytes": found.preallocated_bytes,
    }
    if found.replicas is not None:
        record["replicas"] = found.replicas
    states = ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "none"
    # (A new store's 4 MiB on disk are zeros written ahead: said, or its size would not
    # move with appends until they are used up; a new-user trial.)
    used, ahead = found.segment_bytes - found.preallocated_bytes, found.preallocated_bytes
    where = (
        # (a stream has no segment files: "segments: 0" said nothing there)
        f"stream: {found.segment_bytes:,} bytes, {plural(found.replicas or 1, 'replica')}"
        if is_nats(settings.store)
        else f"segments: {found.segments} ({used:,} bytes used; {found.segment_bytes:,} on "
        f"disk with {ahead:,} zeros written ahead for appends)"
        if ahead
        else f"segments: {found.segments} ({found.segment_bytes:,} bytes on disk)"
    )
    output.emit(record, f"sessions: {states}; {where}")


__all__ = ["compact", "nothing_reclaimed", "stats", "verify"]


@click.command("cursor-key")
@click.option(
    "--new",
    "new",
    is_flag=True,
    help="Create the store's key file when it is missing (every cursor issued so far "
    "becomes foreign), then print its keys.",
)
@click.option(
    "--rotate",
    is_flag=True,
    help="Add a new key to the store's key file and make it the signing key (the old "
    "keys keep verifying), then print the keys.",
)
@click.option(
    "--retire",
    "retire",
    cls=NumberOption,
    type=WholeNumber(1, 0xFFFF),
    metavar="ID",
    help="Remove key ID from the store's key file (cursors it signed become foreign; "
    "the active key cannot be retired), then print the keys.",
)
@pass_settings
def cursor_key(settings: Settings, new: bool, rotate: bool, retire: int | None) -> None:
    """Print the store's cursor keys as JOURNAL_CURSOR_KEY takes them (ID:HEX,...,
    the active key first).

    Give them to a reader that cannot read the store's key file (another user): with
    JOURNAL_CURSOR_KEY set to this text it verifies the writer's cursors, and the cursors
    it prints resume for the writer too. It is a secret: anyone with it can make cursors.

    A store that holds records refuses to open, for reading too, while its key file is
    missing (a new key would make every saved cursor foreign without a word): restore
    the file, or start a new key ring on purpose with --new.

    Rotating keys: a process reads the keys when it opens the store, and again when a
    cursor of a key it lacks reaches it. After --rotate, processes that were already
    running keep signing with the old key (their cursors verify everywhere: the old key
    stays in the file) until they meet a cursor of the new key or are reopened;
    `journal` commands open the store anew each time. A reader given the keys in
    JOURNAL_CURSOR_KEY needs the new text. Reopen every process that has the store open,
    then --retire the old key once the cursors it signed are no longer needed: a process
    still signing with it makes cursors that the other processes refuse as
    CursorForeign.

    For stores on disk: a nats:// store keeps its key in its stream, where every journal
    reads it and it is never rotated (there this command is a usage error saying so).
    """
    if sum((new, rotate, retire is not None)) > 1:
        raise click.UsageError(
            "--new, --rotate and --retire change the key file in different ways: give one of them"
        )
    if is_nats(settings.store):
        # (USAGE, exit 2, as every option or command for stores on disk is on a nats://
        # store: until 2026-12-07 UNSUPPORTED, exit 7, "data loss or other error", found
        # by an operator trial)
        raise click.UsageError(_NATS_KEYS)
    # (As every command's open checks it: a misspelt nats:// URL was a store not found,
    # told to run `init`, which refused it.)
    check_store_path(settings.store)
    path = os.path.join(settings.store, "keys")
    if os.path.exists(settings.store) and not os.path.isdir(settings.store):
        raise journal.InvalidArgument(
            f"{settings.store!r} is a file, not a store directory: give the path of a "
            "store's directory"
        )
    store_file = os.path.join(settings.store, "store.json")
    try:
        os.stat(store_file)
    except NotADirectoryError:
        raise journal.InvalidArgument(
            f"{settings.store!r} is not a directory: a directory on the way to it is a "
            "file; give the path of a store's directory"
        ) from None
    except OSError:
        pass  # (missing, or not searchable: the check below, as before)
    if not os.path.exists(store_file):
        raise no_store_at(settings.store)
    # (Until 2026-12-07 a creation killed part way was told to restore its key file from a
    # backup, exit 5, or had its keys printed or changed, where every other command said
    # there is no store.)
    refuse_unfinished(settings.store)
    if new:
        # The store's file mode: store.json is always written with it (a store made
        # before modes were recorded: its own mode, as the store reads it).
        mode = (stat.S_IMODE(os.stat(store_file).st_mode) & 0o666) | 0o600
        if os.path.exists(path):
            raise CommandFailed(  # (exit 5, as `export` to an existing file)
                f"{path} exists: --new only replaces a missing key file (to start over "
                "anyway, move it aside first; every cursor issued so far becomes foreign)",
                "FILE_EXISTS",
                "ALREADY_EXISTS",
            )
        _refuse_external_key("make the store's own key file with --new")
        ring = KeyRing.load_or_create(path, mode=mode)
        done = (
            f"started a new key ring: key {ring.active_key_id} signs cursors; every cursor "
            "issued before is foreign now\nnext: give readers that take JOURNAL_CURSOR_KEY "
            "the keys printed"
        )
    elif rotate or retire is not None:
        option = "--rotate" if rotate else "--retire"
        _refuse_external_key(f"change the store's own key file with {option}")
        _require_key_file(path)
        # (as a writable open: root's rotation left a key file the store's user could
        # not read, until 2026-12-05)
        refuse_another_users_private_store(settings.store)
        ring, done = _change_key_file(path, retire)
    else:
        # The keys the store's writers sign with: JOURNAL_CURSOR_KEY(_FILE) when it is
        # set (it replaces the key file), else the key file.
        external = KeyRing.from_environment()
        if external is None:
            _require_key_file(path)
            ring = KeyRing.load(path)
        else:
            ring = external
        done = ""
    record = {
        "cursor_key": ring.shared(),
        "active_key_id": ring.active_key_id,
        # (as cursor_key lists them: the active key first)
        "key_ids": [ring.active_key_id, *(k for k in ring.key_ids if k != ring.active_key_id)],
    }
    settings.output.emit(record, ring.shared(), ring.shared())
    if done and settings.output.format == "text":
        # (stderr: stdout stays the keys alone, for JOURNAL_CURSOR_KEY="$(journal ...)")
        for line in done.splitlines():
            click.echo(f"journal: {line}", err=True)


# How cursor keys work on a nats:// store (SPEC 16.5), for `cursor-key` there.
_NATS_KEYS = (
    "cursor-key is for stores on disk, whose key file it prints and changes: a nats:// "
    "store keeps its cursor key in its stream, where every journal that opens the store "
    "reads it, so readers need nothing handed over, and it is never rotated. A deployment "
    "that keeps the key from whoever can read the stream gives every journal of the store "
    "the same JOURNAL_CURSOR_KEY instead, and changes it in all of them at once (cursors "
    "signed with a key no longer given are refused as foreign)"
)


def _refuse_external_key(what: str) -> None:
    if KeyRing.from_environment() is not None:
        raise journal.InvalidArgument(
            "JOURNAL_CURSOR_KEY (or _FILE) is set: the store's writers sign with it, not "
            f"with a key file; unset it to {what}"
        )


def _require_key_file(path: str) -> None:
    if not os.path.exists(path):
        raise journal.KeyRingError(
            f"the store has no cursor key file ({path}): restore it from a backup; "
            "to start a new key ring on purpose (every cursor issued so far "
            "becomes foreign), run `journal cursor-key --new`"
        )


def _change_key_file(path: str, retire: int | None) -> tuple[KeyRing, str]:
    """Rotate (`retire` None) or retire a key of the key file `path` with `KeyRing.edit`
    (under an exclusive flock of `STORE/keys.lock`, so two changes at once do not lose
    one; the file is replaced atomically and keeps its mode); the ring, and what was done
    and what to do next, for an operator."""
    with KeyRing.edit(path) as ring:
        if retire is None:
            previous = ring.active_key_id
            ring.rotate()
            older = sorted(set(ring.key_ids) - {ring.active_key_id}, reverse=True)
            done = (
                f"rotated: key {ring.active_key_id} signs new cursors; {_still_verify(older)}"
                "\nnext: reopen every process that has the store open (until then each "
                f"signs with key {previous}) and give readers that take JOURNAL_CURSOR_KEY "
                f"the keys printed; once the cursors of key {previous} are no longer needed, "
                f"run `journal cursor-key --retire {previous}`"
            )
        elif retire not in ring.key_ids:
            raise CommandFailed(
                f"key id {retire} is not in the store's key file (key ids: "
                f"{', '.join(map(str, ring.key_ids))}); `journal cursor-key` prints them, "
                "the active key first",
                "KEY_NOT_FOUND",
                "NOT_FOUND",
            )
        elif retire == ring.active_key_id:
            raise CommandFailed(
                f"key id {retire} is the active signing key and cannot be retired: run "
                "`journal cursor-key --rotate` first, reopen every process that has the "
                "store open, then retire it",
                "KEY_ACTIVE",
                "FAILED_PRECONDITION",
            )
        else:
            ring.retire(retire)
            done = (
                f"retired key {retire}: the cursors it signed are refused as foreign now, "
                "also those a process opened before the rotation and not reopened since "
                f"signs with it still (reopen every such process); key "
                f"{ring.active_key_id} signs\nnext: give readers that take "
                "JOURNAL_CURSOR_KEY the keys printed"
            )
    return ring, done


def _still_verify(key_ids: list[int]) -> str:
    """That the keys `key_ids` (1 or more) still verify, and what that means."""
    if len(key_ids) == 1:
        return (
            f"key {key_ids[0]} still verifies, so the cursors it signed stay valid while "
            "it stays in the key file"
        )
    listed = f"{', '.join(map(str, key_ids[:-1]))} and {key_ids[-1]}"
    return (
        f"keys {listed} still verify, so the cursors they signed stay valid while they "
        "stay in the key file"
    )


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"

"""`journal sessions ...`: create, list, show, watch and change the lifecycle of sessions,
and take a dead owner's session over (`own`)."""

from __future__ import annotations

import datetime
import itertools
import sys
import time
from collections.abc import Callable, Iterator
from typing import Final

import click

import journal

from .hints import argument, journal_command
from .interrupts import said_if_interrupted
from .json_data import embedded
from .output import (
    BELOW_2_62,
    CommandFailed,
    NumberOption,
    Settings,
    WholeNumber,
    cli_message,
    error_fields,
    given_cursor,
    given_page_token,
    pass_settings,
)
from .rendering import id_column, one_line, preview, session_record, session_text, shown
from .watching import watch_events, watch_lifecycle

STATES = tuple(state.value for state in journal.SessionState)
# (The window of a store the CLI opens: the library's default policy.)
_DEFAULT_WINDOW_MIB = (journal.RetentionPolicy().max_history_bytes or 0) >> 20


@click.group()
def sessions() -> None:
    """Discover sessions and change their lifecycle."""


def _parse_tags(
    ctx: click.Context, param: click.Parameter, values: tuple[str, ...]
) -> dict[str, str]:
    tags: dict[str, str] = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{item!r} is not KEY=VALUE", ctx=ctx, param=param)
        if key in tags:
            raise click.BadParameter(
                f"tag key {key!r} is given twice ({tags[key]!r} and {value!r}): give each key once",
                ctx=ctx,
                param=param,
            )
        tags[key] = value
    return tags


@sessions.command()
@click.argument("session_id", metavar="ID")
@click.option("--mode", default="", help="Free-form mode (e.g. review, chat).")
@click.option("--context-id", default=None, help="Id of the context the session belongs to.")
@click.option(
    "--tag",
    "tags",
    multiple=True,
    metavar="KEY=VALUE",
    callback=_parse_tags,
    help="A tag; repeat for more (each key once).",
)
@click.option(
    "--ttl-ms",
    cls=NumberOption,
    type=WholeNumber(1, BELOW_2_62),
    default=None,
    metavar="N",
    help="Expire the session N ms after it starts.",
)
@click.option(
    "--max-suspend-ms",
    cls=NumberOption,
    type=WholeNumber(0, BELOW_2_62),
    default=0,
    metavar="N",
    help="Expire the session once it has been suspended for N ms (0, the default: 7 days).",
)
@click.option(
    "--max-history-bytes",
    cls=NumberOption,
    type=WholeNumber(1, BELOW_2_62),
    default=None,
    metavar="N",
    help="Keep at most about N bytes of its newest events (the oldest batches leave "
    "first). Default: the window of the store's recorded retention policy "
    f"({_DEFAULT_WINDOW_MIB} MiB unless the store was given another).",
)
@click.option(
    "--max-history-age-ms",
    cls=NumberOption,
    type=WholeNumber(1, BELOW_2_62),
    default=None,
    metavar="N",
    help="Drop its events N ms after they were appended. Default: the store's recorded "
    "retention policy's (none unless the store was given one).",
)
@pass_settings
def create(
    settings: Settings,
    session_id: str,
    mode: str,
    context_id: str | None,
    tags: dict[str, str],
    ttl_ms: int | None,
    max_suspend_ms: int,
    max_history_bytes: int | None,
    max_history_age_ms: int | None,
) -> None:
    """Create an open session."""
    with settings.open() as store:
        meta = store.create_session(
            session_id,
            mode=mode,
            context_id=context_id,
            tags=tags,
            ttl_ms=ttl_ms,
            max_suspend_ms=max_suspend_ms,
            max_history_bytes=max_history_bytes,
            max_history_age_ms=max_history_age_ms,
        )
    # (the line `sessions list` prints for it on a page of its own)
    settings.output.emit(session_record(meta), session_text(meta, id_column([session_id])))


@sessions.command("list")
@click.option("--state", type=click.Choice(STATES), default=None, help="Only sessions in it.")
@click.option(
    "--page-size",
    cls=NumberOption,
    type=WholeNumber(1, journal.MAX_PAGE_SIZE),
    default=None,
    metavar="N",
    help="Print one page of N sessions, then the next page's token on a line of its own "
    '(JSON: a last object whose only key is next_page_token, "" after the last page; '
    "text: `-- next page: --page-token T` or `-- last page`).",
)
@click.option(
    "--page-token",
    default=None,
    metavar="TOKEN",
    callback=given_page_token,
    help='Print the page it names (a page\'s next_page_token; default (or ""): the first page).',
)
@click.option(
    "--all",
    "all_pages",
    is_flag=True,
    help="Every page to the last, without the token line (the default without "
    "--page-size and --page-token): with --page-size, in pages of N; with --page-token, "
    "from its page on.",
)
@pass_settings
def list_(
    settings: Settings,
    state: str | None,
    page_size: int | None,
    page_token: str | None,
    all_pages: bool,
) -> None:
    """List sessions in id order, one per line.

    With --format json each session is one object (it has "session_id"); a page
    (--page-size, --page-token) ends with one object more, {"next_page_token": T},
    which has no other key, so `jq 'select(.session_id)'` keeps the sessions and
    `tail -n 1 | jq -r .next_page_token` the token.

    A session whose worker died mid-turn is listed with `open-turn=R (no owner)` (JSON:
    "open_turn" R and "owner" null): `journal sessions own ID` records that turn as
    failed (outcome unknown) and lets the session go.
    """
    output = settings.output
    state_filter = journal.SessionState(state) if state else None
    one_page = not all_pages and (page_size is not None or page_token is not None)
    listed = 0
    with settings.open(write=False) as store:
        token = page_token
        if not one_page and not token:
            # Every session: paged by id (`list_sessions`), not by page token. A token
            # names the page's last session, and once that one is evicted and its records
            # compacted away (a store with session retention, while a slow reader of
            # stdout held the listing between pages) the token is stale: until
            # 2026-12-05 the command then failed with INVALID_PAGE_TOKEN, "start again
            # without a token", to a user who had given none, and the sessions after
            # that page were never listed (a supervisor trial).
            size = page_size or 100
            pages = _pages(store.list_sessions(state=state_filter, page_size=size), size)
            for sessions_page in pages:
                width = id_column(meta.session_id for meta in sessions_page)
                for meta in sessions_page:
                    output.emit(session_record(meta), session_text(meta, width))
                listed += len(sessions_page)
        while token or one_page:
            page = store.list_sessions_page(
                page_size=page_size or 100, page_token=token, state=state_filter
            )
            width = id_column(meta.session_id for meta in page.sessions)
            for meta in page.sessions:
                output.emit(session_record(meta), session_text(meta, width))
            listed += len(page.sessions)
            token = page.next_page_token
            if one_page or not token:
                break
    if not listed and output.format == "text" and sys.stdout and sys.stdout.isatty():
        which = f" in state {state}" if state else ""
        click.echo(f"-- no sessions{which}")
    if one_page:
        text = f"-- next page: --page-token {token}" if token else "-- last page"
        output.emit({"next_page_token": token}, text)


@sessions.command()
@click.argument("session_id", metavar="ID")
@pass_settings
def snapshot(settings: Settings, session_id: str) -> None:
    """Print the snapshot a session's history was compacted into, if any.

    A compacted session's events start after its snapshot (`read` then starts past #1):
    this prints the ordinal it stands for, the cursor that resumes after it, and its data.
    With --format json, one object {"session_id", "ordinal", "cursor", "data"} (data as
    event data is printed: its JSON, or {"base64": ...}), each null but the id when
    the session has no snapshot; --format quiet prints the data only, as text.
    """
    with settings.open(write=False) as store:
        kept = store.snapshot(session_id)
        first = store.get_session(session_id).first_ordinal if kept is None else 0
    if kept is None:
        record: dict[str, object] = dict.fromkeys(("ordinal", "cursor", "data"))
        text = f"-- no snapshot: session {shown(session_id)} keeps its history from #{first}"
        settings.output.emit({"session_id": session_id, **record}, text)
        return
    settings.output.emit(
        {
            "session_id": session_id,
            "ordinal": kept.ordinal,
            "cursor": kept.cursor,
            "data": embedded(kept.data),
        },
        f"snapshot of {shown(session_id)} through #{kept.ordinal}: {preview(kept.data)}\n"
        f"-- resume after it with --cursor {kept.cursor}",
        kept.data.decode("utf-8", "replace"),
    )


def _pages(
    sessions: Iterator[journal.SessionMetadata], size: int
) -> Iterator[list[journal.SessionMetadata]]:
    """`sessions` in lists of `size` (the last shorter), as pages were printed."""
    while page := list(itertools.islice(sessions, size)):
        yield page


@sessions.command()
@click.argument("session_id", metavar="ID")
@pass_settings
def show(settings: Settings, session_id: str) -> None:
    """Print a session's metadata, one field a line.

    With --format json, one object: every field of the library's SessionMetadata
    ("max_suspend_ms": 0 means the default, 7 days, as there; "max_history_bytes" and
    "max_history_age_ms" null: the store's retention policy's window applies).
    """
    with settings.open(write=False) as store:
        meta = store.get_session(session_id)
    record = session_record(meta)
    shown_record = {key: value for key, value in record.items() if key not in _INTERNAL}
    for key, value in record.items():
        if key.endswith("_at_ms") and isinstance(value, int):
            shown_record[key] = f"{value} ({_utc(value)})"
    if meta.owner is not None:
        owner = meta.owner
        shown_record["owner"] = (
            f"pid {owner.pid}@{shown(owner.host)} (lease {owner.generation}, since "
            f"{_utc(owner.since_ms)})"
        )
    if not meta.max_suspend_ms:
        shown_record["max_suspend_ms"] = "0 (the default: 7 days)"
    for window in ("max_history_bytes", "max_history_age_ms"):
        if record[window] is None:
            shown_record[window] = "- (the store's policy)"
    width = max(len(key) for key in shown_record)
    text = "\n".join(f"{key:<{width}}  {_text_value(value)}" for key, value in shown_record.items())
    settings.output.emit(record, text)


# Fields `sessions show` leaves out of its text: numbers of the store's own bookkeeping
# that no option takes (JSON keeps them: SessionMetadata as it encodes). The incarnation
# is the store position of the session's creation record (SPEC 4); an owner's start time
# (clock ticks after boot, telling a reused pid apart) is left out with it.
_INTERNAL: Final = frozenset({"incarnation"})


def _utc(ms: int) -> str:
    """A time of the store (ms since the epoch) as people read it, as `import --list`
    writes the export time."""
    try:
        when = datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC)
    except (OverflowError, OSError, ValueError):  # (an imported time past year 9999)
        return "out of the calendar's range"
    return f"{when:%Y-%m-%d %H:%M:%S} UTC"


def _text_value(value: object) -> str:
    """A field as one line (control characters escaped: a newline in a context id or a
    tag would fake a field; tags and list items quoted where a space, `=` or `,` would
    split them)."""
    if value is None or value == "":
        return "-"
    if isinstance(value, dict):
        return ", ".join(f"{shown(str(k))}={shown(str(v))}" for k, v in value.items()) or "-"
    if isinstance(value, list):
        return ", ".join(shown(str(v)) for v in value) or "-"
    return one_line(str(value))


@sessions.command("watch")
@click.option(
    "-s",
    "--session",
    "session_id",
    metavar="ID",
    default=None,
    help="Watch this session's events (as `journal watch -s ID`) instead of the lifecycle "
    "of all sessions.",
)
@click.option(
    "--cursor",
    metavar="CURSOR",
    default=None,
    callback=given_cursor,
    help="Resume after this event (with -s) or lifecycle event; left out: the start (with "
    "-s), or one `created` per existing session first, then live changes.",
)
@pass_settings
def watch_sessions(settings: Settings, session_id: str | None, cursor: str | None) -> None:
    """Follow lifecycle changes of all sessions until Ctrl+C (or, with -s, one session's
    events until it ends)."""
    if session_id is not None:
        watch_events(settings, session_id, cursor)
    else:
        watch_lifecycle(settings, cursor)


def _transition_command(
    name: str, pick: Callable[[journal.Journal], Callable[[str], journal.SessionMetadata]]
) -> click.Command:
    @pass_settings
    def command(settings: Settings, session_id: str) -> None:
        with settings.open() as store:
            meta = pick(store)(session_id)
        settings.output.emit(session_record(meta), f"{shown(meta.session_id)} {meta.state.value}")

    helps = {
        "resolve": "Resolve a session (terminal): its watchers end after the last event. "
        "A resolved session is left as it is (a retried resolve succeeds); an expired or "
        "cancelled one is refused.",
        "cancel": "Cancel a session (terminal); an ended session is left as it is.",
        "suspend": "Suspend an open session: appends are refused until it is resumed. "
        "It expires (ends) if it is still suspended when its suspension cap has passed "
        "(`sessions create --max-suspend-ms`; 7 days by default).",
        "resume": "Resume a suspended session.",
    }
    command.__doc__ = helps[name]
    decorated = click.argument("session_id", metavar="ID")(command)
    return click.command(name)(decorated)


sessions.add_command(_transition_command("resolve", lambda store: store.resolve_session))
sessions.add_command(_transition_command("cancel", lambda store: store.cancel_session))
sessions.add_command(_transition_command("suspend", lambda store: store.suspend_session))
sessions.add_command(_transition_command("resume", lambda store: store.resume_session))


@sessions.command("own")
@click.argument("session_id", metavar="ID")
@click.option(
    "--wait",
    "wait_s",
    cls=NumberOption,
    type=WholeNumber(0, 86_400),
    default=0,
    show_default=True,
    metavar="SECONDS",
    help="Wait up to this long for a live owner to let go before giving up (OWNER_BUSY).",
)
@pass_settings
def own(settings: Settings, session_id: str, wait_s: int) -> None:
    """Take a session over from a dead owner, settle its turn, and let it go.

    For a supervisor: a session listed with `open-turn=ID (no owner)` holds the turn of
    a worker that died mid-turn. This takes the owner lease (as the library's
    `Journal.own()`), which records that turn as failed with WATCH_OUTCOME_UNKNOWN (it
    may or may not have run), prints which turn it recorded (none if there was none),
    then releases the lease. A live owner is left alone: exit 5 (OWNER_BUSY, with its
    pid); so is an ended session (5), and a missing one is 3.

    If recording the release fails after the takeover committed, the takeover is printed
    all the same ("released": false in JSON), then the error, with that failure's exit
    status (9 for an unavailable store): the turn stays recorded; run the command again
    once the store is mended to record a release.
    """
    owner: journal.Owner | None = None

    def said(_: KeyboardInterrupt) -> str:
        return _own_interrupted(session_id, owner)

    with said_if_interrupted(said), settings.open() as store:
        owner = store.own(session_id, wait_s=wait_s)
        generation, recovered = owner.generation, owner.recovered_turn
        try:
            owner.release()
        except journal.JournalError as error:
            # The takeover (and the turn it recorded) committed: printed before the error,
            # which until 2026-12-06 came alone (exit 9, the recorded turn never said).
            _emit_owned(settings, session_id, generation, recovered, released=False)
            raise _release_failed(error, session_id, recovered) from None
    _emit_owned(settings, session_id, generation, recovered, released=True)


def _emit_owned(
    settings: Settings, session_id: str, generation: int, recovered: str | None, released: bool
) -> None:
    record = {
        "session_id": session_id,
        "generation": generation,
        "recovered_turn": recovered,
        "released": released,
    }
    if recovered is None:
        what = "no unsettled turn"
    else:
        what = (
            f"turn {shown(recovered)} recorded as failed (WATCH_OUTCOME_UNKNOWN: its owner "
            "ended without settling it; it may have run)"
        )
    end = "released" if released else "its release failed (below)"
    text = f"took over {shown(session_id)} (lease {generation}): {what}; {end}"
    settings.output.emit(record, text)


def _release_failed(
    error: journal.JournalError, session_id: str, recovered: str | None
) -> CommandFailed:
    """The error of a release that failed after the takeover committed: its code and
    status (so its exit status), saying what committed and what to run."""
    if recovered is None:
        done = "it found no unsettled turn"
    else:
        done = f"turn {shown(recovered)} was recorded as failed, WATCH_OUTCOME_UNKNOWN"
    return CommandFailed(
        f"the takeover committed ({done}), but recording the release of the lease then "
        f"failed: {cli_message(error.message)}. The lease is let go as the command ends; "
        f"once the store is mended, `{journal_command()} sessions own {argument(session_id)}` "
        "records a release (the turn is not recorded again)",
        error.code,
        error.status,
        **error_fields(error),
        failed_step="release",
        committed=True,
    )


def _own_interrupted(session_id: str, owner: journal.Owner | None) -> str:
    """What an interrupted `sessions own` did: the lease it took is let go as the command
    ends (by the owner's release, or with the process's lock); before `own()` returned,
    none was taken (a Ctrl+C while waiting), or the one taken was let go at once, maybe
    after the turn was recorded (a Ctrl+C held until that commit was done)."""
    if owner is None:
        # (Shell-quoted, to be run as it is: until 2026-12-06 the id was quoted as the
        # CLI shows ids, `"a b$c"`, which a shell expands.)
        return (
            "interrupted: no lease is held (none was taken, or the one taken was let go); "
            f"`{journal_command()} sessions show {argument(session_id)}` shows whether a turn is "
            "still open"
        )
    if owner.recovered_turn is None:
        done = "there was no unsettled turn"
    else:
        done = f"turn {shown(owner.recovered_turn)} was recorded as failed"
    return f"interrupted after the takeover: {done}; the lease is let go as the command ends"


@sessions.command("expire")
@pass_settings
def expire(settings: Settings) -> None:
    """Expire the sessions past their deadline (--ttl-ms, a suspension's cap) now.

    A process that keeps the store open for writing expires them by itself, and so does
    every write command; read commands never do (their watches of such a session go on
    until one of those runs). Prints one line per session expired while the command ran
    (by its own pass, or by the store's timer as it opened the store), or, in text, when
    it expired none, that no session is past its deadline.

    If the listing read after the expiry fails, the sessions its own pass expired are
    printed all the same, then the error, with that failure's exit status (9 for an
    unavailable store): `journal sessions list --state expired` lists them all once the
    store is mended.
    """
    start_ms = int(time.time() * 1000)
    output = settings.output
    with settings.open() as store:
        mine = store.expire_due()
        # (The timer of the journal just opened may have expired them first: what ended
        # since the command started is what it expired. Ended before it finished, too: an
        # end stamped later, by a clock that was ahead, or on another host and imported,
        # is no end of this run, and without that bound every run listed it again.)
        try:
            listed = list(store.list_sessions(state=journal.SessionState.EXPIRED))
        except journal.JournalError as error:
            # The expiry committed: what it expired is printed before the error, which
            # until 2026-12-06 came alone (exit 9, the expired sessions never said).
            for meta in sorted(mine, key=lambda meta: meta.session_id):  # (id order)
                output.emit(session_record(meta), f"{shown(meta.session_id)} {meta.state.value}")
            raise _listing_failed(error, len(mine), output.format != "quiet") from None
        end_ms = int(time.time() * 1000)
    expired = {meta.session_id: meta for meta in mine}  # (whatever its clock stamped)
    for meta in listed:
        if meta.ended_at_ms is not None and start_ms <= meta.ended_at_ms <= end_ms:
            expired[meta.session_id] = meta
    for session_id in sorted(expired):  # (id order, as the listing's)
        meta = expired[session_id]
        output.emit(session_record(meta), f"{shown(meta.session_id)} {meta.state.value}")
    if not expired and output.format == "text":
        click.echo("no session is past its deadline now")


def _listing_failed(error: journal.JournalError, expired: int, printed: bool) -> CommandFailed:
    """The error of the listing read that failed after the expiry committed: its code
    and status (so its exit status), saying what committed and where to look."""
    if not expired:
        done = "it expired no session itself"
    else:
        which = "one session" if expired == 1 else f"{expired} sessions"
        done = f"it expired {which}" + (", printed above" if printed else "")
    return CommandFailed(
        f"the expiry committed ({done}), but listing the expired sessions then failed: "
        f"{cli_message(error.message)}. Sessions the store's timer expired as the command "
        "opened the store are not printed; once the store is mended, `journal sessions "
        "list --state expired` lists every expired session (`journal sessions expire` "
        "again lists only what it expires then)",
        error.code,
        error.status,
        **error_fields(error),
        failed_step="listing",
        committed=True,
    )

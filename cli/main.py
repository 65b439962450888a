"""Entry point of the `journal` command: global options, error handling and the event
commands (`init`, `append`, `read`, `watch`)."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Iterator, Mapping, Sequence
from types import FrameType
from typing import IO, Any, cast

import click

import journal
from journal.arguments import check_store_path, file_mode_problem

from . import early_signals
from .archives import export, import_
from .demo import demo
from .hints import journal_command
from .maintenance import compact, cursor_key, stats, verify
from .ndjson_events import events_from_ndjson
from .output import (
    BELOW_2_62,
    EXIT_CODES_HELP,
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    CommandFailed,
    NumberOption,
    Output,
    Settings,
    WholeNumber,
    given_cursor,
    is_nats,
    pass_settings,
    require_stream,
    silence_stdout,
)
from .rendering import one_line, shown
from .retention import retention
from .sessions import sessions
from .stderr_log import show_warnings
from .watching import watch_events

FORMATS = ("text", "json", "quiet")


def _representable_output() -> None:
    """Text the output encoding cannot represent (a `PYTHONIOENCODING=latin-1` or C
    locale terminal) is printed escaped (`\\u20ac`), not raised: a command that did its
    work must not then fail with a traceback and status 1 (a `sessions create` whose id
    the terminal could not show created it, and a retry got SESSION_EXISTS)."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            with contextlib.suppress(Exception):  # (a stream replaced by a caller)
                reconfigure(errors="backslashreplace")


class JournalGroup(click.Group):
    """The root group: turns library errors, usage errors, a closed pipe and Ctrl+C into
    one-line messages and exit statuses instead of tracebacks (and, with `--format json`,
    an error object on stdout for every one of them)."""

    def main(self, args: Sequence[str] | None = None, **extra: Any) -> Any:  # type: ignore[override]
        argv = list(sys.argv[1:] if args is None else args)
        argv, valueless = _hoist_global_options(self, argv)
        # (click would name it after argv[0]: `__main__.py` under `python -m cli`)
        prog_name = extra.pop("prog_name", None) or "journal"
        _representable_output()
        try:
            if _command_context(self, prog_name, argv).command.name != "watch":
                early_signals.release()  # (a watch takes them over: cli/watching.py)
            if valueless is not None:
                # (left to the command, click would say it has no such option)
                raise click.BadOptionUsage(valueless, f"Option '{valueless}' requires an argument.")
            result = super().main(argv, prog_name, standalone_mode=False, **extra)
            # Without standalone mode click returns the status ctx.exit() was given.
            sys.exit(result if isinstance(result, int) else 0)
        except _NO_ARGS_IS_HELP as error:
            if _wants_json(argv):  # (a usage error as any other: until 2026-12-05 the help)
                failure = CommandFailed(
                    f"Missing command: try '{error.ctx.command_path} --help'",
                    code="USAGE",
                    status="INVALID_ARGUMENT",
                )
                sys.exit(Output("json").error(failure, exit_code=EXIT_USAGE))
            click.echo(error.format_message(), err=True)  # the help, not an error line
            sys.exit(EXIT_USAGE)
        except click.UsageError as error:
            output = Output("json" if _wants_json(argv) else "text")
            settings = None if error.ctx is None else error.ctx.find_object(Settings)
            # (`export -o -` found it: stdout is the archive's, a review)
            output.stdout_is_data = settings is not None and settings.output.stdout_is_data
            if not output.json:
                # (click's parser raises an option missing its value without the context
                # of the command: every usage error prints the same lines all the same)
                ctx = error.ctx or _command_context(self, prog_name, argv)
                click.echo(ctx.get_usage(), err=True)
                click.echo(f"Try '{ctx.command_path} --help' for help.", err=True)
            message = error.format_message()
            if isinstance(error, click.NoSuchOption) and not error.possibilities:
                # (Data or an id may start with '-': `append -s a -1` said only "No such
                # option '-1'" until 2026-12-05, found by a CLI scripting trial.)
                message = (
                    f"{message.rstrip('.')}; a value that starts with '-' goes after `--` "
                    f"(`-- {error.option_name}`)"
                )
            failure = CommandFailed(message, code="USAGE", status="INVALID_ARGUMENT")
            sys.exit(output.error(failure, exit_code=EXIT_USAGE))
        except click.exceptions.Exit as done:
            sys.exit(done.exit_code)
        except (click.Abort, KeyboardInterrupt):
            sys.exit(EXIT_INTERRUPTED)
        except click.ClickException as error:
            error.show()
            sys.exit(error.exit_code)
        finally:
            early_signals.release()  # (a watch that did not begin: a usage error)

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        """An unknown command that names a `sessions` command (`journal list`, `own`) or
        a guess a supervisor author made (`watch-sessions`, `tail`) names the command
        meant: click said "No such command", at best "Did you mean 'sessions'?"."""
        try:
            return super().resolve_command(ctx, args)
        except click.exceptions.NoSuchCommand as error:
            group = self.commands.get("sessions")
            name = error.command_name
            if isinstance(group, click.Group) and name in group.commands:
                meant: str | None = f"sessions {name}"
            else:
                meant = _GUESSES.get(name)
            if meant is None:
                raise
            raise click.UsageError(
                f"No such command {name!r}: did you mean `journal {meant}`?", ctx
            ) from None

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (journal.JournalError, CommandFailed) as error:
            settings = ctx.find_object(Settings)
            output = settings.output if settings is not None else Output("text")
            ctx.exit(output.error(error))
        except BrokenPipeError:
            # The reader went away (`journal watch ... | head`): that is a normal end.
            silence_stdout()
            ctx.exit(0)
        except KeyboardInterrupt:
            ctx.exit(EXIT_INTERRUPTED)
        except OSError as error:
            # e.g. a --store path that cannot be created: the library lets these through
            settings = ctx.find_object(Settings)
            output = settings.output if settings is not None else Output("text")
            ctx.exit(output.error(CommandFailed(str(error), code="OS_ERROR")))


@click.group(
    cls=JournalGroup,
    context_settings={"help_option_names": ["-h", "--help"]},
    epilog=EXIT_CODES_HELP,
)
@click.version_option(journal.__version__, "-V", "--version", prog_name="journal")
@click.option(
    "--store",
    metavar="PATH",
    # (An empty JOURNAL_STORE, as `JOURNAL_STORE=` leaves it, is no path: unset.)
    default=lambda: os.environ.get("JOURNAL_STORE") or ".journal",
    show_default="$JOURNAL_STORE if set and not empty, else ./.journal",
    help="Store directory, or nats://HOST:PORT[,HOST:PORT]/NAME for a store on NATS JetStream.",
)
@click.option(
    "--format",
    "output_format",
    type=click.Choice(FORMATS),
    default="text",
    show_default=True,
    help="Output: human text, NDJSON (one object per line), or quiet: only the data a "
    "command exists to print: the data of each event `read` and `watch` print (turn "
    "events left out), one per line, the keys `cursor-key` prints, and the archive "
    "`export -o -` writes; nothing from other commands (errors still go to stderr).",
)
@click.pass_context
def main(ctx: click.Context, store: str, output_format: str) -> None:
    """Event-sourced session journal: append, replay, watch and discover agent sessions."""
    show_warnings()
    # (Keywords a caller in this process gives for the store's open: a test's fault points.)
    given = dict(ctx.obj) if isinstance(ctx.obj, Mapping) else {}
    ctx.obj = Settings(store=store, output=Output(output_format), open_options=given)


# click 8.2 raises this for a bare group (older versions print the help and exit).
_NO_ARGS_IS_HELP: Any = getattr(click.exceptions, "NoArgsIsHelpError", ())
# Commands a new user looked for under other names (JournalGroup.resolve_command).
_GUESSES = {
    "watch-sessions": "sessions watch",
    "sessions-watch": "sessions watch",
    "list-sessions": "sessions list",
    "tail": "watch -s ID",
    "follow": "watch -s ID",
}


def _wants_json(argv: list[str]) -> bool:
    """Whether the global options (those before the command, once moved there) ask for
    JSON; the last `--format` wins, as in click."""
    output_format = None
    i = 0
    while i < len(argv) and argv[i] != "--":
        arg = argv[i]
        if arg in _GLOBAL_OPTIONS:
            if arg == "--format" and i + 1 < len(argv):
                output_format = argv[i + 1]
            i += 2
        elif arg.startswith("--format="):
            output_format = arg.split("=", 1)[1]
            i += 1
        elif arg.startswith("-") and arg != "-":
            i += 1
        else:
            break  # the command
    return output_format == "json"


_GLOBAL_OPTIONS = ("--store", "--format")


def _option_of(command: click.Command, name: str) -> click.Option | None:
    for param in command.params:
        if isinstance(param, click.Option) and (name in param.opts or name in param.secondary_opts):
            return param
    return None


def _values_taken(option: click.Option | None) -> int:
    """How many arguments after it an option takes as its value (0 for a flag)."""
    if option is None or option.is_flag or option.count:
        return 0
    return max(option.nargs, 1)


def _values_after(command: click.Command, arg: str) -> int:
    """How many of the arguments after option `arg` of `command` are its value: none when
    the value is attached (`--type=T`, `-sID`) or it is a flag (or unknown: click says
    so)."""
    if arg.startswith("--"):
        return 0 if "=" in arg else _values_taken(_option_of(command, arg))
    for at, letter in enumerate(arg[1:], start=2):  # `-s ID`, `-sID`, a cluster of flags
        taken = _values_taken(_option_of(command, "-" + letter))
        if taken:
            return 0 if at < len(arg) else taken
        if _option_of(command, "-" + letter) is None:
            return 0
    return 0


def _command_context(root: click.Group, prog_name: str, argv: list[str]) -> click.Context:
    """The context of the command that `argv` names (the innermost group or command its
    words reach), for the usage lines of an error click raised without one."""
    ctx = click.Context(root, info_name=prog_name, **root.context_settings)
    command: click.Command = root
    i = 0
    while i < len(argv) and argv[i] != "--":
        arg = argv[i]
        if arg.startswith("-") and arg != "-":
            i += 1 + _values_after(command, arg)
            continue
        sub = command.get_command(ctx, arg) if isinstance(command, click.Group) else None
        if sub is None:
            break
        command = sub
        ctx = click.Context(sub, info_name=arg, parent=ctx)
        i += 1
    return ctx


def _hoist_global_options(root: click.Group, argv: list[str]) -> tuple[list[str], str | None]:
    """`journal read -s x --format json` means `journal --format json read -s x`: the
    global options (`--store`, `--format`) may follow the command; they move to just
    before it (so a later one wins), unless the command has an option of that name
    (`export --format`, `demo --store`: those stay). The value of an option that takes
    one stays its value (`--type --format`, `--request-id --store`: click's own reading
    of the command's options decides), and nothing after `--` moves.

    Returns the arguments and the name of a global option that ended them without its
    value (None if none did): a usage error."""
    ctx = click.Context(root)
    command: click.Command = root
    out: list[str] = []
    moved: list[str] = []
    valueless = None
    command_at = None  # where the command word is in `out`
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            out += argv[i:]
            break
        if arg.startswith("-") and arg != "-":
            name = arg.split("=", 1)[0]
            if command is not root and name in _GLOBAL_OPTIONS and not _option_of(command, name):
                if "=" not in arg and i + 1 == len(argv):
                    valueless = name
                    break
                width = 1 if "=" in arg else 2
                moved += argv[i : i + width]
                i += width
                continue
            taken = _values_after(command, arg)
            out += argv[i : i + 1 + taken]
            i += 1 + taken
            continue
        out.append(arg)
        i += 1
        if isinstance(command, click.Group):
            if command_at is None:
                command_at = len(out) - 1
            sub = command.get_command(ctx, arg)
            if sub is None:  # not a command: click reports it; move nothing more
                out += argv[i:]
                break
            command = sub
    if command_at is None:
        return out + moved, valueless
    return out[:command_at] + moved + out[command_at:], valueless


session_option = click.option(
    "-s", "--session", "session_id", required=True, metavar="ID", help="Session id."
)
cursor_option = click.option(
    "--cursor",
    metavar="CURSOR",
    default=None,
    callback=given_cursor,
    help='Resume after the event this cursor belongs to (exclusive); default (or ""): the start.',
)


def _octal_mode(value: str | None) -> int | None:
    """`--file-mode` as chmod takes it (`640`, `0640`; `0o640` too): its bits, checked
    here so a refusal writes the mode the way it was typed (0640, not Python's 0o640)."""
    if value is None:
        return None
    digits = value.removeprefix("0o")
    # (ASCII 0-7 only: `isdigit()` and `int()` take the digits of other scripts too)
    if not digits or digits.strip("01234567"):
        raise click.BadParameter(
            f"{value!r} is not an octal mode such as 0600 or 0640", param_hint="'--file-mode'"
        )
    mode = int(digits, 8)
    problem = file_mode_problem(mode, as_chmod=True)
    if problem is not None:
        raise journal.InvalidArgument(f"--file-mode {problem}")
    return mode


@main.command()
@click.option(
    "--file-mode",
    "file_mode",
    metavar="OCTAL",
    default=None,
    help="Permissions of the files the store creates, as chmod takes them (640 or 0640; "
    "default 0600 for a new store; "
    "directories get x where it has r: 0640 -> 0750). Given for an existing store, it "
    "applies to files created from then on.",
)
@click.option(
    "--replicas",
    cls=NumberOption,
    type=WholeNumber(1, 5),
    default=None,
    metavar="N",
    help="nats:// stores only: how many servers of the cluster keep the stream init "
    "creates (default 1; 3 on a 3-node cluster). An existing store with another number "
    "is refused (exit 4), not changed.",
)
@pass_settings
def init(settings: Settings, file_mode: str | None, replicas: int | None) -> None:
    """Create the store (if it does not exist yet) and print its path.

    In text, stdout is the path alone (`STORE="$(journal init)"`; a nats:// URL's
    password is masked there: give such a URL in $JOURNAL_STORE); stderr says whether
    the store was created, its id (as archives and `import` name it) and what to run
    next. With --format json: {"store", "created", "store_id"}.
    """
    mode = _octal_mode(file_mode)
    if is_nats(settings.store):
        if mode is not None:
            raise click.UsageError(
                "--file-mode is for stores on disk: a nats:// store's files are the server's"
            )
        path = settings.store
        # (an existing store with another number of replicas than --replicas is refused,
        # exit 4: until 2026-12-05 init said "opened the existing store" and kept its one)
        options: dict[str, Any] = {"replicas": replicas}
        created_with = options
    else:
        if settings.store:  # (a misspelt nats:// URL is said so before --replicas is)
            check_store_path(settings.store)
        if replicas is not None:
            raise click.UsageError(
                "--replicas is for nats:// stores (--store nats://HOST:PORT/NAME): a store "
                "on disk has no replicas"
            )
        # (abspath("") is the current directory: an empty path goes to the library, which
        # refuses it, as every other command does.)
        # (The library's check of the path as given: abspath hid a misspelt nats:// URL.)
        path = os.path.abspath(check_store_path(settings.store)) if settings.store else ""
        options = {"file_mode": mode}
        created_with = options
    created = False
    try:
        store = journal.Journal.open(path, create=False, **options)
    except journal.StoreNotFound:
        store = journal.Journal.open(path, create=True, **created_with)
        created = True
    with store:
        store_id = store.store_id.hex()
        path = store.path  # (a nats:// URL's password masked: give it in $JOURNAL_STORE)
    settings.output.emit({"store": path, "created": created, "store_id": store_id}, path)
    if settings.output.format == "text":
        # (stderr: stdout stays the path alone, for STORE="$(journal init)")
        done = "created a new store" if created else "opened the existing store"
        click.echo(f"journal: {done} {store_id} at {one_line(path)}", err=True)
        click.echo(f"journal: next: {_next_commands(path)}", err=True)


def _next_commands(path: str) -> str:
    """What to run after `init`, naming the store as the user did (`--store PATH` only
    when it was given as an option: $JOURNAL_STORE and ./.journal need none)."""
    journal_ = journal_command()
    given = journal_ != "journal"
    said = (
        f"`{journal_} append -s ID --create DATA` appends an event to a new session, "
        f"`{journal_} sessions list` lists the sessions (`journal --help`: every command)"
    )
    if given and "***@" in path:  # (the URL's password or token, masked: Journal.path)
        said += (
            "; *** stands for the URL's password (or token): set JOURNAL_STORE to the URL "
            "to keep it out of command lines and their history"
        )
    return said


@main.command()
@session_option
@click.option("--create", is_flag=True, help="Create the session if it does not exist.")
@click.option(
    "--type",
    "event_type",
    default="message",
    show_default=True,
    help="Event type for DATA arguments and stdin lines that do not name one.",
)
@click.option("--request-id", default=None, help="Request id for events that do not name one.")
@click.option(
    "--expected-last",
    cls=NumberOption,
    type=WholeNumber(0, BELOW_2_62),
    default=None,
    metavar="N",
    help="Append only if the session's last ordinal is N (optimistic concurrency).",
)
@click.option(
    "--idempotency-key",
    default=None,
    metavar="KEY",
    help="Appending the same events again with this key writes nothing.",
)
@click.argument("data", nargs=-1)
@pass_settings
def append(
    settings: Settings,
    session_id: str,
    create: bool,
    event_type: str,
    request_id: str | None,
    expected_last: int | None,
    idempotency_key: str | None,
    data: tuple[str, ...],
) -> None:
    """Append events to a session, all in one batch.

    Each DATA argument is one event (its UTF-8 bytes). Without DATA, stdin is read as
    NDJSON: a line that is an object with a "data" key and no keys besides "type", "data"
    and "request_id" is an envelope (a string "data" is stored as its UTF-8 bytes, any
    other JSON value as the line writes it, byte for byte; each key at most once); any
    other JSON line is stored as it is, with type --type; blank lines are skipped. One
    append takes at most 10,000 events and 64 MiB of data: stdin is refused (nothing
    appended) as soon as it holds more. Prints what was committed ({"session_id",
    "first_ordinal", "last_ordinal", "cursor", "deduplicated"} with --format json; the
    cursor is the last event's).
    """
    if data:
        events = [
            journal.EventIn(event_type, arg.encode("utf-8", "surrogateescape"), request_id)
            for arg in data
        ]
    else:
        require_stream("stdin", "pass DATA arguments, or NDJSON lines on stdin")
        if sys.stdin.isatty():
            click.echo(
                "journal: reading NDJSON events from the terminal, one per line; end with "
                "Ctrl+D (or pass DATA arguments)",
                err=True,
            )
        stdin = cast("IO[bytes]", getattr(sys.stdin, "buffer", sys.stdin))
        try:
            events = events_from_ndjson(stdin, event_type, request_id)
        except KeyboardInterrupt:
            click.echo("journal: interrupted while reading stdin: nothing was appended", err=True)
            raise
    if not events:
        raise journal.InvalidArgument(
            "nothing to append: pass DATA arguments or NDJSON lines on stdin"
        )
    store = settings.open()
    try:
        # Noted from the commit until the store is closed: a Ctrl+C after the result was
        # printed must not turn a committed append into exit 130 (a retry would repeat it).
        with _ctrl_c_noted() as noted:
            try:
                result = store.append(
                    session_id,
                    events,
                    expected_last_ordinal=expected_last,
                    idempotency_key=idempotency_key,
                    create=create,
                )
                _emit_appended(settings, result)  # (before a Ctrl+C may interrupt again)
            finally:
                store.close()
    except KeyboardInterrupt:
        click.echo(
            "journal: interrupted by a second Ctrl+C while the events were being "
            "committed: whether they were appended is not known (read the session; "
            "--idempotency-key makes a retry safe)",
            err=True,
        )
        raise
    if noted:
        click.echo(
            "journal: Ctrl+C came while the events were being committed; they were "
            "appended (above)",
            err=True,
        )


@contextlib.contextmanager
def _ctrl_c_noted() -> Iterator[list[int]]:
    """While the events are committed, a first Ctrl+C is noted (the list gets an item)
    instead of interrupting: the command then reports what was committed, rather than
    exiting 130 with the events appended and nothing said (a retry would append them
    again). A second Ctrl+C interrupts: whether the events were committed is then not
    known (`--idempotency-key` makes a retry safe)."""
    noted: list[int] = []

    def note(signum: int, frame: FrameType | None) -> None:
        noted.append(signum)
        if len(noted) > 1:
            raise KeyboardInterrupt

    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:  # (a background job: no Ctrl+C)
        yield noted
        return
    previous = signal.signal(signal.SIGINT, note)
    try:
        yield noted
    finally:
        signal.signal(signal.SIGINT, previous)


def _emit_appended(settings: Settings, result: journal.AppendResult) -> None:
    record = {
        "session_id": result.session_id,
        "first_ordinal": result.first_ordinal,
        "last_ordinal": result.last_ordinal,
        "cursor": result.cursor,
        "deduplicated": result.deduplicated,
    }
    span = f"#{result.first_ordinal}"
    if result.last_ordinal != result.first_ordinal:
        span += f"..#{result.last_ordinal}"
    note = " (deduplicated: already appended with this key)" if result.deduplicated else ""
    try:
        settings.output.emit(
            record, f"appended {shown(result.session_id)} {span}{note} cursor={result.cursor}"
        )
    except CommandFailed as failed:
        # (Said: a script that takes the failure for "not appended" and retries would
        # append the events twice; until 2026-12-05 only stdout's failure was, a review.)
        raise CommandFailed(
            f"{failed.message}; the events were appended all the same ({span} of "
            f"{shown(result.session_id)}): do not append them again",
            failed.code,
            failed.status,
        ) from None


@main.command()
@session_option
@cursor_option
@click.option(
    "--max-bytes",
    cls=NumberOption,
    type=WholeNumber(min=1),
    metavar="N",
    default=journal.DEFAULT_PAGE_BYTES,
    show_default=True,
    help="Page size in payload bytes (one larger event still comes whole).",
)
@pass_settings
def read(settings: Settings, session_id: str, cursor: str | None, max_bytes: int) -> None:
    """Print one page of a session's events, then where to continue.

    With --format json the last line is {"next_cursor": C, "has_more": B}: pass C as
    --cursor for the next page (the one given when the page is empty; null when no
    event was read yet: leave --cursor out then).
    """
    output = settings.output
    kept_none_after = 0
    with settings.open(write=False) as store:
        page = store.read(session_id, cursor=cursor, max_bytes=max_bytes)
        for event in page.events:
            output.event(event)
        if page.next_cursor is None:  # (a session never written, or one that keeps none)
            with contextlib.suppress(journal.SessionNotFound):  # (evicted meanwhile)
                kept_none_after = store.get_session(session_id).last_ordinal
    if page.next_cursor is None:
        trailer = "-- no events"
        if kept_none_after:
            trailer += (
                f": the session keeps none after #{kept_none_after} (compacted into a "
                "snapshot or trimmed)"
            )
    else:
        more = " (more events follow: pass it as --cursor)" if page.has_more else ""
        trailer = f"-- next cursor: {page.next_cursor}{more}"
    output.emit({"next_cursor": page.next_cursor, "has_more": page.has_more}, trailer)


@main.command()
@session_option
@cursor_option
@pass_settings
def watch(settings: Settings, session_id: str, cursor: str | None) -> None:
    """Replay a session's events, then follow new ones live.

    Ends by itself once the session is resolved, expired or cancelled and every event was
    printed; Ctrl+C, SIGTERM or SIGHUP stop earlier (exit status 130, 143, 129; a script
    that starts it in the background, where SIGINT is ignored, stops it with SIGTERM).
    With --format json the last line says how it ended: {"end": STATE}, or {"end":
    "stopped", "cursor": C}, C the cursor to resume from with --cursor (the one given, or
    null, when nothing was printed). A session past its --ttl-ms is expired by a writer
    (a process with the store open for writing, any write command, or `journal sessions
    expire`), not by the watch itself.
    """
    watch_events(settings, session_id, cursor)


main.add_command(sessions)
main.add_command(demo)
main.add_command(compact)
main.add_command(verify)
main.add_command(stats)
main.add_command(export)
main.add_command(import_)
main.add_command(cursor_key)
main.add_command(retention)

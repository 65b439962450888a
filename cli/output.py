"""How the `journal` command prints: NDJSON or human lines, errors and exit statuses.

Every printed line is flushed at once, so `watch` streams through pipes, and output is
serialised by a lock, so the demo's threads never interleave half lines.
"""

from __future__ import annotations

import codecs
import contextlib
import errno
import io
import json
import math
import os
import re
import select
import stat
import sys
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import click

import journal

from .hints import journal_command
from .json_data import json_line
from .rendering import event_quiet, event_record, event_text

__all__ = [
    "BELOW_2_62",
    "EXIT_CODES_HELP",
    "EXIT_INTERRUPTED",
    "EXIT_OUTCOME_UNKNOWN",
    "EXIT_USAGE",
    "CommandFailed",
    "NumberOption",
    "Output",
    "Settings",
    "Share",
    "WholeNumber",
    "cli_message",
    "echo",
    "error_fields",
    "exit_status",
    "given_cursor",
    "given_page_token",
    "is_nats",
    "pass_settings",
    "require_stream",
    "silence_stdout",
    "stop_when_reader_leaves",
]

EXIT_USAGE = 2
EXIT_NOT_FOUND = 3
EXIT_INVALID = 4
EXIT_PRECONDITION = 5
EXIT_OUT_OF_RANGE = 6
EXIT_OTHER = 7
EXIT_OUTCOME_UNKNOWN = 8
EXIT_UNAVAILABLE = 9
EXIT_INTERRUPTED = 130

# Exit statuses group the errors by how a script should react, the way `status` does.
_STATUS_EXIT = {
    "NOT_FOUND": EXIT_NOT_FOUND,
    "INVALID_ARGUMENT": EXIT_INVALID,
    "FAILED_PRECONDITION": EXIT_PRECONDITION,
    "ABORTED": EXIT_PRECONDITION,
    "ALREADY_EXISTS": EXIT_PRECONDITION,
    "OUT_OF_RANGE": EXIT_OUT_OF_RANGE,
    "UNKNOWN": EXIT_OUTCOME_UNKNOWN,
    "UNAVAILABLE": EXIT_UNAVAILABLE,
}

# `\b` keeps click from re-wrapping the table.
EXIT_CODES_HELP = f"""\b
Errors print one line, `journal: error: MESSAGE`, on stderr (with --format json also
{{"error": {{"code", "status", "message"}}}} on stdout); in text a usage error prints
the command's usage and `Try 'journal COMMAND --help'` before it. A command whose later
step fails after an earlier one committed (`sessions own`'s release, `sessions expire`'s
listing) prints what committed first, and its error says so ("committed": true); the
exit status is the failed step's (9: what committed stays; run it again once mended).

\b
Exit status:
  0    success (also when the reader of the output went away, e.g. `| head`; not for
       `export -o -`, whose archive would be cut short: {EXIT_OTHER})
  {EXIT_USAGE}    usage error: unknown option, missing or malformed argument
  {EXIT_NOT_FOUND}    not found: no such session or store
  {EXIT_INVALID}    invalid argument: bad input data, malformed or foreign cursor or page token,
       a closed stdin or stdout the command needs, a store path that is a file (or,
       for init, a directory of other files)
  {EXIT_PRECONDITION}    failed precondition: illegal transition, session exists, session
       not writable, ordinal conflict, expired cursor
  {EXIT_OUT_OF_RANGE}    out of range: the cursor is ahead of the store (restored from a copy?)
  {EXIT_OTHER}    data loss, corruption or any other error (a stdout that cannot be written
       too: the command may have done its work, and says so)
  {EXIT_OUTCOME_UNKNOWN}    outcome unknown: a watched turn's owner died before settling it (or
       the session ended mid-turn: no resume); resume from the error's cursor after
       recovery. Or a nats:// write left without a reply, or a write whose frame the
       disk let neither commit nor be cut off again (WRITE_OUTCOME_UNKNOWN): it may
       have committed; look before writing it again (--idempotency-key makes a
       retried append safe)
  {EXIT_UNAVAILABLE}    unavailable: the store cannot be opened, read or written now (permissions,
       a full disk, an I/O error; a nats:// store's servers do not answer), or an
       archive file cannot be read or written (or `demo --engine jetstream` finds no
       nats-server, or a nats:// store no jetstream extra, nats-py); what was committed
       is intact: mend the cause or wait, then run the command again
  {EXIT_INTERRUPTED}  interrupted (Ctrl+C)
  129, 143  a watch or the demo stopped by SIGHUP or SIGTERM (128 + its number)
"""


class CommandFailed(Exception):
    """A failure of the command itself (not of the library), reported like a JournalError;
    `fields` go into its JSON error object (`error_fields`)."""

    def __init__(
        self,
        message: str,
        code: str = "COMMAND_FAILED",
        status: str = "INTERNAL",
        **fields: str | int | bool | None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.status = status
        vars(self).update(fields)


def exit_status(error: journal.JournalError | CommandFailed) -> int:
    """The exit status of an error family (see EXIT_CODES_HELP); a usage error's is 2,
    whoever found it (click, or the command: `init --file-mode` on a nats:// store)."""
    if error.code == "USAGE":
        return EXIT_USAGE
    return _STATUS_EXIT.get(error.status, EXIT_OTHER)


def require_stream(name: str, advice: str) -> None:
    """Refuse to run when stdin or stdout (`name`) is closed (`<&-`, `>&-`: Python sets
    `sys.stdin`/`sys.stdout` to None): INVALID_ARGUMENT (exit 4) with `advice`."""
    if getattr(sys, name) is None:
        raise CommandFailed(
            f"{name} is closed: {advice}", f"{name.upper()}_CLOSED", "INVALID_ARGUMENT"
        )


def silence_stdout() -> None:
    """Point stdout at /dev/null once its reader is gone, so the flush at interpreter exit
    does not fail again (the recipe of the Python docs, "Note on SIGPIPE")."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, io.UnsupportedOperation):
        pass  # not a real file (e.g. under click's CliRunner): nothing to protect


def stop_when_reader_leaves(gone: threading.Event, stop: threading.Event) -> None:
    """Set `gone` and `stop` when the reader of a piped stdout goes away (`| head` is
    done), so a follower blocked waiting for new events ends now instead of at its next
    write (nothing when stdout is no pipe; the watch ends once `stop` is set otherwise)."""
    try:
        fd = sys.stdout.fileno()
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            return
    except (OSError, ValueError, io.UnsupportedOperation, AttributeError):
        return  # (AttributeError: stdout is closed, None; what is printed is dropped)

    def wait() -> None:
        poller = select.poll()
        poller.register(fd, 0)  # POLLERR (no reader left) is reported whatever the mask
        while not stop.is_set():
            if poller.poll(250):
                gone.set()
                stop.set()

    threading.Thread(target=wait, name="stdout-reader", daemon=True).start()


def echo(line: str, err: bool = False) -> None:
    """Print one line and flush, exactly as given: click.echo strips ANSI escape sequences
    from text going to anything but a terminal, which would change event data printed
    as is (quiet format) or a path in a pipe only. Text format escapes control
    characters itself where data could fake a line.

    A line to stdout is written whole: a buffered write that a signal interrupts (one a
    watch holds, cli/watching.py) returns having written part of it, and a text
    stream's write drops the rest without a word (a 1 MiB line came out as 128 KiB)."""
    stream = None if err else sys.stdout
    buffer = getattr(stream, "buffer", None)
    if stream is None or buffer is None:
        click.echo(line, err=err, color=True)
        return
    encoding, errors = stream.encoding, stream.errors or "strict"
    if codecs.lookup(encoding).name == "ascii":
        encoding, errors = "utf-8", "replace"  # (as click.echo writes to such a stdout)
    stream.flush()
    rest = memoryview((line + "\n").encode(encoding, errors))
    while rest:
        rest = rest[buffer.write(rest) :]
    buffer.flush()


class Output:
    """Prints records in the chosen format: `json` (NDJSON), `text` (human) or `quiet`."""

    def __init__(self, output_format: str) -> None:
        self.format = output_format
        self.broken = False
        # Stdout carries data of its own (`export -o -`): an error is said on stderr only,
        # never as a JSON record in that stream.
        self.stdout_is_data = False
        self._lock = threading.Lock()
        # Whether the main thread is printing a line now, and a signal that came meanwhile
        # (a watch's handlers hold it there, cli/watching.py: `raise_held` raises it).
        self.printing = False
        self.held: BaseException | None = None
        self._said_not_text = False  # (quiet format: data that is not UTF-8, said once)
        self._said_lines = False  # (quiet format: data with a line break, said once)

    @property
    def json(self) -> bool:
        return self.format == "json"

    def emit(
        self,
        record: Mapping[str, Any],
        text: str | None,
        quiet: str | None = None,
        printed: Callable[[], None] | None = None,
    ) -> None:
        """Print `record` as one JSON line, `text` as one line (nothing if None), or in
        quiet format `quiet` (nothing if None); then call `printed` (`_print`)."""
        if self.broken:
            return
        if self.json:
            self._print(json_line(record), printed)
        else:
            self._print(quiet if self.format == "quiet" else text, printed)

    def event(self, event: journal.Event, printed: Callable[[], None] | None = None) -> None:
        """Print an event of `read` or `watch`, rendered in the chosen format only: the
        other renderings of a large payload (base64, a preview) cost more than printing
        it; then call `printed` (`_print`)."""
        if self.broken:
            return
        if self.json:
            self._print(json_line(event_record(event)), printed)
        elif self.format == "quiet":
            text = event_quiet(event)
            if text is not None and "\ufffd" in text and not self._said_not_text:
                self._say_not_text(event)
            if text is not None and not self._said_lines and ("\n" in text or "\r" in text):
                self._said_lines = True
                click.echo(
                    f"journal: warning: the data of event #{event.ordinal} holds a line "
                    "break: --format quiet prints it as is, so its lines are not one event "
                    "each; --format json prints one event per line",
                    err=True,
                )
            self._print(text, printed)
        else:
            self._print(event_text(event), printed)

    def _say_not_text(self, event: journal.Event) -> None:
        """Quiet format printed data that is not UTF-8 text with U+FFFD in place of its
        bytes: say so on stderr, once, with where to get the bytes themselves."""
        try:
            event.data.decode("utf-8")
        except UnicodeDecodeError:
            self._said_not_text = True
            click.echo(
                f"journal: warning: the data of event #{event.ordinal} is not UTF-8 text: "
                "--format quiet prints each byte that is not as U+FFFD (so the line is "
                "not the data); --format json gives the exact bytes, as base64",
                err=True,
            )

    def _print(self, line: str | None, printed: Callable[[], None] | None = None) -> None:
        """Print one line; then `printed()` (a watch notes the line's cursor) while a
        signal is still held, so the end object a signal leads to names the last line
        printed whole. (Noted after the line returned, a signal between the two gave the
        cursor before it, and a watch resumed from that printed the line again: found by a
        supervisor trial; `tests/test_cli_watch_stops.py`.)"""
        if line is None:
            if printed is not None:
                printed()
            return
        with self._lock:
            self.printing = threading.current_thread() is threading.main_thread()
            try:
                echo(line)  # (flushed: watch output streams)
                if printed is not None:
                    printed()
            except BrokenPipeError:
                self.broken = True
                silence_stdout()
                raise
            except OSError as e:
                # (Named: `read > /dev/full` said only "[Errno 28] No space left on device"
                # until 2026-12-05, found by a CLI scripting trial.)
                self.broken = True
                silence_stdout()
                full = e.errno in (errno.ENOSPC, errno.EDQUOT)
                raise CommandFailed(
                    f"cannot write to stdout: {e.strerror or e}; "
                    + ("free space there, or send stdout elsewhere" if full else "check it"),
                    "OS_ERROR",
                ) from None
            finally:
                self.printing = False

    def raise_held(self) -> None:
        """Raise the signal held while a line was printed, if one was (a watch calls this
        once it has noted the cursor of what it printed)."""
        held, self.held = self.held, None
        if held is not None:
            raise held

    def error(
        self, error: journal.JournalError | CommandFailed, exit_code: int | None = None
    ) -> int:
        """Report an error (one stderr line; a JSON object on stdout too in json format:
        code, status, message and the error's own fields) and return its exit status."""
        fields = error_fields(error)
        message = cli_message(error.message)
        with self._lock:
            cursor = fields.get("cursor") or fields.get("resume_cursor")
            # (Not for a turn of an ended session: resuming would end the same way.)
            resumable = cursor and not fields.get("session_ended")
            hint = f" (resume with --cursor {cursor})" if resumable else ""
            with contextlib.suppress(OSError):  # (stderr full or closed: nothing to tell)
                echo(f"journal: error: {message}{hint}", err=True)
            if self.json and not self.broken and not self.stdout_is_data:
                record = {
                    "error": {
                        "code": error.code,
                        "status": error.status,
                        "message": message,
                        **fields,
                    }
                }
                try:
                    echo(json.dumps(record, separators=(",", ":")))
                except OSError:
                    # The reader went away, or stdout itself failed (a full disk, EIO: the
                    # error being reported may be that one): stderr has the message.
                    self.broken = True
                    silence_stdout()
        return exit_status(error) if exit_code is None else exit_code


def error_fields(error: journal.JournalError | CommandFailed) -> dict[str, Any]:
    """The error's own fields (`earliest_ordinal`, `resume_cursor`, `head_ordinal`, `pid`,
    `expected`, `actual`, `reason`, `segment`, `offset`, `request_id`, `cursor`, ...)."""
    return {
        key: value
        for key, value in vars(error).items()
        if not key.startswith("_")
        and key not in ("message", "code", "status")
        and isinstance(value, (str, int, float, bool, type(None)))
    }


# Library messages name Python calls; the CLI names its commands instead.
_CLI_HINTS: Final = (
    (
        "create it first (Journal.create_session or `journal sessions list` to check the id)",
        "create it first with `journal sessions create ID` or `journal append --create` "
        "(`journal sessions list` shows the ids)",
    ),
    ("use get_session to inspect it", "`journal sessions show ID` shows it"),
    (
        "look whether it did (get_session) before writing it again; an append retried "
        "with the same idempotency key is safe",
        "look whether it did (`journal sessions show ID`, `journal read`) before writing "
        "it again; an append retried with the same --idempotency-key is safe",
    ),
    (
        "look whether it committed (get_session, read) before writing it again; an append "
        "retried with the same idempotency key is safe",
        "look whether it committed (`journal sessions show ID`, `journal read`) before "
        "writing it again; an append retried with the same --idempotency-key is safe",
    ),
    (
        "(for example Journal.open('nats://host:4222', store='agents'))",
        "(for example --store nats://host:4222/agents)",
    ),
    ("`journal init` or Journal.open(path, create=True)", "`journal init`"),
    (
        "`journal init` or a writable Journal.open(url, store=...); a read-only journal "
        "does not create one",
        "`journal init`",
    ),
    ("`journal init` or Journal.open(url, store=..., create=True)", "`journal init`"),
    (
        ", and a read-only journal does not create one: create it with `journal init` or "
        "a writable Journal.open(path)",
        ": create it with `journal init`",
    ),
    ("(rename=, or `journal import --as NEW_ID`)", "(`journal import --as NEW_ID`)"),
    (
        "(rename=, or `journal import --as NEW_ID` / `--rename OLD=NEW`)",
        "(`journal import --rename OLD=NEW`, or `--as NEW_ID` for a one-session archive)",
    ),
    (" (Journal.verify(fix=True))", ""),  # (after `journal verify --fix [--cut-durable]`)
    (" (Journal.open(path, repair=True) opens the store for it)", ""),
    (' (Journal.open(path, repair="cut-durable") opens the store for it)', ""),
    ("limits=ArchiveLimits(max_content_bytes=...) or --max-bytes", "--max-bytes"),
    ("limits=ArchiveLimits(max_sessions=...) or --max-sessions", "--max-sessions"),
    (
        "limits=ArchiveLimits(max_metadata_bytes=...) or --max-metadata-bytes",
        "--max-metadata-bytes",
    ),
    ("create it before owning it", "create it first with `journal sessions create ID`"),
    (
        "wait for it to finish, or pass a longer wait_s",
        "wait for it to finish, or pass a longer --wait SECONDS",
    ),
    (
        "resume the session (resume_session), then own() it",
        "resume the session (`journal sessions resume ID`), then run `journal sessions own "
        "ID` again",
    ),
    (
        "open it with readonly=True (the CLI's read commands do)",
        "read commands (`journal read`, `journal watch`, `journal sessions list`) work; "
        "writes need a user who may write it",
    ),
    (
        "use `with journal.own(id) as owner, owner.turn(request_id) as turn`",
        "turns are recorded by a runtime through the library (`journal.own`, "
        "`owner.turn`); the CLI appends other types",
    ),
)


# Library messages that open with a parameter's name: the CLI's name for it instead
# (anchored at the start, so a value quoted later in a message is never touched).
_CLI_SUBJECTS: Final = (
    (re.compile(r"session_id "), lambda m: "session id "),
    (
        re.compile(r"store must name the journal's stream"),
        lambda m: "--store nats://HOST:PORT/NAME must name the journal's stream",
    ),
    (re.compile(r"idempotency_key "), lambda m: "--idempotency-key "),
    (re.compile(r"file_mode "), lambda m: "--file-mode "),
    (
        re.compile(r"events\[(\d+)\]\.(type|data|request_id) "),
        lambda m: f"event {int(m[1]) + 1}'s {m[2].replace('_', ' ')} ",
    ),
)


def cli_message(message: str) -> str:
    for pattern, subject in _CLI_SUBJECTS:
        message = pattern.sub(subject, message, count=1) if pattern.match(message) else message
    for python, command in _CLI_HINTS:
        message = message.replace(python, command)
    # Every command it suggests names the store as the user gave it (`hints.py`).
    command = journal_command()
    if command == "journal":
        return message
    return _SUGGESTED.sub(lambda _: f"`{command} ", message)


# A suggested command that does not name its store yet.
_SUGGESTED: Final = re.compile(r"`journal (?!--store )")


# What a script passes back for a JSON null it printed as text (`jq -r` prints "null").
_NULLS: Final = frozenset({"null", "none", "nil", "undefined"})


def given_cursor(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """A `--cursor` option's value: empty or blank means the start (`--cursor "$SAVED"`
    with the variable unset), null as text is CURSOR_MALFORMED saying what it means."""
    if value is None or not value.strip():
        return None
    if value.strip().lower() not in _NULLS:
        return value
    raise journal.CursorMalformed(
        f"--cursor {value!r} is no cursor: a null next_cursor (or a stopped watch's null "
        "cursor) means no event was read yet, so there is nothing to resume after: leave "
        "--cursor out (or pass it empty) to start from the beginning, or pass the cursor "
        "of the last event handled"
    )


def given_page_token(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """A `--page-token` option's value: empty or blank means the first page, null as
    text is INVALID_PAGE_TOKEN saying what to pass."""
    if value is None or not value.strip():
        return None
    if value.strip().lower() not in _NULLS:
        return value
    raise journal.InvalidPageToken(
        f"--page-token {value!r} is no page token: pass a page's next_page_token (an "
        "empty one means the page printed was the last: stop there), or leave "
        "--page-token out for the first page"
    )


# SPEC 7.3: times, TTLs, history limits and ordinals are ints below 2**62. The options
# that take them are checked by click against this bound, so an out-of-range value is a
# usage error naming the option, as a negative one is.
BELOW_2_62: Final = (1 << 62) - 1


class WholeNumber(click.IntRange):
    """A numeric option's int and its bounds (`click.IntRange`), refused by what it is.

    click's own refusal of a word said "'abc' is not a valid integer range", as if the
    option took a range; this says "'abc' is not a whole number". Its name is also the
    metavar of an option that sets none (`N` is the usual one)."""

    name = "whole number"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        try:
            number = click.INT.convert(value, param, ctx)
        except click.BadParameter:
            self.fail(f"{value!r} is not a whole number", param, ctx)
        # (click said "0 is not in the range 1<=x<=65535.", a formula to decode)
        if (self.min is not None and number < self.min) or (
            self.max is not None and number > self.max
        ):
            self.fail(f"{number} is out of range: give {self.in_words()}", param, ctx)
        return super().convert(number, param, ctx)

    def in_words(self) -> str:
        """The numbers the option takes, in words (`1 to 65535`, `1 or more`), for its
        help (`NumberOption`; click's `[1<=x<=65535]`) and its refusal."""
        if self.max is None:
            return f"{self.min} or more"
        top = {BELOW_2_62: "below 2^62", 1 << 62: "up to 2^62"}.get(int(self.max))
        if self.min is None:
            return top or f"at most {self.max}"
        return f"{self.min} or more, {top}" if top else f"{self.min} to {self.max}"


class Share(click.FloatRange):
    """A fraction from 0 to 1 (`click.FloatRange`); a word or NaN is refused as "not a
    number from 0 to 1" where click said "not a valid float range" (and passed NaN on)."""

    name = "number"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        try:
            number = click.FLOAT.convert(value, param, ctx)
        except click.BadParameter:
            self.fail(f"{value!r} is not a number from 0 to 1", param, ctx)
        # (click's range check let NaN through, it compares False, and said "2.0 is not in
        # the range 0.0<=x<=1.0." of the others)
        if math.isnan(number) or not 0 <= number <= 1:
            self.fail(f"{value!r} is not a number from 0 to 1", param, ctx)
        return super().convert(number, param, ctx)

    def in_words(self) -> str:
        """For the help (`NumberOption`): `[default: 0.5; 0 to 1]` (click's `0.0<=x<=1.0`)."""
        return "0 to 1"


class NumberOption(click.Option):
    """An option of a `WholeNumber` or a `Share`: its help gives the range in the type's
    words (`[default: 3; 1 to 10]`) where click gives a formula (`1<=x<=10`). Through
    `Option.get_help_extra`, click's public hook for the bracket after an option's help
    (click 8.2), rather than by overriding the range types' private `_describe_range`."""

    def get_help_extra(self, ctx: click.Context) -> Any:
        extra = super().get_help_extra(ctx)
        if isinstance(self.type, WholeNumber | Share) and "range" in extra:
            extra["range"] = self.type.in_words()
        return extra


def is_nats(store: str) -> bool:
    """Whether `--store` names a store on NATS JetStream (`nats://...`)."""
    return store.startswith("nats://")


@dataclass
class Settings:
    """The global options, shared with every command through the click context."""

    store: str
    output: Output = field(repr=False)
    # More keywords for `Journal.open` (a test's `file_ops`: the engine's fault points,
    # SPEC 1.3), given as click's `obj` (`main.main(args, obj={"file_ops": ops})`).
    open_options: Mapping[str, Any] = field(default_factory=dict, repr=False)

    def open(self, write: bool = True, repair: bool | str = False) -> journal.Journal:
        """Open the existing store (`StoreNotFound` tells the user to run `journal init`).

        Commands that only read open it read-only, always: they change no file of the
        store (LMDB's reader table aside), create no key file, repair nothing, and never
        wait for a writer. `repair`: `verify --fix`'s on disk (`Journal.open`)."""
        options = {**self.open_options, "repair": repair} if repair else self.open_options
        return journal.Journal.open(self.store, create=False, readonly=not write, **options)


pass_settings = click.make_pass_decorator(Settings)

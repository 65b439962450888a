"""Traps a new user of the `journal` command met in trials (SPEC.md section 13), through
real processes as the user runs them: usage errors, cursors and page tokens passed back
from a script, the listing's columns and cut archives."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from _cli_runs import cli_env, json_error, run_cli
from _small_disk import on_a_small_disk

from journal import EventIn, InvalidArgument, Journal

_cli, _error = run_cli, json_error


@pytest.fixture
def store(tmp_path: Path) -> Path:
    path = tmp_path / "store"
    with Journal.open(path, create=True) as j:
        j.create_session("s")
        j.append("s", [EventIn("message", b"one"), EventIn("message", b"two")])
        j.resolve_session("s")  # (a watch of it ends by itself)
    return path


# -- usage errors ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "usage", "says"),
    [
        # click's parser raises these without the command's context: they printed the
        # error line alone, where other usage errors print the usage line first.
        (("read", "--session"), "journal read [OPTIONS]", "Option '--session' requires"),
        (("read", "-s", "s", "--cursor"), "journal read [OPTIONS]", "Option '--cursor'"),
        (("read", "-s", "s", "--format"), "journal read [OPTIONS]", "Option '--format'"),
        (("sessions", "watch", "--cursor"), "journal sessions watch [OPTIONS]", "Option"),
        (("sessions", "create", "x", "--tag"), "journal sessions create [OPTIONS] ID", "Option"),
        # The command's own usage errors printed no usage line either.
        (("cursor-key", "--new", "--rotate"), "journal cursor-key [OPTIONS]", "--new, --rotate"),
        (("init", "--replicas", "2"), "journal init [OPTIONS]", "--replicas is for nats://"),
        # click's usage errors printed the usage line but not where help is.
        (("read", "--bogus"), "journal read [OPTIONS]", "No such option '--bogus'"),
        # 0 said "not in the range 1<=x<=4611686018427387903", not how to lift the limit.
        (
            ("retention", "--max-history-bytes", "0"),
            "journal retention [OPTIONS]",
            "Invalid value for '--max-history-bytes': 0 is not a limit: give 1 or more, or "
            "none for no limit",
        ),
    ],
)
def test_every_usage_error_prints_the_usage_and_where_help_is(
    store: Path, args: tuple[str, ...], usage: str, says: str
) -> None:
    done = _cli(store, *args)
    assert done.returncode == 2, done.stderr
    command = usage.split(" [")[0]
    assert done.stderr.splitlines() == [
        f"Usage: {usage}",
        f"Try '{command} --help' for help.",
        done.stderr.splitlines()[-1],
    ], done.stderr
    assert done.stderr.splitlines()[-1].startswith(f"journal: error: {says}"), done.stderr
    # With --format json the error object is on stdout, and stderr is the one error line.
    as_json = _cli(store, "--format", "json", *args)
    assert as_json.returncode == 2 and _error(as_json)["code"] == "USAGE"
    assert as_json.stderr.count("\n") == 1, as_json.stderr


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("read", "-s", "s", "--max-bytes", "abc"), "'--max-bytes': 'abc' is not a whole number"),
        (("cursor-key", "--retire", "key-1"), "'--retire': 'key-1' is not a whole number"),
        (("append", "-s", "s", "--expected-last", "x"), "'x' is not a whole number"),
        (("sessions", "list", "--page-size", "ten"), "'ten' is not a whole number"),
        (("compact", "--dead-share", "half"), "'half' is not a number from 0 to 1"),
    ],
)
def test_a_word_for_a_number_is_refused_as_not_a_number(
    store: Path, args: tuple[str, ...], says: str
) -> None:
    # click said "'abc' is not a valid integer range" (or "float range"), as if the
    # option took a range, and `--help` showed its value as INTEGER RANGE.
    done = _cli(store, *args)
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines()[-1].endswith(says), done.stderr
    assert "range" not in done.stderr.splitlines()[-1], done.stderr
    option = next(arg for arg in args if arg.startswith("--"))
    shown = _cli(store, *args[: args.index(option)], "--help").stdout
    assert "RANGE" not in shown and f"{option} " in shown, shown


def test_a_nan_dead_share_is_a_usage_error_naming_the_option(store: Path) -> None:
    # click's range check let NaN through, and the library refused it with exit 4 as
    # "dead_share must be a number between 0 and 1, got nan", a Python parameter's name.
    done = _cli(store, "compact", "--dead-share", "nan")
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines()[-1] == (
        "journal: error: Invalid value for '--dead-share': 'nan' is not a number from 0 to 1"
    ), done.stderr


# -- cursors and page tokens passed back from a script -------------------------------------------

_CURSOR_COMMANDS = [
    ("read", "-s", "s"),
    ("watch", "-s", "s"),
    ("sessions", "watch", "-s", "s"),
    ("sessions", "watch"),  # (the lifecycle feed: before, it followed until killed)
]


@pytest.mark.parametrize("command", _CURSOR_COMMANDS)
@pytest.mark.parametrize("cursor", ["null", "None"])
def test_a_null_cursor_passed_back_says_to_leave_the_option_out(
    store: Path, command: tuple[str, ...], cursor: str
) -> None:
    # A page of an empty session ends with {"next_cursor": null}, and a watch stopped
    # before any event with {"end": "stopped", "cursor": null}: passed back as text it
    # was "the session cursor is 4 characters long, not 59 (it was truncated ...)".
    with Journal.open(store) as j:
        j.create_session("empty")
    page = _cli(store, "--format", "json", "read", "-s", "empty")
    assert json.loads(page.stdout)["next_cursor"] is None
    done = _cli(store, *command, "--cursor", cursor, timeout=20)
    assert done.returncode == 4, (done.stdout, done.stderr)
    (line,) = done.stderr.splitlines()
    assert f"--cursor '{cursor}' is no cursor" in line, line
    assert "nothing to resume after" in line and "leave --cursor out" in line, line
    assert "characters long" not in line, line


def test_a_null_page_token_is_refused_and_an_empty_one_is_the_first_page(store: Path) -> None:
    # "null" passed back was an invalid token without a word on what to pass; an empty
    # one is the first page (as `--cursor ""` is the start), and the last page prints
    # {"next_page_token": ""}: stop there.
    with Journal.open(store) as j:
        j.create_session("t")
    last = _cli(store, "--format", "json", "sessions", "list", "--page-size", "5")
    assert json.loads(last.stdout.splitlines()[-1]) == {"next_page_token": ""}
    first = _cli(store, "--format", "json", "sessions", "list", "--page-token", "")
    assert first.returncode == 0, first.stderr
    assert first.stdout == _cli(store, "--format", "json", "sessions", "list").stdout
    done = _cli(store, "--format", "json", "sessions", "list", "--page-token", "null")
    assert done.returncode == 4, (done.stdout, done.stderr)
    error = _error(done)
    assert error["code"] == "INVALID_PAGE_TOKEN", error
    assert "--page-token 'null' is no page token" in error["message"], error
    assert "leave --page-token out for the first page" in error["message"], error
    assert '"session_id"' not in done.stdout


# -- the listing's columns -----------------------------------------------------------------------

_LONG = "a-rather-long-session-id-for-review-0001"  # 40 columns
_TOO_LONG = "x" * 61  # past the column's 48: printed whole


def _state_column(line: str) -> int:
    return line.index("  open ") + 2 if "  open " in line else line.index("  resolved ") + 2


def test_sessions_create_prints_its_row_as_a_listing_of_it_alone(store: Path) -> None:
    # The id was padded to 16 columns, so `sessions create a` printed 17 spaces after it.
    created = _cli(store, "sessions", "create", "a")
    assert created.returncode == 0, created.stderr
    assert created.stdout == "a" + " " * 9 + "open       0 events\n", created.stdout
    assert created.stdout == _cli(store, "sessions", "list", "--state", "open").stdout
    json_line = _cli(store, "--format", "json", "sessions", "create", "b").stdout
    assert json.loads(json_line)["session_id"] == "b"  # (NDJSON as it was)


def test_an_id_past_the_column_does_not_widen_every_row(store: Path, tmp_path: Path) -> None:
    # One id over 48 columns padded every other row to 48 (sessions list) or to its own
    # width (import --list), though the widest id that fits was 40.
    for session_id in ("a", _LONG, _TOO_LONG):
        assert _cli(store, "sessions", "create", session_id).returncode == 0
    listed = _cli(store, "sessions", "list").stdout.splitlines()
    archive = tmp_path / "all.archive"
    assert _cli(store, "export", "--all", "-o", str(archive)).returncode == 0
    contents = _cli(store, "import", "--list", str(archive)).stdout.splitlines()[1:]
    for lines in (listed, contents):
        rows = {line.split()[0]: line for line in lines}
        assert set(rows) == {"a", _LONG, _TOO_LONG, "s"}, lines
        columns = {_state_column(rows[i]) for i in ("a", _LONG, "s")}
        assert columns == {len(_LONG) + 2}, lines
        assert rows[_TOO_LONG].startswith(_TOO_LONG + "  open "), lines
    as_json = _cli(store, "--format", "json", "sessions", "list").stdout.splitlines()
    assert [json.loads(line)["session_id"] for line in as_json] == sorted(rows)


# -- cut archives --------------------------------------------------------------------------------


def test_a_cut_archive_says_where_the_file_ends_and_what_to_do(store: Path, tmp_path: Path) -> None:
    # `head -c 100 good.archive > bad.archive` was "invalid archive (truncated) at byte 0:
    # the archive ends before its footer": byte 0 of the decompressed content, read as a
    # place in the file, said nothing of where it was cut; a 0-byte file was "does not
    # start with a zstd frame (not a session-journal archive)".
    with Journal.open(store) as j:
        j.create_session("big")
        for n in range(40):  # (over one zstd block: a cut mid-way has whole records)
            j.append("big", [EventIn("message", os.urandom(60_000) + bytes([n]))])
    good = tmp_path / "good.archive"
    assert _cli(store, "export", "--all", "-o", str(good)).returncode == 0
    data = good.read_bytes()
    target = tmp_path / "target"
    assert _cli(target, "init").returncode == 0
    cuts = {0: "not_an_archive", 3: "not_an_archive", 100: "truncated"}
    cuts |= {len(data) // 2: "truncated", len(data) - 1: "truncated"}
    offsets = []
    for size, reason in cuts.items():
        cut = tmp_path / f"cut-{size}.archive"
        cut.write_bytes(data[:size])
        for args in (("import", str(cut)), ("import", "--list", str(cut))):
            done = _cli(target, "--format", "json", *args)
            assert done.returncode == 4, (size, done.stderr)
            error = _error(done)
            assert (error["code"], error["reason"]) == ("ARCHIVE_INVALID", reason), error
            message = error["message"]
            assert f"{size} bytes" in message, (size, message)
            assert "cut" in message and "export it again" in message, (size, message)
            assert "at byte 0" not in message, (size, message)
            offsets.append(error["offset"])
            if error["offset"]:
                assert f"at byte {error['offset']} of its decompressed content" in message
    assert any(offsets), offsets  # (a cut after whole records says where its content ends)
    # An empty pipe to `import --as` (copied aside to be read twice) says the same.
    piped = _cli(target, "--format", "json", "import", "--as", "n", "-", stdin="")
    assert piped.returncode == 4 and "the file is empty (0 bytes)" in _error(piped)["message"]
    assert _cli(target, "import", str(good)).returncode == 0  # (the whole one imports)


def test_an_import_under_the_same_ids_does_not_say_as_itself(store: Path, tmp_path: Path) -> None:
    # Every line said "imported s as s (2 events)", renamed or not.
    archive = tmp_path / "s.sja"
    assert _cli(store, "export", "-s", "s", "-o", str(archive)).returncode == 0
    done = _cli(tmp_path / "other", "init")
    assert done.returncode == 0, done.stderr
    kept = _cli(tmp_path / "other", "import", str(archive))
    assert kept.returncode == 0, kept.stderr
    assert kept.stdout.splitlines()[0] == "imported s (2 events)", kept.stdout
    renamed = _cli(tmp_path / "other", "import", str(archive), "--as", "t")
    assert renamed.stdout.splitlines()[0] == "imported s as t (2 events)", renamed.stdout


@pytest.mark.parametrize(
    ("name", "hint"),
    [
        ("list", "journal sessions list"),
        ("own", "journal sessions own"),
        ("resolve", "journal sessions resolve"),
        ("watch-sessions", "journal sessions watch"),
        ("list-sessions", "journal sessions list"),
        ("tail", "journal watch -s ID"),
    ],
)
def test_a_command_of_the_sessions_group_named_alone_is_pointed_to(
    store: Path, name: str, hint: str
) -> None:
    """`journal list`, `journal own ID` or `journal watch-sessions` (a supervisor author's
    first guesses) said "No such command", at best "Did you mean 'sessions'?", which
    prints the group's help: the error names the command itself now (supervisor trial)."""
    done = _cli(store, name, "x")
    assert done.returncode == 2
    assert f"No such command '{name}': did you mean `{hint}`?" in done.stderr, done.stderr
    error = _error(_cli(store, "--format", "json", name))
    assert error["code"] == "USAGE" and f"`{hint}`" in error["message"]


def test_the_listings_help_says_how_a_dead_workers_turn_shows_and_what_settles_it(
    store: Path,
) -> None:
    """A supervisor author reading `sessions list --help` learnt nothing of `open_turn`
    and `owner`, nor that `sessions own` settles such a turn (supervisor trial)."""
    done = _cli(store, "sessions", "list", "--help")
    text = " ".join(done.stdout.split())
    assert '"open_turn" R and "owner" null' in text
    assert "journal sessions own ID" in text


def test_a_session_whose_events_were_all_compacted_lists_where_they_ended(
    store: Path, tmp_path: Path
) -> None:
    """A session whose every event went into a snapshot (a fold's `snapshot(compact=True)`,
    `compact_session`) was listed as `0 events`, as a session never written: its
    events and its next ordinal showed nowhere in `sessions list`, and `read` said
    `-- no events` (runtime-author trial).
    """
    with Journal.open(store) as j:
        j.create_session("folded")
        j.append("folded", [EventIn("step", b"%d" % n) for n in range(3)])
        j.compact_session("folded", through_ordinal=3, snapshot=b"state")
        j.create_session("fresh")
    listed = _cli(store, "sessions", "list").stdout.splitlines()
    folded = next(line for line in listed if line.startswith("folded "))
    fresh = next(line for line in listed if line.startswith("fresh "))
    assert folded.split("  open ")[1].strip().startswith("0 events (after #3)"), folded
    assert fresh.rstrip().endswith("open       0 events"), fresh
    archive = tmp_path / "folded.sja"
    assert _cli(store, "export", "-s", "folded", "-o", str(archive)).returncode == 0
    contents = _cli(store, "import", "--list", str(archive)).stdout.splitlines()
    assert "0 events (after #3)  snapshot=#3" in contents[1], contents
    # `read` said "-- no events" for both too.
    read = _cli(store, "read", "-s", "folded")
    assert read.stdout == (
        "-- no events: the session keeps none after #3 (compacted into a snapshot or trimmed)\n"
    ), read.stdout
    assert _cli(store, "read", "-s", "fresh").stdout == "-- no events\n"
    assert json.loads(_cli(store, "--format", "json", "read", "-s", "folded").stdout) == {
        "next_cursor": None,
        "has_more": False,
    }


def test_a_compacted_session_s_snapshot_is_printed_by_sessions_snapshot(store: Path) -> None:
    """A compacted session's `read` starts past #1, and nothing in the command line showed
    the snapshot or said why (runtime-author trial): `sessions snapshot ID` prints it,
    with the cursor that resumes after it."""
    with Journal.open(store) as j:
        j.create_session("c")
        j.append("c", [EventIn("step", b'{"n": %d}' % n) for n in range(1, 6)])
        j.compact_session("c", through_ordinal=3, snapshot=b'{"total": 6}')
    text = _cli(store, "sessions", "snapshot", "c").stdout.splitlines()
    assert text[0] == 'snapshot of c through #3: {"total": 6}', text
    cursor = text[1].removeprefix("-- resume after it with --cursor ")
    record = json.loads(_cli(store, "--format", "json", "sessions", "snapshot", "c").stdout)
    assert record == {"session_id": "c", "ordinal": 3, "cursor": cursor, "data": {"total": 6}}
    assert _cli(store, "--format", "quiet", "sessions", "snapshot", "c").stdout == (
        '{"total": 6}\n'
    )
    after = _cli(store, "--format", "json", "read", "-s", "c", "--cursor", cursor).stdout
    assert [json.loads(line).get("ordinal") for line in after.splitlines()] == [4, 5, None]
    # A session never compacted: said in text, nulls in JSON.
    assert _cli(store, "sessions", "snapshot", "s").stdout == (
        "-- no snapshot: session s keeps its history from #1\n"
    )
    none = json.loads(_cli(store, "--format", "json", "sessions", "snapshot", "s").stdout)
    assert none == {"session_id": "s", "ordinal": None, "cursor": None, "data": None}


# -- paths that are no store ---------------------------------------------------------------


@pytest.mark.parametrize("args", [("sessions", "list"), ("cursor-key",)])
def test_a_directory_that_is_no_store_is_not_advised_to_be_initialised(
    store: Path, tmp_path: Path, args: tuple[str, ...]
) -> None:
    """Until 2026-12-07 a non-empty directory that is no store, and a directory inside
    a store, were told "create it with `journal --store DIR init`", which then refused
    (not empty; inside a store): a new-user trial."""
    other = tmp_path / "notes"
    other.mkdir()
    (other / "readme.txt").write_text("x")
    done = _cli(other, *args, "--format", "json")
    assert done.returncode == 3, done.stderr
    error = _error(done)
    assert error["code"] == "STORE_NOT_FOUND", error
    message = error["message"]
    assert "init" not in message, message
    assert "not empty" in message and "'readme.txt'" in message, message
    assert "an empty or new" in message, message
    inside = store / "segments"
    done = _cli(inside, *args, "--format", "json")
    assert done.returncode == 3, done.stderr
    message = _error(done)["message"]
    assert "init" not in message, message
    assert f"inside the journal store {str(store)!r}" in message, message
    assert f"use {str(store)!r}" in message, message


@pytest.mark.parametrize(
    "url", ["nats:/127.0.0.1/agents", "nats//host:4222/agents", "nats:host:4222/agents"]
)
@pytest.mark.parametrize(
    "args",
    [
        ("--store", "URL", "sessions", "list"),
        ("--store", "URL", "init"),
        ("--store", "URL", "init", "--replicas", "3"),
        ("--store", "URL", "cursor-key"),
        ("demo", "--store", "URL"),
    ],
)
def test_a_misspelt_nats_url_is_refused_not_taken_for_a_directory(
    tmp_path: Path, url: str, args: tuple[str, ...]
) -> None:
    """Until 2026-12-07 `nats:/host/x` and `nats//host/x` were local paths: a listing
    exited 3 advising `init`, and `init` made the directories `./nats:/...` (a trial)."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "cli",
            "--format",
            "json",
            *(url if a == "URL" else a for a in args),
        ],
        capture_output=True,
        text=True,
        env=cli_env(),
        cwd=tmp_path,
        timeout=60,
        check=False,
    )
    assert done.returncode == 4, (done.returncode, done.stderr)
    error = _error(done)
    assert error["code"] == "INVALID_ARGUMENT", error
    assert "nats://HOST:PORT/STORE" in error["message"], error
    assert os.listdir(tmp_path) == [], os.listdir(tmp_path)
    with pytest.raises(InvalidArgument, match="nats://HOST:PORT/STORE"):
        Journal.open(url, create=True)


def test_a_nats_url_given_as_a_pathlib_path_is_told_to_be_a_str() -> None:
    """`Path("nats://h:4222/x")` is `nats:/h:4222/x` (pathlib collapses the slashes): it
    was told it is misspelt, two slashes after 'nats:', which its author did type."""
    with pytest.raises(InvalidArgument, match="pass the URL as a str") as refused:
        Journal.open(Path("nats://127.0.0.1:4222/agents"))
    assert "nats://HOST:PORT/STORE" in str(refused.value), refused.value


@pytest.mark.parametrize("url", ["nats:/127.0.0.1:4222", "nats//h:4222", "NATS://h:4222"])
def test_a_misspelt_nats_url_with_a_stream_s_options_is_told_it_is_misspelt(url: str) -> None:
    """`Journal.open(URL, store="agents", replicas=3)` with the URL misspelt was told that
    store= and replicas= are for nats:// stores and a local store is named by its path
    alone, as if the user had meant a local store."""
    for options in ({"store": "agents"}, {"store": "agents", "replicas": 3}):
        with pytest.raises(InvalidArgument, match="nats://HOST:PORT/STORE"):
            Journal.open(url, **options)


def _as_a_user(*args: str) -> subprocess.CompletedProcess[str]:
    """The CLI run by root without CAP_DAC_OVERRIDE: a user whom permissions stop."""
    return subprocess.run(
        [
            "setpriv",
            "--inh-caps=-all",
            "--bounding-set=-dac_override,-dac_read_search",
            sys.executable,
            "-m",
            "cli",
            *args,
        ],
        capture_output=True,
        text=True,
        env=cli_env(),
        timeout=60,
        check=False,
    )


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None,
    reason="drops root's capabilities with setpriv(1): run as root",
)
def test_init_in_an_empty_directory_it_may_not_write_says_so(tmp_path: Path) -> None:
    """No store is there: until 2026-12-07 the advice said the store was this user's and
    one of its files was not writable ("a restore or a chmod?"), a new-user trial. Root
    without CAP_DAC_OVERRIDE is a user who owns the directory but may not write it."""
    empty = tmp_path / "empty"
    empty.mkdir()
    empty.chmod(0o555)
    done = _as_a_user("--store", str(empty), "--format", "json", "init")
    assert done.returncode == 9, (done.returncode, done.stderr)
    error = _error(done)
    message = error["message"]
    assert f"this user may not create the store's files in {str(empty)!r}" in message, error
    assert "restore" not in message and "is this user's" not in message, error
    assert os.listdir(empty) == []


# -- export destinations, import --as, stats ---------------------------------------------------


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None,
    reason="drops root's capabilities with setpriv(1): run as root",
)
@pytest.mark.parametrize("archive_format", ["archive", "ndjson"])
def test_an_export_to_a_directory_this_user_may_not_write_is_unavailable(
    store: Path, tmp_path: Path, archive_format: str
) -> None:
    """Until 2026-12-07 it was INVALID_ARGUMENT (exit 4, "bad input"), where `--help`
    gives exit 9 to an archive file that cannot be written, and a full disk met while
    writing it was exit 9 already: a new-user trial. The path is right; the place is not
    writable, which is mended outside the command (or another place chosen)."""
    shut = tmp_path / "shut"
    shut.mkdir()
    shut.chmod(0o555)
    dest = shut / "out.sja"
    done = _as_a_user(
        "--store", str(store), "--format", "json",
        "export", "-s", "s", "-o", str(dest), "--format", archive_format,
    )  # fmt: skip
    assert done.returncode == 9, (done.returncode, done.stderr)
    error = _error(done)
    assert (error["code"], error["status"]) == ("OS_ERROR", "UNAVAILABLE"), error
    message = error["message"]
    assert f"this user may not write files in {str(shut)!r}" in message, message
    assert "export to a directory it may write" in message and "-o -" in message, message
    assert os.listdir(shut) == []


def test_an_export_to_a_read_only_file_system_is_unavailable(store: Path, tmp_path: Path) -> None:
    """As root too (permissions do not stop root, a read-only mount does): exit 9, as
    above, where it was exit 4 until 2026-12-07."""
    script = f"""
import json, subprocess, sys
done = subprocess.run(
    [sys.executable, "-m", "cli", "--store", {str(store)!r}, "--format", "json",
     "export", "-s", "s", "-o", sys.argv[1] + "/out.sja"],
    capture_output=True, text=True, timeout=60,
)
print(done.returncode)
print(done.stdout.splitlines()[-1] if done.stdout else "")
"""
    status, line = on_a_small_disk(tmp_path, script, options="ro,size=1m")
    error = json.loads(line)["error"]
    assert (status, error["code"]) == ("9", "OS_ERROR"), (status, error)
    assert "is on a read-only file system" in error["message"], error
    assert "-o -" in error["message"], error


@pytest.mark.parametrize("where", ["below_a_file", "missing_directory"])
def test_an_export_to_a_path_that_names_no_directory_stays_a_bad_argument(
    store: Path, tmp_path: Path, where: str
) -> None:
    """A path through a file, or into a directory that does not exist, is the path given
    wrong (exit 4, INVALID_ARGUMENT), not a place that cannot be written now."""
    (tmp_path / "file").write_text("x")
    parent = tmp_path / ("file" if where == "below_a_file" else "missing")
    done = _cli(store, "--format", "json", "export", "-s", "s", "-o", str(parent / "out.sja"))
    assert done.returncode == 4, done.stderr
    assert _error(done)["code"] == "INVALID_ARGUMENT", done.stdout


def test_import_as_of_an_archive_of_several_sessions_says_what_to_do(
    store: Path, tmp_path: Path
) -> None:
    """It said only "--as needs a one-session archive; this one holds 2" (a new-user
    trial): not which sessions, nor the ways to import them."""
    with Journal.open(store) as j:
        j.create_session("t")
    archive = tmp_path / "both.sja"
    assert _cli(store, "export", "--all", "-o", str(archive)).returncode == 0
    target = tmp_path / "target"
    for source in (str(archive), "-"):  # (stdin is copied aside to be read twice)
        done = subprocess.run(
            [sys.executable, "-m", "cli", "--store", str(target), "--format", "json",
             "import", "--as", "new", source],
            stdin=archive.open("rb"),
            capture_output=True,
            env=cli_env(),
            timeout=60,
            check=False,
        )  # fmt: skip
        assert done.returncode == 2, done.stderr
        error = json.loads(done.stdout.decode().splitlines()[-1])["error"]
        assert error["code"] == "USAGE", error
        message = error["message"]
        assert "--as NEW_ID imports the session of a one-session archive" in message, message
        assert "this one holds 2 sessions (s, t)" in message, message
        assert "leave --as out" in message and "--rename OLD=NEW" in message, message
        assert "journal export -s ID" in message, message
    assert not target.exists()  # (nothing was opened, nor created)


def test_stats_tells_the_zeros_written_ahead_from_the_bytes_used(store: Path) -> None:
    """A new store's active segment is written ahead with 4 MiB of zeros: stats said
    "4,194,320 bytes on disk" for it empty, and the same after 900 KB of appends (a
    new-user trial: "counts zeros ahead"). It now says how many of them are zeros."""
    first = json.loads(_cli(store, "--format", "json", "stats").stdout)
    with Journal.open(store) as j:
        j.append("t", [EventIn("m", b"x" * 100_000)], create=True)
    after = json.loads(_cli(store, "--format", "json", "stats").stdout)
    assert first["segment_bytes"] == after["segment_bytes"]  # (the zeros took the data)
    used = [s["segment_bytes"] - s["preallocated_bytes"] for s in (first, after)]
    assert 100_000 < used[1] - used[0] < 101_000, (first, after)
    assert after["preallocated_bytes"] > 3_000_000, after
    text = _cli(store, "stats").stdout.strip()
    assert text == (
        f"sessions: open 1, resolved 1; segments: 1 ({used[1]:,} bytes used; "
        f"{after['segment_bytes']:,} on disk with {after['preallocated_bytes']:,} "
        "zeros written ahead for appends)"
    ), text


def test_compact_s_help_says_where_a_session_is_compacted_into_a_snapshot(store: Path) -> None:
    """A new-user trial looked for the CLI form of `compact_session`: there is none (the
    snapshot is the application's state, SPEC 13), and `journal compact --help` says so."""
    shown = " ".join(_cli(store, "compact", "--help").stdout.split())
    assert "does not compact a session into a snapshot" in shown, shown
    assert "snapshot(compact=True)" in shown and "Journal.compact_session" in shown, shown

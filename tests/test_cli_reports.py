"""What commands say they did, as a user trying the `journal` command read it (SPEC.md
section 13): `verify --fix` with nothing to repair, `compact` that reclaims nothing, `init`,
the page token line of `sessions list`, and the file digest of `import --list`."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import msgspec
import pytest
from _cli_runs import cli_env, run_cli

from cli.maintenance import NOTHING_RECLAIMED, active_frames, nothing_reclaimed
from journal import CompactionReport, EventIn, Journal


@pytest.fixture
def store(tmp_path: Path) -> Path:
    path = tmp_path / "store"
    with Journal.open(path, create=True, segment_bytes=4096, durability="os") as j:
        j.create_session("s")
        for i in range(40):
            j.append("s", [EventIn("m", b"%03d" % i * 40)])
    return path


# -- compact that reclaims nothing -------------------------------------------------------------


@pytest.mark.parametrize("dead", [336, 339, 995, 999, 500, 1])
def test_the_active_segment_s_dead_share_printed_seals_it_as_dead_share(dead: int) -> None:
    """The share `journal compact` prints of the active segment's dead frame bytes, passed
    as --dead-share, seals it (the seal's test: dead >= dead_share * frames): rounded to
    the nearest, 336 dead of 1,000 printed 0.34, and --dead-share 0.34 sealed nothing."""
    report = CompactionReport([], [], 0, 0, 0, 0.0, [], [], 1000, dead)
    shown = re.search(r"of them dead \((\d\.\d\d)\)", active_frames(report))
    assert shown is not None, active_frames(report)
    assert dead >= float(shown.group(1)) * 1000, (dead, shown.group(1))


def test_compact_says_why_it_reclaimed_nothing(store: Path, tmp_path: Path) -> None:
    """Until 2026-12-05 it printed `0 segments rewritten, 0 deleted` and left the user to
    guess why (found by a new-user trial)."""
    young = tmp_path / "young"
    with Journal.open(young, create=True, durability="os") as j:
        j.append("s", [EventIn("m", b"x" * 1000)], create=True)
    assert run_cli(store, "compact").returncode == 0  # (what is worth it, done)
    for path, why, says in [
        (
            young,
            "only_active_segment",
            "there is no sealed segment, only the active one, whose frames hold 1,",
        ),
        (store, "below_dead_share", "no sealed segment is all dead, or at least --dead-share 0.5"),
    ]:
        done = run_cli(path, "--format", "json", "compact")
        assert done.returncode == 0, done.stderr
        (summary,) = [json.loads(line) for line in done.stdout.splitlines()]
        assert summary["segments_rewritten"] == summary["segments_deleted"] == []
        assert summary["nothing_reclaimed"] == why
        done = run_cli(path, "compact")
        compacted, reason = done.stdout.splitlines()
        assert compacted.startswith("compacted: 0 segments rewritten, 0 deleted;"), compacted
        assert reason.startswith(f"nothing reclaimed: {says}"), reason
    with Journal.open(store) as j:
        j.compact_session("s", 30, b"snapshot")
    shutil.copytree(store, tmp_path / "copy")
    done = run_cli(store, "--format", "json", "compact")
    (summary,) = [json.loads(line) for line in done.stdout.splitlines()]
    assert summary["segments_deleted"] or summary["segments_rewritten"]
    assert summary["nothing_reclaimed"] is None
    (compacted,) = run_cli(tmp_path / "copy", "compact").stdout.splitlines()
    assert compacted.startswith("compacted: ") and "0 segments rewritten, 0 del" not in compacted


def test_compact_says_what_its_retention_pass_trimmed_and_evicted(tmp_path: Path) -> None:
    """A local compaction applies retention first: until 2026-12-05 `journal compact` said
    nothing of the events it trimmed (a session with `max_history_bytes` 1000 went from 7
    events to 3 while it printed `0 segments rewritten, 0 deleted ... nothing reclaimed`)
    or of the sessions it evicted (found by a new-user trial)."""
    path = tmp_path / "store"
    with Journal.open(path, create=True, durability="os") as j:
        j.create_session("kept", max_history_bytes=1000)
        for _ in range(7):
            j.append("kept", [EventIn("m", b"k" * 300)])
        j.create_session("gone")
        j.resolve_session("gone")
        j.change_retention_policy(lambda p: msgspec.structs.replace(p, session_retention_ms=1))
    time.sleep(0.01)  # (so that "gone" ended over a millisecond ago)
    done = run_cli(path, "compact")
    assert done.returncode == 0, done.stderr
    retention, compacted, _ = done.stdout.splitlines()
    assert retention == "retention: 1 session evicted, 1 trimmed"
    assert compacted.startswith("compacted: ")
    with Journal.open(path, readonly=True) as j:
        assert [e.ordinal for e in j.replay("kept")] == [5, 6, 7]
    done = run_cli(path, "--format", "json", "compact")  # (nothing left to do)
    (summary,) = [json.loads(line) for line in done.stdout.splitlines()]
    assert summary["trimmed_sessions"] == summary["evicted_sessions"] == []
    assert len(run_cli(path, "compact").stdout.splitlines()) == 2  # (no retention line)


def test_compact_says_when_another_process_reclaimed_the_bytes_meanwhile() -> None:
    """Two `journal compact` at once: the one whose passes found nothing left printed the
    other's drop of the store's sealed bytes as its own line, then `nothing reclaimed: no
    sealed segment is ... dead` (found by a new-user trial)."""
    meanwhile = CompactionReport([], [], 3_020_483, 247_414, 0, 0.5)
    assert nothing_reclaimed(meanwhile) == "reclaimed_meanwhile"
    assert "another process's compaction" in NOTHING_RECLAIMED["reclaimed_meanwhile"]
    assert nothing_reclaimed(CompactionReport([], [], 3_020_483, 3_020_483, 0, 0.5)) == (
        "below_dead_share"
    )
    assert nothing_reclaimed(CompactionReport([], ["1.seg"], 300, 200, 0, 0.5)) is None


# -- verify --fix ------------------------------------------------------------------------------


def test_verify_fix_of_a_sound_store_says_nothing_was_repaired(store: Path) -> None:
    """Until 2026-12-04 its summary said `"fixed": true` when nothing was wrong (the
    library's `fixed` says that --fix rebuilt the view, which it does whenever the log is
    intact)."""
    done = run_cli(store, "--format", "json", "verify", "--fix")
    assert done.returncode == 0, done.stderr
    (summary,) = [json.loads(line) for line in done.stdout.splitlines()]
    assert summary["ok"] is True and summary["problems"] == 0
    assert summary["fixed"] is False
    text = run_cli(store, "verify", "--fix")
    assert text.returncode == 0, text.stderr
    assert text.stdout.endswith("0 problems (--fix: nothing left to repair)\n"), text.stdout
    plain = run_cli(store, "verify")  # (without --fix: nothing said about repairs)
    assert plain.stdout.endswith("0 problems\n"), plain.stdout


def test_verify_fix_that_repairs_says_so(store: Path) -> None:
    active = sorted((store / "segments").glob("*.seg"))[-1]
    with open(active, "r+b") as file:  # committed frames cut off the active segment
        file.truncate(500)
    done = run_cli(store, "--format", "json", "verify", "--fix")
    assert done.returncode == 0, done.stderr
    *problems, summary = [json.loads(line) for line in done.stdout.splitlines()]
    assert len(problems) == 1 and "cut off" in problems[0]["problem"]
    assert summary["fixed"] is True and summary["problems"] == 1


# -- init --------------------------------------------------------------------------------------


def test_init_says_what_it_made_and_what_to_run_next(tmp_path: Path) -> None:
    """Until 2026-12-04 `init` printed the path alone: a new user learnt neither whether a
    store was made nor what to run next. stdout stays the path (`STORE=$(journal init)`)."""
    path = tmp_path / "new store"
    done = run_cli(path, "init")
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"{path}\n"
    with Journal.open(path, readonly=True) as j:
        store_id = j.store_id.hex()
    made, after = done.stderr.splitlines()
    assert made == f"journal: created a new store {store_id} at {path}"
    quoted = f"journal --store '{path}'"  # (the store as the user named it)
    assert after.startswith(f"journal: next: `{quoted} append -s ID --create DATA`"), after
    assert f"`{quoted} sessions list`" in after
    again = run_cli(path, "init")
    assert again.stdout == f"{path}\n"
    assert again.stderr.splitlines()[0] == (
        f"journal: opened the existing store {store_id} at {path}"
    )
    record = json.loads(run_cli(path, "--format", "json", "init").stdout)
    assert record == {"store": str(path), "created": False, "store_id": store_id}
    quiet = run_cli(path, "--format", "quiet", "init")
    assert (quiet.stdout, quiet.stderr) == ("", "")


def test_init_names_no_store_option_the_user_did_not_give(tmp_path: Path) -> None:
    env = {**cli_env(), "JOURNAL_STORE": str(tmp_path / "s")}
    done = subprocess.run(
        [sys.executable, "-m", "cli", "init"], env=env, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    assert "journal: next: `journal append -s ID --create DATA`" in done.stderr, done.stderr


# -- import --list: the file's digest ----------------------------------------------------------


def test_import_list_prints_the_file_sha256_export_printed(store: Path, tmp_path: Path) -> None:
    """Until 2026-12-04 `import --list` printed the content's digest alone, where `export`
    prints the file's too (as sha256sum does): a user could not compare what they
    exported with what they were about to import. It is taken as the one pass reads the
    archive: from a pipe and a FIFO too (read once; the export's digest once hung
    opening a FIFO to read it back)."""
    archive = tmp_path / "s.archive"
    exported = run_cli(store, "--format", "json", "export", "--all", "-o", str(archive))
    assert exported.returncode == 0, exported.stderr
    file_sha256 = json.loads(exported.stdout)["file_sha256"]
    assert file_sha256 == hashlib.sha256(archive.read_bytes()).hexdigest()

    text = run_cli(store, "import", "--list", str(archive))
    assert text.returncode == 0, text.stderr
    header = text.stdout.splitlines()[0]
    assert f"(file sha256 {file_sha256}, as sha256sum prints it; " in header, header
    listed = run_cli(store, "--format", "json", "import", "--list", str(archive))
    assert json.loads(listed.stdout.splitlines()[0])["file_sha256"] == file_sha256

    piped = subprocess.run(
        [sys.executable, "-m", "cli", "--format", "json", "import", "--list", "-"],
        input=archive.read_bytes(),
        capture_output=True,
        env=cli_env(),
        timeout=60,
        check=False,
    )
    assert piped.returncode == 0, piped.stderr
    assert json.loads(piped.stdout.splitlines()[0])["file_sha256"] == file_sha256

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    reader = subprocess.Popen(
        [sys.executable, "-m", "cli", "--format", "json", "import", "--list", str(fifo)],
        stdout=subprocess.PIPE,
        env=cli_env(),
    )
    try:
        with open(fifo, "wb") as writer:
            writer.write(archive.read_bytes())
        out, _ = reader.communicate(timeout=30)
    finally:
        reader.kill()
        reader.wait(10)
    assert reader.returncode == 0
    assert json.loads(out.splitlines()[0])["file_sha256"] == file_sha256


# -- sessions list: the page token line --------------------------------------------------------


def test_sessions_list_page_token_is_a_line_a_script_tells_from_sessions(tmp_path: Path) -> None:
    """A page in JSON ends with `{"next_page_token": T}`, among the session objects; a
    user reading the NDJSON could not tell from `--help` how to tell it apart (until
    2026-12-04 the help said "(and the token of the next page)"). It stays that line
    (scripts take it with `tail -n 1`), an object whose only key is next_page_token."""
    path = tmp_path / "store"
    with Journal.open(path, create=True) as j:
        for session_id in ("a", "b", "c"):
            j.create_session(session_id)
    listed: list[str] = []
    token = ""
    while True:
        done = run_cli(
            path, "--format", "json", "sessions", "list", "--page-size", "2", "--page-token", token
        )
        assert done.returncode == 0, done.stderr
        *sessions, last = [json.loads(line) for line in done.stdout.splitlines()]
        assert all("session_id" in record for record in sessions), sessions
        assert set(last) == {"next_page_token"}, last
        listed += [record["session_id"] for record in sessions]
        token = last["next_page_token"]
        if not token:
            break
    assert listed == ["a", "b", "c"]
    shown = " ".join(run_cli(path, "sessions", "list", "--help").stdout.split())
    assert "a last object whose only key is next_page_token" in shown, shown

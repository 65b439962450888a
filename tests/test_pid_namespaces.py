"""Processes of one machine in different pid namespaces (containers sharing a store and
a host name): a live process of one namespace must not be judged dead from another,
where its pid names nobody (SPEC 7.8, `PROCESS_BOOT`). Each test runs its second
process under `unshare --pid --fork --mount-proc` (in a user namespace as well where
it is not root); it skips where such a namespace cannot be made."""

from __future__ import annotations

import hashlib
import io
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from journal import EventIn, Journal
from journal._local.leases import BOOT_ID, PROCESS_BOOT

ROOT = Path(__file__).resolve().parent.parent
_UNSHARE = ["unshare", "--user", "--map-root-user", "--pid", "--fork", "--mount-proc"]
_ENV = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}


def _in_another_pid_namespace(script: str, *args: str) -> str:
    """Run `script` with `args` in a new pid namespace (and /proc of it); its stdout."""
    command = [sys.executable, "-c", textwrap.dedent(script), *args]
    try:
        done = subprocess.run(
            [*_UNSHARE, *command],
            capture_output=True,
            text=True,
            timeout=120,
            env=_ENV,
        )
    except FileNotFoundError:
        pytest.skip("no unshare(1)")
    if done.returncode != 0 and "unshare:" in done.stderr:
        pytest.skip(f"cannot make a pid namespace here: {done.stderr.strip()}")
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


_OPEN_WRITABLE = """
    import sys
    from journal import Journal

    with Journal.open(sys.argv[1]) as j:
        print(len(list(j.list_sessions())))
"""


def test_a_live_import_is_not_rolled_back_by_a_writer_of_another_pid_namespace(
    tmp_path: Path,
) -> None:
    """A writer's open rolls back staged imports whose importer is gone (SPEC 12.3). It
    judged the importer by pid, start time, host name and boot id: from another pid
    namespace of the same machine (same boot id and host name) the live importer's pid
    names nobody, so the open rolled the import back and the importer's commit failed
    ("SessionNotFound: no import in progress", seen by a review with `unshare`)."""
    with Journal.open(tmp_path / "source", create=True) as source:
        source.append("s", [EventIn("message", b"x" * 1000) for _ in range(50)], create=True)
        archive = io.BytesIO()
        source.export_sessions(["s"], archive)
    opened: list[str] = []
    with Journal.open(tmp_path / "target", create=True) as target:

        def progress(done: int, total: int) -> None:
            # The calls: the check pass (total unknown: 0), then one after each staging
            # commit and one at the commit.
            if total and done > total // 2 and not opened:  # staged, not committed yet
                opened.append(_in_another_pid_namespace(_OPEN_WRITABLE, str(tmp_path / "target")))

        archive.seek(0)
        report = target.import_sessions(archive, progress=progress)
        assert opened == ["0\n"]  # the other writer opened (and saw nothing staged)
        assert [e.ordinal for e in target.replay("s")] == list(range(1, 51))
        assert report.events == 50


def test_a_live_owner_is_busy_for_an_own_in_another_pid_namespace(tmp_path: Path) -> None:
    """The owner's lease lock, not its pid, tells another pid namespace it is alive (so
    this passed before the fix of the test above too: it pins the lock's part)."""
    with Journal.open(tmp_path / "store", create=True) as j:
        j.create_session("s")
        with j.own("s"):
            out = _in_another_pid_namespace(
                """
                import sys
                from journal import Journal, OwnerBusy

                with Journal.open(sys.argv[1]) as j:
                    try:
                        with j.own("s", wait_s=0):
                            print("owned")
                    except OwnerBusy:
                        print("busy")
                """,
                str(tmp_path / "store"),
            )
            assert out == "busy\n"
        assert j.get_session("s").owner is None


def test_an_owner_with_the_same_pid_in_another_pid_namespace_is_not_this_process(
    tmp_path: Path,
) -> None:
    """JetStream: two containers of one machine whose programs are both pid 1 (as a
    container's main process usually is), sharing a host name. The `own()` in the second
    found the session held by pid 1 on its own host name and said "owned by this process
    already" (the pid and host alone named it: SPEC 7.8 names the pid namespace too), so
    the advice was to release an Owner this process never had."""
    pytest.importorskip("nats")
    from _nats import shared_server

    store = "t" + hashlib.sha256(str(tmp_path).encode()).hexdigest()[:24]
    url = shared_server().url
    with Journal.open(url, store=store, create=True) as j:
        j.create_session("s")
    holding = """
        import os, sys
        from journal import Journal

        with Journal.open(sys.argv[1], store=sys.argv[2]) as j:
            with j.own("s"):
                print(os.getpid(), flush=True)
                sys.stdin.readline()
    """
    holder = subprocess.Popen(
        [*_UNSHARE, sys.executable, "-c", textwrap.dedent(holding), url, store],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_ENV,
    )
    try:
        assert holder.stdout is not None and holder.stderr is not None
        line = holder.stdout.readline()
        if not line and "unshare:" in (error := holder.stderr.read()):
            pytest.skip(f"cannot make a pid namespace here: {error.strip()}")
        assert line == "1\n", holder.stderr.read()[-2000:]  # (its main process: pid 1)
        out = _in_another_pid_namespace(
            """
            import os, sys
            from journal import Journal, OwnerBusy

            with Journal.open(sys.argv[1], store=sys.argv[2]) as j:
                try:
                    with j.own("s", wait_s=0):
                        print("owned")
                except OwnerBusy as e:
                    print(os.getpid(), e.pid, "this process" in str(e))
            """,
            url,
            store,
        )
        assert out == "1 1 False\n"
    finally:
        if holder.stdin is not None:
            holder.stdin.close()
        holder.wait(60)


def test_records_of_the_initial_pid_namespace_name_the_boot_id_alone() -> None:
    """Releases before 2026-12-03 recorded the boot id alone and judge a record by pid
    only when its boot id equals theirs, whole. Had this release named the initial pid
    namespace too, every such release on the host judged its owners and importers dead:
    an older `journal watch` of a live owner's open turn raised OutcomeUnknown ("the
    owner ... ended without settling turn"), and an older writer's open rolled back a
    live import (both seen with the release of 952424e beside this one). So the host's
    own processes record the boot id alone; other namespaces add theirs (SPEC 7.8)."""
    namespace = os.readlink("/proc/self/ns/pid")
    boot = BOOT_ID.decode()
    # (The initial namespace is the kernel's PROC_PID_INIT_INO.)
    expected = boot if namespace == "pid:[4026531836]" else f"{boot}/{namespace}"
    assert expected == PROCESS_BOOT
    # In a new pid namespace (a container), the namespace is named.
    out = _in_another_pid_namespace(
        """
        import os
        from journal._local.leases import PROCESS_BOOT

        print(PROCESS_BOOT == PROCESS_BOOT.split("/")[0] + "/" + os.readlink("/proc/self/ns/pid"))
        """
    )
    assert out == "True\n"


def test_a_record_naming_no_namespace_is_the_initial_ones_for_another_namespace() -> None:
    """A record of the boot id alone (the host's processes, and every process of releases
    before 2026-12-03) names a pid of the initial namespace: from a container its pid
    names nobody, or somebody else, so it is judged as another namespace's (there by
    the lock; an importer's staged rows, which have none, count as alive). It was judged
    by its pid, so a writer opened in a container rolled back the live import of a host
    process of an older release."""
    host = socket.gethostname()
    out = _in_another_pid_namespace(
        """
        import sys
        from journal._local.leases import PROCESS_BOOT, owner_alive
        from journal.sessions import SessionRow

        row = SessionRow(
            "s", 1, 0, "m", None, {}, {}, 0, None, 1, 0, None, 0, None, 1,
            owner_pid=int(sys.argv[1]), owner_host=sys.argv[2], owner_boot_id=sys.argv[3],
        )
        print(owner_alive(row, sys.argv[2], PROCESS_BOOT))
        """,
        str(os.getpid()),  # (a live process here, a pid nobody has there)
        host,
        BOOT_ID.decode(),
    )
    assert out == "None\n"

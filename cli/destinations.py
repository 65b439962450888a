"""Where `journal export -o FILE` may write: a place this user may not write, or on a
read-only file system, is told before the store is opened (SPEC 6 and 13)."""

from __future__ import annotations

import os
import stat

from .output import CommandFailed

__all__ = ["check_writable"]


def check_writable(dest: str) -> None:
    """Raise OS_ERROR (UNAVAILABLE, exit 9) when the export cannot write `dest` because
    of where it is: a directory this user may not write, or a read-only file system.
    A path that names no directory (a file on the way, a directory that does not exist)
    is left to the export, which refuses it as the path given wrong (exit 4)."""
    path = os.path.realpath(dest)
    try:
        written_through = not stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        written_through = False  # (none yet, or not to be reached: the export says which)
    # A FIFO or a device is written through; a file is made beside its name and renamed.
    place = path if written_through else os.path.dirname(path)
    try:
        kind = os.stat(place).st_mode
    except PermissionError:  # (a directory on the way this user may not search)
        pass
    except OSError:
        return
    else:
        if not written_through and not stat.S_ISDIR(kind):
            return  # (a file where its directory should be: the path given wrong)
        if os.access(place, os.W_OK if written_through else os.W_OK | os.X_OK):
            return
    elsewhere = "export to a directory it may write, or to stdout (-o -)"
    try:
        read_only = bool(os.statvfs(place).f_flag & os.ST_RDONLY)
    except OSError:
        read_only = False
    if read_only:
        why = f"{place!r} is on a read-only file system"
    elif written_through:
        why = f"this user may not write {place!r}"
    else:
        why = f"this user may not write files in {place!r}"
    raise CommandFailed(f"cannot write {dest!r}: {why}: {elsewhere}", "OS_ERROR", "UNAVAILABLE")

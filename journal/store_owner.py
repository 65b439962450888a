"""Who may write a store on disk: a store private to its user (no group write bit in its
file mode, which `store.json` is always written with) is written by that user alone, so
that nothing in it becomes a file its user cannot open (SPEC 7.9). Shared by the local
engine's writable open and the CLI's `cursor-key`, which edits the key file without
opening the store; so is the check that the store's creation finished (`refuse_unfinished`,
SPEC 7)."""

from __future__ import annotations

import errno
import os
import pwd
import stat

from .errors import StoreNotFound, StoreUnavailable

__all__ = ["no_store_at", "refuse_another_users_private_store", "refuse_unfinished"]


def refuse_another_users_private_store(path: str) -> None:
    """`StoreUnavailable` (EPERM) when this process would write to the store at `path`
    while it is private to another user (root too): the files it creates (a compacted
    segment, the key ring, `store.json`) would be its own, and the store's user could not
    open the store again (until 2026-12-05 `journal retention`, `cursor-key --rotate` or
    `compact` run as root locked the service's user out: found by an operator trial). A
    group-shared store takes writers of the group; a process that may not write the store
    at all is left to the refusal of its writes (EACCES)."""
    found = os.stat(os.path.join(path, "store.json"))
    euid = os.geteuid()
    if euid == found.st_uid or found.st_mode & stat.S_IWGRP:
        return
    effective = os.access in os.supports_effective_ids
    if not os.access(os.path.join(path, "segments"), os.W_OK, effective_ids=effective):
        return
    owner = found.st_uid
    raise StoreUnavailable(
        f"the store at {path!r} is private to {_user(owner)} (file mode "
        f"{stat.S_IMODE(found.st_mode):04o}), and this process runs as {_user(euid)}: "
        f"files it created there would be {_user(euid)}'s, and {_user(owner)} could not "
        f"open the store again. Run this as {_user(owner)} (`sudo -u "
        f"{_user(owner, bare=True)} journal ...`), or open the store read-only; for "
        "several users to write, share it with a group (SPEC 7.9); nothing was changed",
        errno=errno.EPERM,
    )


def _user(uid: int, *, bare: bool = False) -> str:
    try:
        name = pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"#{uid}" if bare else f"uid {uid}"
    return name if bare else f"user {name!r} (uid {uid})"


def refuse_unfinished(path: str) -> None:
    """`StoreNotFound` when the creation of the store at `path` did not finish, as every
    open finds it (for `journal cursor-key`, which does not open the store)."""
    from ._local.store_file import refuse_unfinished as check  # (it imports this module)

    check(path)


def no_store_at(path: str) -> StoreNotFound:
    """What a writable open without `create` of `path`, which holds no `store.json`,
    raises: the advice fits the place (a directory inside a store, or of other files, is
    not told to create a store there), for `journal cursor-key`."""
    from ._local.store_file import no_store_at as found  # (it imports this module)

    return found(path, readonly=False)

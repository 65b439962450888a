"""The JetStream engine: a journal stored in a NATS JetStream stream (private package; the
public API is `journal.Journal`, opened with a `nats://` URL). Needs the optional
`jetstream` extra (nats-py)."""

from __future__ import annotations

from ..errors import InvalidArgument
from ..models import RetentionPolicy
from ..remote import server_list, without_password
from .engine import JetStreamEngine, JetStreamOptions
from .layout import check_store_name

__all__ = ["JetStreamEngine", "JetStreamOptions", "open_jetstream", "parse_url"]


def parse_url(url: str) -> tuple[list[str], str | None]:
    """The servers of `nats://host:port,host2:port[/store]` and the store it names (each
    server may carry the scheme: `nats://host:port,nats://host2:port`)."""
    rest = server_list(url[len("nats://") :])
    rest, _, store = rest.partition("/")
    servers = [f"nats://{server.strip()}" for server in rest.split(",") if server.strip()]
    if not servers:
        raise InvalidArgument(
            f"{without_password(url)!r} names no server: use nats://host:4222[,host2:4222][/store]"
        )
    # (one trailing slash, as a URL copied from a browser or a shell's completion has)
    return servers, store.removesuffix("/") or None


def open_jetstream(
    url: str,
    store: str | None,
    replicas: int | None,
    create: bool,
    readonly: bool,
    retention: RetentionPolicy | None,
    key_ring: object,
) -> JetStreamEngine:
    """Open (or create) the store named `store` on the NATS servers of `url`."""
    servers, named = parse_url(url)
    if store is not None and named is not None and store != named:
        raise InvalidArgument(
            f"the URL names store {named!r} and store= names {store!r}: name it once"
        )
    name = check_store_name(store if store is not None else named)
    if replicas is not None and (type(replicas) is not int or not 1 <= replicas <= 5):
        raise InvalidArgument(f"replicas must be None or an int from 1 to 5, got {replicas!r}")
    options = JetStreamOptions(
        servers=servers,
        store=name,
        replicas=replicas,
        create=create,
        readonly=readonly,
        retention=retention,
        key_ring=key_ring,  # type: ignore[arg-type]  # checked by check_open_options
    )
    return JetStreamEngine.open(options)

"""An import's atomic batches on the JetStream engine (SPEC 16.5): one sent, its lost
answer settled, asked again while the servers do not answer, for up to `WRITE_S`."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import Final

from nats.errors import MaxPayloadError

from ..errors import InvalidArgument, StoreUnavailable, WriteOutcomeUnknown
from .client import ApiError, BatchMessage, Connection, Unavailable

__all__ = ["WRITE_S", "WRONG_LAST_SEQUENCE", "send_batch"]

WRITE_S: Final = 30.0
WRONG_LAST_SEQUENCE: Final = 10071
_IN_PROCESS: Final = 10164
_TOO_LARGE: Final = frozenset({10054, 10199})


async def send_batch(
    conn: Connection,
    messages: list[BatchMessage],
    landed: Callable[[], Awaitable[int | None]],
    session_id: str,
    committing: bool = False,
) -> int:
    """Publish one atomic batch; the sequence of its last message. A refused
    compare-and-set or a lost reply is settled by `landed()`: the sequence when the
    batch is stored, None when it is not (it is sent again), `SessionExists` when
    another writer took the row."""
    deadline = time.monotonic() + WRITE_S
    busy = 0
    uncertain = False  # (a batch may have been stored without its answer)
    while True:
        settle = False
        try:
            return await conn.publish_batch(messages)
        except ApiError as e:
            if e.err_code in _TOO_LARGE:
                raise InvalidArgument(
                    f"JetStream refused the import's write of session {session_id!r}: "
                    f"{e.description}: raise max_payload and the stream's max_msg_size, "
                    "or import into a local store"
                ) from None
            if e.err_code == WRONG_LAST_SEQUENCE or e.transient:
                settle = True
            elif e.err_code != _IN_PROCESS:
                raise StoreUnavailable(
                    f"JetStream refused the import's write of session {session_id!r}: "
                    f"{e.description} (error {e.err_code}); nothing was imported"
                ) from None
        except MaxPayloadError:
            raise InvalidArgument(
                f"a message of the import of session {session_id!r} is larger than the "
                "NATS server's max_payload: raise it (SPEC 16.1)"
            ) from None
        except Unavailable:
            settle = True
        if settle:
            uncertain = True
            with contextlib.suppress(ApiError, *Unavailable):
                seq = await landed()
                if seq is not None:
                    return seq
        if time.monotonic() > deadline:
            if committing and uncertain:  # (its batch may yet land: all, or none)
                raise WriteOutcomeUnknown(
                    f"no answer from JetStream for {WRITE_S:g} s committing the import "
                    f"(of {session_id!r} and the others): it is not known to have "
                    "committed; check the servers, then look whether its sessions are "
                    "there (get_session, `journal sessions list`) before importing again"
                )
            raise StoreUnavailable(
                f"no answer from JetStream for {WRITE_S:g} s importing session "
                f"{session_id!r}: nothing was imported (what was staged is rolled back, "
                "or by the next retention pass once this process is gone); check the "
                "servers and retry"
            )
        await asyncio.sleep(min(0.002 * 2**busy, 0.1))
        busy += 1

"""A turn's block run in a thread of its own, for the tests of what other threads do
while it runs (a release, a close)."""

from __future__ import annotations

import threading

from journal import EventIn, Owner

TURN_WAIT_S = 30.0  # a bound for liveness only


class TurnBlock:
    """A turn's block in a thread of its own: it appends, says it has begun (`entered`),
    waits for `go`, then appends again; what it raised is kept in `raised`."""

    def __init__(self, owner: Owner, request_id: str = "r1") -> None:
        self.entered, self.go = threading.Event(), threading.Event()
        self.raised: list[BaseException] = []
        self._owner, self._request_id = owner, request_id
        self.thread = threading.Thread(target=self._run)
        self.thread.start()
        assert self.entered.wait(TURN_WAIT_S)

    def _run(self) -> None:
        try:
            with self._owner.turn(self._request_id) as turn:
                turn.append([EventIn("message", b'{"n": 1}')])
                self.entered.set()
                self.go.wait()
                turn.append([EventIn("message", b'{"n": 2}')])
        except BaseException as error:  # (kept for the assertions)
            self.raised.append(error)

    def finish(self) -> None:
        self.go.set()
        self.thread.join(TURN_WAIT_S)
        assert not self.thread.is_alive()

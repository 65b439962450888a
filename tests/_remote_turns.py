"""Child processes for the tests of owners on another host (JetStream): an owner in the
middle of a turn, and a watcher of its session that says whether it was told
`OutcomeUnknown`. Each is run as `python -c CODE URL STORE [SECONDS]`."""

from __future__ import annotations

# Owns session "s" of the store as a process of another host, appends in a turn it
# never ends, prints "mid-turn" and sleeps.
OWNER_MID_TURN = """
import socket, sys, time
socket.gethostname = lambda: "another-host"  # the owner runs on another machine
from journal import EventIn, Journal
j = Journal.open(sys.argv[1], store=sys.argv[2])
turn = j.own("s").turn("r-remote").__enter__()
turn.append([EventIn("message", b'{"working": true}')])
print("mid-turn", flush=True)
time.sleep(600)
"""

# Watches session "s": prints "watching" at its first message, stops SECONDS later and
# prints "no outcome told", or the `OutcomeUnknown` it was told.
WATCHER_OF_THE_TURN = """
import sys, threading
from journal import Journal, OutcomeUnknown
stop = threading.Event()
with Journal.open(sys.argv[1], store=sys.argv[2]) as j:
    try:
        for event in j.watch("s", stop=stop):
            if event.type == "message":
                print("watching", flush=True)
                threading.Timer(float(sys.argv[3]), stop.set).start()
        print("no outcome told", flush=True)
    except OutcomeUnknown as e:
        print(f"OutcomeUnknown: {e}", flush=True)
"""

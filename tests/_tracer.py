"""The interrupt tracer of the Ctrl+C sweeps (`TRACER`: Python source a sweeping script
starts with), and how a sweep's script is run (`run_sweep`)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run_sweep(
    script: str, args: list[str], timeout: float, env: dict[str, str] | None = None
) -> tuple[list[str], list[list[str]]]:
    """Run `script` with `args` in a process of its own (with `env` added to the
    environment): its output lines, and the check points it reports ("AT ..." lines,
    split), once it ran to its "END"."""
    run = subprocess.run(
        [sys.executable, "-c", script, *args],
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    lines = run.stdout.splitlines()
    assert run.returncode == 0 and lines and lines[-1] == "END", (
        run.stdout[-3000:],
        run.stderr[-3000:],
    )
    return lines, [line.split() for line in lines if line.startswith("AT ")]


# Raises SIGINT at the main thread's `state["at"]`-th check point once traced: where
# CPython 3.11-3.13 runs a signal handler in a function's code, at its start (or a
# generator's resumption after a plain `yield`), after a call returned, and after a jump
# back was taken. An "opcode" event comes before each instruction but none for the
# RESUME at a function's start: the first one after a frame's "call" event stands for
# it. (Until 2026-12-07 function starts were never reached, and an instruction that
# follows a jump back in the code counted, when only a loop's exit reaches it, not the
# jump: the loop's head, where the jump lands, did not; nor, on 3.11, the conditional
# jumps back.) A call is CALL, CALL_FUNCTION_EX, or on 3.13 CALL_KW (a call with keyword
# arguments, checked after it returns as well); a RESUME's argument on 3.13 carries a bit
# (4) besides where it resumes (its low two bits). Counted as other calls and by the
# argument itself, 3.13 missed the check points after each call with keywords and at a
# generator's resumption after its first `yield`: 50 of the 1,514 the waiter sweeps cover.
TRACER = r"""
import dis, os, signal, sys

CALLS = {"CALL", "CALL_KW", "CALL_FUNCTION_EX"}
BACK = {"JUMP_BACKWARD", "POP_JUMP_BACKWARD_IF_TRUE", "POP_JUMP_BACKWARD_IF_FALSE",
        "POP_JUMP_BACKWARD_IF_NONE", "POP_JUMP_BACKWARD_IF_NOT_NONE"}
codes = {}  # code: (its instructions' names by offset, the next one's offsets, starts)
last = {}  # id(frame): the offset of the instruction traced last in it

def shape(code):
    known = codes.get(code)
    if known is None:
        names, following, starts = {}, {}, set()
        before = None
        for ins in dis.get_instructions(code):
            names[ins.offset] = ins.opname
            if before is not None:
                following[before.offset] = ins.offset
                if before.opname == "RESUME" and before.arg & 3 < 2:
                    starts.add(ins.offset)
            before = ins
        known = codes[code] = (names, following, starts)
    return known

def checked(frame):
    names, following, starts = shape(frame.f_code)
    here = frame.f_lasti
    before = last.get(id(frame))
    last[id(frame)] = here
    if before is None:
        return here in starts
    name = names.get(before)
    if name in CALLS:
        return following.get(before) == here
    return name in BACK and here < before

state = {"n": 0, "at": 0, "fired": None}

def local(frame, event, arg):
    if state["fired"] is not None:
        return None
    if event == "opcode" and checked(frame):
        state["n"] += 1
        if state["n"] == state["at"]:
            state["fired"] = f"{frame.f_code.co_name}:{frame.f_lineno}"
            signal.raise_signal(signal.SIGINT)
    elif event == "return":
        last.pop(id(frame), None)
    return local

def tracer(frame, event, arg):
    if state["fired"] is not None:
        return None
    last.pop(id(frame), None)  # (a "call" event: the frame starts or resumes)
    # (f_trace before f_trace_opcodes: Python 3.13 sends no opcode events to a frame of
    # code traced the first time otherwise.)
    frame.f_trace = local
    frame.f_trace_opcodes = True
    return local

# (Python 3.12 sends opcode events only once some frame set f_trace_opcodes before the
# sys.settrace: CPython gh-114480.)
sys._getframe().f_trace_opcodes = True

def traced_next(stream, at):
    # next(stream) with a SIGINT at its `at`-th check point (the KeyboardInterrupt caught).
    state.update(n=0, at=at, fired=None)
    sys.settrace(tracer)
    try:
        next(stream, None)
    except KeyboardInterrupt:
        pass
    finally:
        sys.settrace(None)

def each_point(watch, say):
    # watch(at) at every check point a run without SIGINT counted: "AT at fired say(...)
    # fds=N" (N: the descriptors the process has open after it).
    points_seen, *_ = watch(10**9)
    print(f"POINTS {points_seen}", flush=True)
    for at in range(1, points_seen + 1):
        _, fired, *rest = watch(at)
        if fired is None:
            break
        print(f"AT {at} {fired} {say(*rest)} fds={len(os.listdir('/proc/self/fd'))}", flush=True)
"""

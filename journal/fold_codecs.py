"""How a fold's state is stored in its snapshots and checkpoints: the `Codec` protocol
and the default, `JsonCodec`, which refuses a state JSON would give back as something
else, naming where it is (SPEC section 7.11)."""

from __future__ import annotations

from typing import Any, Generic, Protocol, TypeVar

import msgspec

__all__ = ["Codec", "JsonCodec", "same_json"]

StateT = TypeVar("StateT")


class Codec(Protocol[StateT]):
    """How a fold's state is stored in snapshots and checkpoints."""

    def encode(self, state: StateT) -> bytes: ...

    def decode(self, data: bytes) -> StateT: ...


class JsonCodec(Generic[StateT]):
    """JSON via msgspec (the default codec): `type` is what `decode` returns (any type
    msgspec can decode JSON into: `dict[str, Any]`, a `msgspec.Struct`, ...)."""

    def __init__(self, type: Any = Any) -> None:
        self._encoder = msgspec.json.Encoder()
        self._decoder: msgspec.json.Decoder[Any] = msgspec.json.Decoder(type)

    def encode(self, state: StateT) -> bytes:
        """The state as JSON; `ValueError` when it would come back as something else
        (JSON writes NaN and infinities as null, bytes as base64 text, keys as strings):
        a fold restored from that checkpoint would not equal the fold of its events."""
        data = self._encoder.encode(state)
        difference: str | None = None
        try:
            stored = self._decoder.decode(data)
        except msgspec.ValidationError as error:
            # (The codec's type does not take what JSON gives back, a NaN's null for a
            # float field: msgspec names where, dict keys as [...].)
            same = False
            difference = f"which its type does not read back ({error})"
        else:
            difference = _json_difference(stored, state, "", tuples_as_lists=False)
            same = difference is None
            kind = type(state).__name__
            if not same and type(stored) is not type(state) and _stores(data, type(state), state):
                # (A msgspec Struct or a dataclass with `JsonCodec()`, which reads an
                # object back as a dict.)
                raise ValueError(
                    f"this codec reads the {kind} back as a {type(stored).__name__}: pass "
                    f"codec=JsonCodec({kind}) to fold()"
                )
        if not same:
            raise ValueError(
                "it holds a value JSON stores as something else"
                f"{'' if difference is None else ', ' + difference}: JSON has no NaN or "
                "infinity, bytes or set, its keys are strings, and a tuple comes back a "
                "list (use lists, or codec=JsonCodec(<the state's type>)); with a typed "
                "codec, a value its type does not take"
            )
        return data

    def decode(self, data: bytes) -> StateT:
        state: StateT = self._decoder.decode(data)
        return state


def _stores(data: bytes, kind: type[Any], state: Any) -> bool:
    """Whether `JsonCodec(kind)` reads `data`, the JSON of `state`, back as `state`: only
    then does an error advise it (a dict subclass or a Struct holding NaN comes back
    otherwise whatever the codec's type)."""
    try:
        return bool(msgspec.json.decode(data, type=kind) == state)
    except (msgspec.MsgspecError, TypeError, ValueError):  # (TypeError: no such codec)
        return False


def same_json(stored: Any, given: Any, *, tuples_as_lists: bool = True) -> bool:
    """Whether JSON read back (`stored`) says what `given` did (`_json_difference`)."""
    return _json_difference(stored, given, "", tuples_as_lists=tuples_as_lists) is None


def _json_difference(
    stored: Any, given: Any, where: str, *, tuples_as_lists: bool = True
) -> str | None:
    """Where JSON read back (`stored`) does not say what `given` did, named for an error
    (`at ["tasks"][2]: a set`), or None: equal (NaN is not equal to the null it becomes,
    nor bytes to their base64 text). With `tuples_as_lists`, a tuple counts as the list
    it is written as (`set()`: the state is the JSON read back from the start); without,
    a tuple must come back a tuple (a checkpoint: the restored state must equal the one
    its reducer built, which a tuple read back as a list does not, and the reducer may
    not take it)."""
    if isinstance(given, (list, tuple)):
        # (a list subclass comes back a list, as a dict subclass comes back a dict: taken,
        # as before tuples were refused)
        kind = list if tuples_as_lists or isinstance(given, list) else type(given)
        if not isinstance(stored, kind) or len(stored) != len(given):
            return _named(where, given)
        for i, (s, g) in enumerate(zip(stored, given, strict=True)):
            found = _json_difference(s, g, f"{where}[{i}]", tuples_as_lists=tuples_as_lists)
            if found is not None:
                return found
        return None
    if isinstance(given, dict):
        if not isinstance(stored, dict):
            return _named(where, given)
        for key in given:
            if key not in stored:
                return f"at {where or 'the top'}: the key {key!r} ({type(key).__name__})"
            found = _json_difference(
                stored[key], given[key], f"{where}[{key!r}]", tuples_as_lists=tuples_as_lists
            )
            if found is not None:
                return found
        return None if stored.keys() == given.keys() else _named(where, given)
    return None if stored == given else _named(where, given)


def _named(where: str, value: Any) -> str:
    shown = repr(value)
    if len(shown) > 60:
        shown = shown[:57] + "..."
    return f"at {where or 'the top'}: {shown} ({type(value).__name__})"

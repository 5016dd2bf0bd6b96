"""``fast_init``: a quicker ``__init__`` for the frozen, slotted dataclasses built for every message.

A frozen dataclass's generated ``__init__`` sets each field with ``object.__setattr__(self, name, value)``: a
global lookup, an attribute lookup, a call with argument unpacking and a type-dict lookup per field. About ten
such values are built per message on the hub's hot path (``Publish``, ``MessageReceived``, ``StoredItem``,
``Delivery``, ...), 0.9-1.5 µs each. ``fast_init`` replaces the generated ``__init__`` with one that calls each
slot's own member descriptor (the same C setter ``object.__setattr__`` ends in), which takes about 40 % less.

Invariants: the class stays exactly what ``@dataclass(frozen=True, slots=True)`` made it (equality, hash, repr,
``FrozenInstanceError`` on assignment, ``dataclasses.replace``); the new ``__init__`` has the same parameters,
defaults, default factories, keyword-only fields and ``__post_init__`` call as the generated one. Classes it
cannot reproduce (not frozen, not slotted, ``InitVar`` fields) are refused with ``TypeError`` at import.
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

__all__ = ["fast_init"]

T = TypeVar("T")

_FACTORY = object()  # the default of a field with a default factory: "call the factory"


def fast_init(cls: type[T]) -> type[T]:
    """Give the frozen, slotted dataclass ``cls`` a faster ``__init__`` (see the module docstring)."""
    params = getattr(cls, "__dataclass_params__", None)
    if params is None or not params.frozen or "__slots__" not in cls.__dict__:
        raise TypeError(f"{cls.__name__}: fast_init is for @dataclass(frozen=True, slots=True) classes")
    all_fields: dict[str, Any] = cls.__dict__["__dataclass_fields__"]
    if any(f._field_type is dataclasses._FIELD_INITVAR for f in all_fields.values()):  # type: ignore[attr-defined]
        raise TypeError(f"{cls.__name__}: fast_init does not handle InitVar fields")
    names: dict[str, Any] = {"_FACTORY": _FACTORY}
    positional: list[str] = []
    keyword: list[str] = []
    body: list[str] = []
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        names[f"_set_{f.name}"] = cls.__dict__[f.name].__set__  # the slot's member descriptor
        has_factory = f.default_factory is not dataclasses.MISSING
        if f.init:
            param = f.name
            if has_factory:
                names[f"_factory_{f.name}"] = f.default_factory
                param += "=_FACTORY"
                body.append(f" if {f.name} is _FACTORY: {f.name} = _factory_{f.name}()")
            elif f.default is not dataclasses.MISSING:
                names[f"_default_{f.name}"] = f.default
                param += f"=_default_{f.name}"
            (keyword if f.kw_only else positional).append(param)
            body.append(f" _set_{f.name}(self, {f.name})")
        elif has_factory:  # not a parameter, but set all the same, as the generated __init__ does
            names[f"_factory_{f.name}"] = f.default_factory
            body.append(f" _set_{f.name}(self, _factory_{f.name}())")
        elif f.default is not dataclasses.MISSING:
            names[f"_default_{f.name}"] = f.default
            body.append(f" _set_{f.name}(self, _default_{f.name})")
    if hasattr(cls, "__post_init__"):
        body.append(" self.__post_init__()")
    signature = ", ".join(["self", *positional, *(["*", *keyword] if keyword else [])])
    source = f"def __init__({signature}):\n" + ("\n".join(body) if body else " pass") + "\n"
    exec(source, names)
    init = names["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__module__ = cls.__module__
    init.__doc__ = cls.__init__.__doc__
    cls.__init__ = init  # type: ignore[method-assign]
    return cls

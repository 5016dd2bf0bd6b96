"""``fast_init``: the replaced ``__init__`` behaves as the generated one, and refuses what it cannot copy."""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass, field
from typing import Any

import pytest

from edgehub.core.values import fast_init


def _define() -> type[Any]:
    """The same class each call, fresh: one copy keeps the generated __init__, the other gets fast_init."""

    @dataclass(frozen=True, slots=True)
    class Value:
        a: int
        b: dict[str, int] = field(default_factory=dict)
        c: str = "x"
        d: int = field(default=3, kw_only=True)
        e: str = field(init=False, default="z")
        f: list[int] = field(init=False, default_factory=list)

        def __post_init__(self) -> None:
            object.__setattr__(self, "c", self.c.upper())

    return Value


Plain = _define()
Fast = fast_init(_define())


def _fields(obj: object) -> dict[str, object]:
    return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [((1,), {}), ((1, {"k": 2}, "y"), {"d": 4}), ((), {"a": 5, "c": "q", "d": 0})],
)
def test_the_fields_come_out_as_the_generated_init_sets_them(
    args: tuple[object, ...], kwargs: dict[str, object]
) -> None:
    assert _fields(Fast(*args, **kwargs)) == _fields(Plain(*args, **kwargs))


def test_the_signature_is_the_generated_ones() -> None:
    fast, plain = inspect.signature(Fast.__init__).parameters, inspect.signature(Plain.__init__).parameters
    assert [(p.name, p.kind) for p in fast.values()] == [(p.name, p.kind) for p in plain.values()]
    with pytest.raises(TypeError):
        Fast(1, {}, "x", 4)  # d is keyword-only
    with pytest.raises(TypeError):
        Fast()


def test_each_instance_gets_its_own_default_factory_value() -> None:
    one, two = Fast(1), Fast(1)
    assert one.b == {}
    assert one.b is not two.b
    assert one.f is not two.f


def test_the_class_stays_frozen_and_comparable() -> None:
    x = Fast(1, c="q")
    with pytest.raises(dataclasses.FrozenInstanceError):
        x.a = 2
    assert x == Fast(1, c="q")
    assert x != Fast(2)
    assert repr(x) == "_define.<locals>.Value(a=1, b={}, c='Q', d=3, e='z', f=[])"
    assert dataclasses.replace(x, a=7).a == 7
    assert Fast.__init__.__qualname__ == "_define.<locals>.Value.__init__"


def test_classes_it_cannot_reproduce_are_refused() -> None:
    @dataclass(slots=True)
    class Mutable:
        a: int

    @dataclass(frozen=True)
    class NoSlots:
        a: int

    @dataclass(frozen=True, slots=True)
    class WithInitVar:
        a: int
        b: dataclasses.InitVar[int] = 0

    for cls in (Mutable, NoSlots, WithInitVar):
        with pytest.raises(TypeError, match="fast_init"):
            fast_init(cls)

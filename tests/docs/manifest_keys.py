"""Every key path the ``$edgeHub`` desired properties' models accept, read off the pydantic models themselves.

A path joins keys with ``.``; a mapping's key is written ``<name>`` (routes) or ``<endpoint>`` (endpoints), a
list's items ``[]``: ``mqttBroker.authorizations[].allow[].operations``. A key that takes one object or a list of
such objects (a link's ``budget``) is written once, as the object: its keys are the same either way. A section (an
object of further keys) is not a leaf; every other key is.
"""

from __future__ import annotations

import types
from collections.abc import Iterator
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import BaseModel

from edgehub.manifest import EdgeHubDesired

__all__ = ["manifest_keys"]

# How the page writes the key of each mapping (the models name only its value).
MAPPING_KEYS = {"routes": "<name>", "endpoints": "<endpoint>"}


def manifest_keys() -> list[tuple[str, bool]]:
    """``(path, is_leaf)`` for every key ``EdgeHubDesired`` accepts, in the models' order."""
    return list(_walk(EdgeHubDesired, ""))


def _walk(model: type[BaseModel], prefix: str) -> Iterator[tuple[str, bool]]:
    for name, field in model.model_fields.items():
        key = field.alias or name
        path = f"{prefix}{key}"
        yield from _of_type(field.annotation, path, key)


def _of_type(annotation: Any, path: str, key: str) -> Iterator[tuple[str, bool]]:
    models: list[type[BaseModel]] = []
    scalar = False
    alternatives = _alternatives(annotation)
    for kind in alternatives:
        origin = get_origin(kind)
        if isinstance(kind, type) and issubclass(kind, BaseModel):
            models.append(kind)
        elif origin is dict:
            _, value = get_args(kind)
            if any(isinstance(v, type) and issubclass(v, BaseModel) for v in _alternatives(value)):
                yield path, False
                yield from _of_type(value, f"{path}.{MAPPING_KEYS.get(key, '<key>')}", key)
                return
            scalar = True
        elif origin is list:
            (item,) = get_args(kind)
            if _alternatives(item) and all(v in alternatives for v in _alternatives(item)):
                continue  # a list of what the key takes alone: the same keys, written once
            if any(isinstance(v, type) and issubclass(v, BaseModel) for v in _alternatives(item)):
                yield path, False
                yield from _of_type(item, f"{path}[]", key)
                return
            scalar = True
        else:
            scalar = True
    yield path, scalar or not models
    for m in models:
        yield from _walk(m, f"{path}.")


def _alternatives(annotation: Any) -> list[Any]:
    """The types a value may have: unions and ``Optional`` split, ``Annotated`` and ``None`` dropped."""
    if get_origin(annotation) is Annotated:
        return _alternatives(get_args(annotation)[0])
    if get_origin(annotation) in (Union, types.UnionType):
        return [t for a in get_args(annotation) for t in _alternatives(a)]
    if annotation is type(None):
        return []
    return [annotation]

"""Read-only mappings that cross process boundaries.

:func:`frozen` is a :class:`types.MappingProxyType` over a copy of a mapping: the frozen dataclasses' mapping
fields (trace measurements, a GPU profile's clocks and cost model) hold one. Importing this module registers a
pickle reduction for every ``MappingProxyType``: it unpickles as a read-only view over a copy of its items, so a
frozen dataclass holding one pickles (the shape book's worker processes send priced steps back to the training
process). A view's one owner is the object that holds it, so the copy loses nothing.
"""

from __future__ import annotations

import copyreg
import types
from collections.abc import Callable, Mapping
from typing import TypeVar

K = TypeVar("K")
V = TypeVar("V")


def frozen(mapping: Mapping[K, V]) -> types.MappingProxyType[K, V]:
    """A read-only view over a copy of ``mapping``'s items."""
    return types.MappingProxyType(dict(mapping))


def _reduce(view: types.MappingProxyType[K, V]) -> tuple[Callable[[Mapping[K, V]], types.MappingProxyType[K, V]],
                                                           tuple[dict[K, V]]]:
    return frozen, (dict(view),)


copyreg.pickle(types.MappingProxyType, _reduce)

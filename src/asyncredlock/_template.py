"""Lock names made per call from a template: ``"orders:{order_id}"`` filled with a
function's arguments (``AsyncRedlock.locked``) or a request's path parameters
(``contrib``)."""

from __future__ import annotations

import functools
import inspect
import string
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping
from contextlib import AbstractAsyncContextManager
from typing import Any, ParamSpec, TypeVar

from ._config import check_name, plain_str

__all__ = ["NameTemplate", "serialize"]

P = ParamSpec("P")
T = TypeVar("T")


class NameTemplate:
    """A ``str.format`` template whose fields are all named, checked when made.

    ``"jobs:{job_id}"``, ``"user:{user.id}"`` and ``"cell:{grid[3]}"`` name the
    value (or its attribute or item) to fill in; ``"{}"`` and ``"{0}"`` are refused,
    since the values come by name.
    """

    __slots__ = ("fields", "text")

    def __init__(self, text: object) -> None:
        """Raises:
        TypeError: ``text`` is not a ``str``.
        ValueError: It is empty, malformed (an unmatched brace, an empty
            attribute, an unclosed item, an unknown conversion), or has a positional
            field.
        """
        if not isinstance(text, str):
            raise TypeError(f"a lock name template must be a str, not {type(text).__name__}")
        text = plain_str(text)  # filled by str's own format_map, whatever the subclass
        if not text:
            raise ValueError("a lock name template must not be empty")
        try:
            fields = frozenset(_fields(text))
        except ValueError as exc:
            raise ValueError(f"lock name template {text!r}: {exc}") from None
        if not fields:  # the lock name itself: what it cannot be is known now
            check_name(text.format())
        self.text = text
        #: The names the template needs, without attributes or items.
        self.fields = frozenset(fields)

    def __repr__(self) -> str:
        return f"NameTemplate({self.text!r})"

    def require_fields(self, available: Iterable[str], kind: str, where: str) -> None:
        """Raise `ValueError` unless every field is one of ``available``: ``kind``
        names one of them, ``where`` where they come from, for the message ("not a
        parameter of f()", "not parameters of f()")."""
        missing = sorted(self.fields - set(available))
        if missing:
            what = f"a {kind} {where}" if len(missing) == 1 else f"{kind}s {where}"
            raise ValueError(
                f"lock name template {self.text!r} uses {', '.join(missing)},"
                f" which {'is' if len(missing) == 1 else 'are'} not {what}"
            )

    def fill(self, values: Mapping[str, object]) -> str:
        """The lock name for ``values``.

        Raises:
            ValueError: A field's attribute or item is missing in ``values``, or a
                value refuses its format spec (``"{n:d}"`` with a str); the message
                names the template.
        """
        try:
            return self.text.format_map(values)
        except (KeyError, AttributeError, IndexError, TypeError, ValueError) as exc:
            raise ValueError(f"cannot fill lock name template {self.text!r}: {exc!r}") from None


def _fields(text: str) -> list[str]:
    """The root names of ``text``'s fields, those nested in a format spec
    (``"{x:{width}}"``) included.

    Raises:
        ValueError: A malformed template, or a field without a name.
    """
    try:
        parsed = list(_FORMATTER.parse(text))
    except ValueError as exc:
        raise ValueError(f"malformed: {exc}") from None
    roots = []
    for _, field, spec, conversion in parsed:
        if field is None:
            continue
        root = field.partition(".")[0].partition("[")[0]
        if not root or root.isdigit():
            raise ValueError('fields must be named, as in "orders:{order_id}"')
        _check_field(field, root, conversion)
        roots.append(root)
        if spec and "{" in spec:
            roots.extend(_fields(spec))
    return roots


_FORMATTER = string.Formatter()


class _Anything:
    """A value with every attribute and item (itself): what a field reaches into."""

    def __getattr__(self, name: str) -> _Anything:
        return self

    def __getitem__(self, key: object) -> _Anything:
        return self


def _check_field(field: str, root: str, conversion: str | None) -> None:
    """Raise `ValueError`, as ``str.format`` would at every fill, if the field's
    attributes and items (``"{job_id.}"``, ``"{job_id[0]]}"``) or its conversion
    (``"{job_id!x}"``) are malformed: `Formatter.parse` leaves them unchecked."""
    anything = _Anything()
    try:
        _FORMATTER.get_field(field, (), {root: anything})
        _FORMATTER.convert_field(anything, conversion)
    except ValueError as exc:
        bang = "" if conversion is None else f"!{conversion}"
        raise ValueError(f"malformed field {{{field}{bang}}}: {exc}") from None


def serialize(
    template: NameTemplate, lock: Callable[[str], AbstractAsyncContextManager[object]]
) -> Callable[[Callable[P, Awaitable[T]]], Callable[P, Coroutine[Any, Any, T]]]:
    """A decorator running each call of a coroutine function inside
    ``lock(template filled with the call's arguments)``."""

    def decorate(function: Callable[P, Awaitable[T]]) -> Callable[P, Coroutine[Any, Any, T]]:
        if not inspect.iscoroutinefunction(function):
            raise TypeError(f"locked() decorates coroutine functions (async def), not {function!r}")
        signature = inspect.signature(function)
        where = f"of {function.__qualname__}()"
        template.require_fields(signature.parameters, "parameter", where)

        @functools.wraps(function)
        async def locked(*args: P.args, **kwargs: P.kwargs) -> T:
            bound = signature.bind(*args, **kwargs)  # TypeError as the call would raise
            bound.apply_defaults()
            async with lock(template.fill(bound.arguments)):
                return await function(*args, **kwargs)

        return locked

    return decorate

"""An op declared once: :class:`Op` wraps its torch reference, :func:`kernel` registers a
backend's kernel for it.

The reference function is the declaration: its signature is the op's (mypy checks every call
``backend.<op>(...)`` and every kernel against it) and its docstring the op's contract.
:class:`~metrale_kernels.backend.KernelBackend` holds one :class:`Op` per op; a backend class
names its kernels once (``class CpuBackend(TorchBackend, kernels=[...])``) and every op it has
no kernel for is the reference. Which function serves an op is settled when the backend class
is created (:func:`resolve_ops`), so a call costs what a method call costs, never a lookup.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar, overload

P = ParamSpec("P")
R = TypeVar("R")
B = TypeVar("B")


class Op(Generic[P, R]):
    """One op: its name (the reference's) and its reference. On a backend instance it is the
    function that serves the op there (as the class resolved it); on a class, the op itself."""

    def __init__(self, reference: Callable[P, R], *, name: str | None = None) -> None:
        self.reference = reference
        self.name = name or reference.__name__
        self.__doc__ = reference.__doc__

    def __set_name__(self, owner: type[Any], name: str) -> None:
        if name != self.name:
            raise TypeError(f"op {self.name!r} declared under another name, {name!r}")

    @overload
    def __get__(self, instance: None, owner: type[Any]) -> Op[P, R]: ...

    @overload
    def __get__(self, instance: object, owner: type[Any]) -> Callable[P, R]: ...

    def __get__(self, instance: object | None, owner: type[Any]) -> Op[P, R] | Callable[P, R]:
        # Reached only where no class resolved the op (an op declared after its backends).
        return self if instance is None else self.reference

    def __repr__(self) -> str:
        return f"Op({self.name})"


class Kernel(Generic[B, P, R]):
    """A backend's kernel for ``op``: the op's signature after the backend instance."""

    def __init__(self, op: Op[P, R], function: Callable[Concatenate[B, P], R]) -> None:
        self.op = op
        self.function = function

    def __repr__(self) -> str:
        return f"Kernel({self.op.name}: {self.function.__module__}.{self.function.__name__})"


def kernel(op: Op[P, R]) -> Callable[[Callable[Concatenate[B, P], R]], Kernel[B, P, R]]:
    """Decorate a backend's kernel for ``op``: ``def f(backend, <the reference's params>)``."""

    def register(function: Callable[Concatenate[B, P], R]) -> Kernel[B, P, R]:
        return Kernel(op, function)

    return register


def kernels_in(*namespaces: object) -> list[Kernel[Any, Any, Any]]:
    """Every :class:`Kernel` defined in ``namespaces`` (modules), in definition order."""
    return [
        value
        for namespace in namespaces
        for value in vars(namespace).values()
        if isinstance(value, Kernel)
    ]


def resolve_ops(
    cls: type[Any], ops: Iterable[Op[Any, Any]], kernels: Iterable[Kernel[Any, Any, Any]]
) -> None:
    """Set on ``cls`` the function that serves each op: its kernel among ``kernels``, else a
    method written on ``cls`` itself, else what a base class resolved, else the reference.

    A kernel is stored as a plain function (bound on access, like a method) and a reference as
    a static method: ``backend.op(...)`` is then one ordinary call, resolved here once.
    Raises ``TypeError`` for two kernels of one op, or a kernel of an op ``ops`` lacks."""
    by_name = {op.name: op for op in ops}
    chosen: dict[str, Kernel[Any, Any, Any]] = {}
    for found in kernels:
        name = found.op.name
        if by_name.get(name) is not found.op:
            raise TypeError(f"{cls.__name__}: {found!r} is for an op it does not have")
        if name in chosen:
            raise TypeError(f"{cls.__name__}: two kernels for {name}: {chosen[name]!r}, {found!r}")
        chosen[name] = found
    for name, op in by_name.items():
        if name in chosen:
            if name in vars(cls):
                raise TypeError(f"{cls.__name__}: {name} is both a method and {chosen[name]!r}")
            setattr(cls, name, chosen[name].function)
        elif isinstance(_inherited(cls, name), Op):
            setattr(cls, name, staticmethod(op.reference))


def _inherited(cls: type[Any], name: str) -> object:
    for klass in cls.__mro__:
        if name in vars(klass):
            return vars(klass)[name]
    return None


def served_by_reference(cls: type[Any], ops: Iterable[Op[Any, Any]]) -> list[str]:
    """The names of the ops a backend class runs as their references, sorted."""
    return sorted(
        op.name
        for op in ops
        if isinstance(served := _inherited(cls, op.name), Op)
        or (isinstance(served, staticmethod) and served.__func__ is op.reference)
    )

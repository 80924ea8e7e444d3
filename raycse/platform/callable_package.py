"""A package that is also its floor's function: ``raycse.train(run)`` and ``raycse.tune(settings)``.

Python binds a subpackage to its parent's attribute of the same name once it is imported, so a function
``raycse.train`` would be replaced by the package ``raycse.train`` as soon as anything imports it. The
package is made callable instead (its module's class gets a ``__call__``), so the name means the same
before and after: the function's docstring and signature are the package's ``__call__``'s.

    >>> import types
    >>> pkg = types.ModuleType("pkg")
    >>> def twice(x):
    ...     "Two of ``x``."
    ...     return 2 * x
    >>> make_callable(pkg, twice)
    >>> pkg(21), pkg.__call__.__doc__
    (42, 'Two of ``x``.')
"""

from __future__ import annotations

import types


def make_callable(module: types.ModuleType, function) -> None:
    """Calling ``module`` calls ``function`` (a staticmethod: no module argument is bound)."""
    cls = type(f"Callable_{module.__name__.replace('.', '_')}", (types.ModuleType,),
               {"__call__": staticmethod(function), "__doc__": types.ModuleType.__doc__})
    module.__class__ = cls

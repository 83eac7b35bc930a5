"""The operator's dashboard: every queue, lease and dead letter on one page, and a safe redrive.

An ASGI app over the public :class:`~leasekit.Queue` API (``pip install
leasekit[dashboard]``)::

    from leasekit.dashboard import app
    dashboard = app(["sqlite:///jobs.db?queue=jobs"], read_only=True)
    # mount it: Starlette(routes=[Mount("/ops/queues", dashboard)]), or serve it:
    # uvicorn.run(dashboard, host="127.0.0.1", port=8050)

or ``leasekit dashboard URL [URL...]``, which binds 127.0.0.1 and prints a
one-time login URL. See docs/dashboard.md: the pages, the security rules
(:mod:`leasekit.dashboard._guard`) and what each backend can show.

Importing this package imports no web framework: ``app``, ``Dashboard`` and
``Access`` load it when first used (so the command line can find
:mod:`leasekit.dashboard.command` without the extra installed).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._app import Dashboard, app
    from ._guard import Access

__all__ = ["Access", "Dashboard", "app"]


def __getattr__(name: str) -> Any:
    if name in ("Dashboard", "app"):
        from . import _app

        return getattr(_app, name)
    if name == "Access":
        from . import _guard

        return _guard.Access
    raise AttributeError(f"module 'leasekit.dashboard' has no attribute {name!r}")

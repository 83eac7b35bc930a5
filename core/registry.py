"""Finding backends by scheme and opening queues: the plugin registry.

Backends register through the entry-point group ``leasekit.backends``; the
built-in ones do too, through this project's own entry points, so a third-party
package adds a backend just by being installed. Each backend is known by a
lazy ``"module:Class"`` string and imported only when a queue of its scheme is
opened, so ``import leasekit`` imports no cloud SDK.

The default registry is the only global state; tests can build their own.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
import threading
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import pluggy

from . import hookspecs
from .checkpoints import CheckpointStore
from .errors import BackendNotFound, BackendNotInstalled, InvalidArgument, InvalidURL, LeaseError
from .events import count_changes
from .queue import Queue
from .redaction import redact, redact_url, remember_secrets
from .retry import RetryPolicy
from .spi import Driver
from .url import check_scheme, has_userinfo, is_url, parse_url

__all__ = ["BackendRegistry", "BackendSpec", "default_registry", "open"]

BACKEND_GROUP = "leasekit.backends"
PLUGIN_GROUP = "leasekit.plugins"


@dataclass(frozen=True)
class BackendSpec:
    """How to find one backend.

    Parameters
    ----------
        name: the scheme (``"sqlite"``) used in URLs and the keyword form of ``open``.
        driver: the driver class as ``"package.module:Class"``, imported lazily.
        extra: the pip extra that installs its SDK (for the install hint).
        description: one line for ``leasekit backends``.
    """

    name: str
    driver: str
    extra: str | None = None
    description: str = ""

    def __post_init__(self) -> None:
        check_scheme(self.name)
        if ":" not in self.driver:
            raise ValueError(f"BackendSpec.driver must be 'module:Class', got {self.driver!r}")

    @property
    def install_hint(self) -> str:
        """The pip command that installs this backend's dependencies."""
        return f"pip install 'leasekit[{self.extra}]'" if self.extra else "pip install leasekit"


class BackendRegistry:
    """Backends by scheme, collected from plugins through pluggy.

    Parameters
    ----------
        load_entrypoints: load plugins from the installed entry points (the
            default); ``False`` gives an empty registry for tests.
    """

    def __init__(self, *, load_entrypoints: bool = True) -> None:
        self._load_entrypoints = load_entrypoints
        self._pm: pluggy.PluginManager | None = None
        self._specs: dict[str, BackendSpec] | None = None
        self._extra: dict[str, BackendSpec] = {}
        self._classes: dict[str, type[Driver]] = {}
        self._lock = threading.RLock()

    @property
    def plugin_manager(self) -> pluggy.PluginManager:
        """The pluggy plugin manager (created and loaded on first use)."""
        with self._lock:
            if self._pm is None:
                pm = _PluginManager("leasekit")
                pm.add_hookspecs(hookspecs)
                if self._load_entrypoints:
                    _load_entrypoints(pm, BACKEND_GROUP)
                    _load_entrypoints(pm, PLUGIN_GROUP)
                self._pm = pm
            return self._pm

    @property
    def hook(self) -> Any:
        """The hook relay (``registry.hook.leasekit_lease_acquired(...)``)."""
        return self.plugin_manager.hook

    def register_plugin(self, plugin: object, name: str | None = None) -> None:
        """Register a plugin object (hook implementations) by hand."""
        with self._lock:
            self.plugin_manager.register(plugin, name=name)
            self._specs = None

    def register(self, spec: BackendSpec, *, clobber: bool = False) -> None:
        """Add a backend by hand; a scheme already known raises unless ``clobber``."""
        with self._lock:
            if not clobber and spec.name in self.specs():
                raise ValueError(
                    f"a backend named {spec.name!r} is already registered "
                    f"({self.specs()[spec.name].driver}); pass clobber=True to replace it"
                )
            self._extra[spec.name] = spec
            self._classes.pop(spec.name, None)
            self._specs = None

    def specs(self) -> dict[str, BackendSpec]:
        """Every known backend by name, sorted."""
        with self._lock:
            if self._specs is None:
                found: dict[str, BackendSpec] = {}
                for plugin_specs in self.plugin_manager.hook.leasekit_add_backends():
                    for spec in plugin_specs:
                        other = found.get(spec.name)
                        if other is not None and other != spec:
                            raise ValueError(
                                f"two plugins register backend {spec.name!r}: "
                                f"{other.driver} and {spec.driver}"
                            )
                        found[spec.name] = spec
                found.update(self._extra)
                self._specs = dict(sorted(found.items()))
            return self._specs

    def spec(self, name: str) -> BackendSpec:
        """The spec for ``name``; :class:`BackendNotFound` lists the installed ones."""
        specs = self.specs()
        try:
            return specs[name]
        except KeyError:
            known = ", ".join(specs) or "none"
            raise BackendNotFound(
                f"no backend named {name!r} is installed (installed: {known}); "
                "a third-party backend registers under the entry-point group "
                f"{BACKEND_GROUP!r}"
            ) from None

    def driver_class(self, name: str) -> type[Driver]:
        """Import and return the driver class for ``name``."""
        with self._lock:
            cls = self._classes.get(name)
            if cls is not None:
                return cls
            spec = self.spec(name)
            module_name, _, attr = spec.driver.partition(":")
            try:
                module = importlib.import_module(module_name)
            except ImportError as exc:
                raise BackendNotInstalled(
                    f"backend {name!r} needs packages that are not installed ({exc}); "
                    f"install them with: {spec.install_hint}"
                ) from exc
            cls = getattr(module, attr, None)
            if not (isinstance(cls, type) and issubclass(cls, Driver)):
                raise BackendNotFound(f"{spec.driver} is not a leasekit Driver class")
            self._classes[name] = cls
            return cls

    def open(
        self,
        target: str,
        *,
        create: bool = False,
        lease_duration: float | None = None,
        retry: RetryPolicy | None = None,
        call_timeout: float | None = None,
        checkpoint_store: CheckpointStore | None = None,
        **options: Any,
    ) -> Queue:
        """Open a queue by URL (``"sqlite:///jobs.db?queue=jobs"``) or backend name plus options.

        See :func:`leasekit.open`.
        """
        if not isinstance(target, str):
            raise InvalidURL(f"open() takes a URL or a backend name, got {type(target).__name__}")
        if not isinstance(create, bool):
            raise InvalidArgument(f"create must be True or False, got {type(create).__name__}")
        if is_url(target):
            if has_userinfo(target):
                # Refused before parsing: a parser would quote the credential back.
                scheme = target.partition("://")[0].lower()
                cls = self.driver_class(check_scheme(scheme))
                if not _takes_userinfo(cls):
                    _refuse_credentials(cls, (), userinfo=True)
            parsed = parse_url(target)
            cls = self.driver_class(parsed.scheme)
            _refuse_credentials(
                cls,
                parsed.query,
                userinfo=parsed.username is not None and not _takes_userinfo(cls),
            )
            try:
                url_options = cls.options_from_url(parsed)
            except LeaseError as exc:
                raise _redacted(exc) from exc.__cause__
            except (TypeError, ValueError) as exc:
                raise InvalidURL(f"cannot use {redact_url(target)!r}: {redact(str(exc))}") from exc
            merged = {**url_options, **options}
            where = redact_url(target)
        else:
            cls = self.driver_class(check_scheme(target))
            merged = dict(options)
            where = target
        _check_options(cls, merged, where)
        remember_secrets(merged, cls.secret_options)
        try:
            driver = cls(**merged)
        except LeaseError as exc:
            raise _redacted(exc) from exc.__cause__
        except (TypeError, ValueError) as exc:
            raise InvalidURL(f"cannot open {where!r}: {redact(str(exc))}") from exc
        try:
            queue = Queue(
                driver,
                lease_duration=lease_duration,
                retry=retry,
                hooks=self.hook,
                call_timeout=call_timeout,
                checkpoint_store=checkpoint_store,
            )
        except BaseException:
            driver.close()
            raise
        if create:
            try:
                queue.create()
            except BaseException:
                queue.close()
                raise
        return queue


def _redacted(exc: LeaseError) -> LeaseError:
    """``exc`` with anything secret-looking in its message replaced by ``***``."""
    exc.args = tuple(redact(arg) if isinstance(arg, str) else arg for arg in exc.args)
    return exc


def _takes_userinfo(cls: type[Driver]) -> bool:
    """Whether ``cls`` reads a URL's ``user[:password]@`` as its own (PostgreSQL's libpq URIs).

    Such a driver declares ``url_userinfo = True``; core then passes the parts to
    :meth:`Driver.options_from_url` (``ParsedURL.username`` / ``.password``),
    remembers the password for redaction, and shows the URL only redacted.
    """
    return getattr(cls, "url_userinfo", False) is True


def _refuse_credentials(cls: type[Driver], query: Iterable[str], *, userinfo: bool) -> None:
    """Credentials never travel in a URL: refuse userinfo (``user:secret@``) and secret options.

    The message names the offending option keys, never their values.
    """
    found = sorted(k for k in query if k.lower() in cls.secret_options)
    if userinfo:
        found.insert(0, "userinfo@")  # the RFC 3986 name; never the values
    if found:
        raise InvalidURL(
            f"{cls.scheme or cls.__name__} URLs carry no credentials (got {', '.join(found)}); "
            f"{cls.credential_hint}"
        )


class _PluginManager(pluggy.PluginManager):
    """pluggy's manager, counting its changes so a queue's events can cache who listens.

    Every registration, unregistration and new hook spec bumps the count, a
    one-item list :class:`~leasekit.events.Events` finds by the hook relay
    (:func:`~leasekit.events.count_changes`).
    """

    def __init__(self, project_name: str) -> None:
        super().__init__(project_name)
        self._changes = count_changes(self.hook)

    def register(self, plugin: object, name: str | None = None) -> str | None:
        try:
            return super().register(plugin, name)
        finally:
            self._changes[0] += 1

    def unregister(self, plugin: object | None = None, name: str | None = None) -> Any:
        try:
            return super().unregister(plugin, name)
        finally:
            self._changes[0] += 1

    def add_hookspecs(self, module_or_class: Any) -> None:
        try:
            super().add_hookspecs(module_or_class)
        finally:
            self._changes[0] += 1


def _load_entrypoints(pm: pluggy.PluginManager, group: str) -> None:
    """Register every plugin of an entry-point group; a broken one is skipped with a warning.

    Like pluggy's ``load_setuptools_entrypoints``, but one plugin that fails to
    import must not take every other backend down with it.
    """
    for dist in importlib.metadata.distributions():
        for ep in dist.entry_points:
            if ep.group != group or pm.get_plugin(ep.name) or pm.is_blocked(ep.name):
                continue
            try:
                plugin = ep.load()
            except Exception as exc:
                warnings.warn(
                    f"leasekit: skipping plugin {ep.name!r} ({ep.value}) from "
                    f"{dist.metadata['name']}: {type(exc).__name__}: {exc}",
                    RuntimeWarning,
                    stacklevel=2,
                )
                continue
            pm.register(plugin, name=ep.name)


def _check_options(cls: type[Driver], options: dict[str, Any], where: str) -> None:
    """Refuse options the driver does not take, naming the ones it does."""
    signature = inspect.signature(cls)
    params = signature.parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    accepted = [n for n, p in params.items() if p.kind is not inspect.Parameter.VAR_POSITIONAL]
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise InvalidURL(
            f"{where!r}: unknown option(s) {', '.join(unknown)} for backend "
            f"{cls.scheme or cls.__name__!r}; it takes: "
            + ", ".join(n for n in accepted if not n.startswith("_"))  # private ones unnamed
        )
    missing = [
        n
        for n, p in params.items()
        if p.default is inspect.Parameter.empty
        and p.kind in (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        and n not in options
    ]
    if missing:
        raise InvalidURL(
            f"{where!r}: backend {cls.scheme or cls.__name__!r} needs option(s) "
            f"{', '.join(missing)}"
        )


_default: BackendRegistry | None = None
_default_lock = threading.Lock()


def default_registry() -> BackendRegistry:
    """The process-wide registry loaded from installed entry points."""
    global _default
    with _default_lock:
        if _default is None:
            _default = BackendRegistry()
        return _default


def open(
    target: str,
    *,
    create: bool = False,
    lease_duration: float | None = None,
    retry: RetryPolicy | None = None,
    call_timeout: float | None = None,
    checkpoint_store: CheckpointStore | None = None,
    **options: Any,
) -> Queue:
    """Open a queue.

    Parameters
    ----------
        target: a URL such as ``"sqlite:///orders.db?queue=orders"`` (three
            slashes: a relative path; four: absolute) or ``"memory://orders"``,
            or a backend name with the rest as keywords:
            ``open("sqlite", path="orders.db", queue="orders")``.
        create: create the queue if it is missing; without it a missing queue
            raises :class:`QueueNotFound` on first use.
        lease_duration: the physical lease used when a call gives none.
        retry: backoff for transient errors (default: 3 tries, within each call's deadline).
        call_timeout: the longest one backend call may take, retries included, when
            nothing tighter bounds it (default 10 s): sends, admin calls, and a receive
            beyond its long poll. Renewals and settles are bounded by the lease's time left.
        checkpoint_store: where ``Lease.checkpoint`` keeps progress on a backend that
            cannot keep it with the message (``capabilities.native_checkpoint`` is
            false): a :class:`leasekit.CheckpointStore` such as
            :class:`leasekit.SqliteCheckpointStore`.
        **options: backend options (credentials and clients belong here, not in the URL);
            they override options from the URL.

    Raises
    ------
        InvalidURL: a malformed URL or an option the backend does not take.
        BackendNotFound: no installed backend has that scheme (the message lists them).
        BackendNotInstalled: the backend's extra is missing (the message says what to install).
    """
    return default_registry().open(
        target,
        create=create,
        lease_duration=lease_duration,
        retry=retry,
        call_timeout=call_timeout,
        checkpoint_store=checkpoint_store,
        **options,
    )

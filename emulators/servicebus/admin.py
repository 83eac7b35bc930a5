"""Entity management over HTTP, as ``ServiceBusAdministrationClient`` speaks it (ATOM XML).

Service Bus manages entities through a REST API whose bodies are ATOM entries
holding a ``QueueDescription`` (namespace
``http://schemas.microsoft.com/netservices/2010/10/servicebus/connect``), the
API the SDK's ``azure.servicebus.management`` client calls. Microsoft's own
emulator serves it on a second port (5300 by default); so does this one
(``--http-port``). What is served, with the real service's answers:

* ``PUT /{queue}`` with a ``QueueDescription``: create (``201`` and the entry),
  ``409`` if it exists; with ``If-Match`` (the SDK's ``update_queue``): update
  (``200``), ``404`` if missing. The properties the broker honours are applied
  (``LockDuration``, ``MaxDeliveryCount``, ``DefaultMessageTimeToLive``,
  ``DeadLetteringOnMessageExpiration``, ``RequiresSession``, which, as on Service
  Bus, only a create may set: an update changing it gets ``400``); one it cannot honour
  set to a value that matters (``RequiresDuplicateDetection: true``,
  ``ForwardTo``...) is refused ``501``, naming it; ``MaxMessageSizeInKilobytes``
  other than the Standard tier's 256 is refused ``400`` (a Premium-only property);
* ``GET /{queue}``: the entry with runtime counts; a missing queue gives ``200``
  and an empty feed, as Service Bus does (the SDK raises ``ResourceNotFoundError``).
  The counts are the service's: ``ActiveMessageCount`` covers available, locked
  and deferred messages (Service Bus has no count of locked ones),
  ``ScheduledMessageCount`` those not yet due, ``DeadLetterMessageCount`` the
  dead-letter sub-queue, and ``MessageCount`` all three together; they follow
  lock expiry, schedules and time-to-live as the broker applies them (on its
  ``amqp.TICK_SECONDS`` timer);
* ``DELETE /{queue}``: ``200``; ``404`` if missing;
* ``GET /$Resources/queues?$skip=&$top=``: a feed of entries, paged;
* ``GET /$namespaceinfo``: the namespace's properties.

Topics, subscriptions and rules are answered ``501 Not Implemented`` with a
sentence saying so. Authorization headers are not checked (as on the AMQP side,
any token is accepted). Entity names are case-insensitive, as in Service Bus.

The HTTP server runs on its own threads; every request is handed to the proton
container thread (which owns the broker) and answered from there.
"""

from __future__ import annotations

import datetime
import logging
import threading
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from .broker import Broker, EntityNotFound, MessageState, Queue
from .config import QueueProperties

__all__ = ["AdminHttpServer", "AdminRequest", "AdminResponse", "handle"]

_log = logging.getLogger("leasekit.emulators.servicebus")

ATOM = "http://www.w3.org/2005/Atom"
SB = "http://schemas.microsoft.com/netservices/2010/10/servicebus/connect"
SB_COUNTS = "http://schemas.microsoft.com/netservices/2011/06/servicebus"
XSI = "http://www.w3.org/2001/XMLSchema-instance"
ATOM_TYPE = "application/atom+xml;type=entry;charset=utf-8"
FEED_TYPE = "application/atom+xml;type=feed;charset=utf-8"
XML_TYPE = "application/xml; charset=utf-8"
#: TimeSpan.MaxValue, Service Bus' "never" for TTL and AutoDeleteOnIdle.
NEVER = "P10675199DT2H48M5.4775807S"
TOPICS_UNSUPPORTED = "Topics, subscriptions and rules are not supported by this emulator."
#: The Standard tier's message size, in KB: the only MaxMessageSizeInKilobytes a
#: Standard namespace has (the property "is only available when using a Premium
#: namespace", CreateQueueOptions.MaxMessageSizeInKilobytes).
STANDARD_MAX_MESSAGE_KB = 256
#: How long an HTTP request waits for the container thread.
REQUEST_TIMEOUT = 10.0

# QueueDescription elements in the order the service writes them (DataContract order).
_QUEUE_FIELDS = (
    "LockDuration",
    "MaxSizeInMegabytes",
    "RequiresDuplicateDetection",
    "RequiresSession",
    "DefaultMessageTimeToLive",
    "DeadLetteringOnMessageExpiration",
    "DuplicateDetectionHistoryTimeWindow",
    "MaxDeliveryCount",
    "EnableBatchedOperations",
    "SizeInBytes",
    "MessageCount",
    "IsAnonymousAccessible",
    "AuthorizationRules",
    "Status",
    "CreatedAt",
    "UpdatedAt",
    "AccessedAt",
    "SupportOrdering",
    "CountDetails",
    "AutoDeleteOnIdle",
    "EnablePartitioning",
    "EntityAvailabilityStatus",
    "EnableExpress",
    "MaxMessageSizeInKilobytes",
)
#: Elements a client may send that describe what the service itself sets, or that
#: change nothing here (read-only counts, sizes, status, ordering...).
_IGNORED = frozenset(
    {
        "MaxSizeInMegabytes",
        "EnableBatchedOperations",
        "SizeInBytes",
        "MessageCount",
        "IsAnonymousAccessible",
        "AuthorizationRules",
        "Status",
        "CreatedAt",
        "UpdatedAt",
        "AccessedAt",
        "SupportOrdering",
        "CountDetails",
        "AutoDeleteOnIdle",
        "EnablePartitioning",
        "EntityAvailabilityStatus",
        "EnableExpress",
        "MaxMessageSizeInKilobytes",
        "UserMetadata",
    }
)

ET.register_namespace("", ATOM)
ET.register_namespace("d2p1", SB_COUNTS)
ET.register_namespace("i", XSI)


@dataclass
class AdminResponse:
    """An HTTP answer: status, body and content type."""

    status: int
    body: bytes = b""
    content_type: str = XML_TYPE


@dataclass
class AdminRequest:
    """One HTTP request, handed from the HTTP thread to the container thread."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    host: str
    response: AdminResponse | None = None
    done: threading.Event = field(default_factory=threading.Event)


class AdminHttpServer:
    """The HTTP listener; each request is passed to ``submit`` and its answer awaited.

    Parameters:
        host: address to listen on.
        port: port to listen on (bound in the constructor, so it accepts at once).
        submit: called on the HTTP thread with each request; must arrange for
            :func:`handle` to answer it on the container thread and set ``done``.
    """

    def __init__(self, host: str, port: int, submit: Callable[[AdminRequest], None]) -> None:
        handler = _handler_class(submit)
        self._server = ThreadingHTTPServer((host, port), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="servicebus-admin-http", daemon=True
        )

    @property
    def port(self) -> int:
        """The port it listens on."""
        return int(self._server.server_address[1])

    def start(self) -> None:
        """Serve in a background thread."""
        self._thread.start()

    def stop(self) -> None:
        """Stop serving and close the socket."""
        self._server.shutdown()
        self._server.server_close()


def _handler_class(submit: Callable[[AdminRequest], None]) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "leasekit-servicebus-emulator"

        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            request = AdminRequest(
                method=self.command,
                path=self.path,
                headers={k.lower(): v for k, v in self.headers.items()},
                body=body,
                host=self.headers.get("Host") or "localhost",
            )
            submit(request)
            if request.done.wait(REQUEST_TIMEOUT) and request.response is not None:
                response = request.response
            else:
                response = _error(503, "The emulator did not answer in time.")
            self.send_response(response.status)
            self.send_header("Content-Type", response.content_type)
            self.send_header("Content-Length", str(len(response.body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(response.body)

        do_GET = do_PUT = do_DELETE = do_POST = do_HEAD = _serve

        def log_message(self, format: str, *args: Any) -> None:
            _log.debug("admin http: " + format, *args)

    return Handler


# -- requests, answered on the container thread ----------------------------------------------


def handle(
    broker: Broker, request: AdminRequest, on_delete: Callable[[Queue], None]
) -> AdminResponse:
    """Answer one management request against ``broker``.

    Parameters:
        broker: the emulator's state (call on the container thread only).
        request: the HTTP request.
        on_delete: called with a queue just deleted (to detach its links).

    Returns:
        The HTTP response.
    """
    url = urlsplit(request.path)
    path = unquote(url.path).strip("/")
    query = {k.lower(): v[-1] for k, v in parse_qs(url.query).items()}
    method = request.method.upper()
    base = f"http://{request.host}"
    try:
        if path == "health" and method == "GET":
            return AdminResponse(200, b"Healthy", "text/plain; charset=utf-8")
        if path.lower() == "$namespaceinfo" and method == "GET":
            return _namespace(broker, base)
        if path.lower() == "$resources/queues" and method == "GET":
            return _list(broker, base, query)
        segments = path.casefold().split("/")
        if path.lower().startswith("$resources/") or "subscriptions" in segments[1:]:
            return _error(501, TOPICS_UNSUPPORTED)
        if not path or "$" in path:
            return _error(400, f"The entity path {path!r} is not valid.")
        if path.casefold() in broker.config.topics:
            return _error(501, TOPICS_UNSUPPORTED)
        if method == "GET":
            return _get(broker, base, path)
        if method == "PUT":
            return _put(broker, base, path, request)
        if method == "DELETE":
            return _delete(broker, path, on_delete)
        return _error(405, f"The method {method} is not allowed on an entity.")
    except Exception as exc:  # a bad request must not take the emulator down
        _log.exception("admin request %s %s failed", method, request.path)
        return _error(500, f"Internal error: {exc}")


def _get(broker: Broker, base: str, name: str) -> AdminResponse:
    try:
        queue = broker.queue(name, create=False)
    except EntityNotFound:
        # Service Bus answers a missing entity with an empty feed, not a 404.
        return AdminResponse(200, _xml(_feed(base, name, [])), FEED_TYPE)
    return AdminResponse(200, _xml(_entry(base, queue)), ATOM_TYPE)


def _put(broker: Broker, base: str, name: str, request: AdminRequest) -> AdminResponse:
    try:
        description = _description(request.body)
    except (ET.ParseError, ValueError) as exc:
        return _error(400, f"The request body is not a valid entity description: {exc}")
    if description is None:
        return _error(501, TOPICS_UNSUPPORTED)
    update = "if-match" in request.headers
    existing = _find(broker, name)
    if update and existing is None:
        return _error(404, f"Entity '{name}' was not found.")
    if not update and existing is not None:
        return _error(
            409,
            f"SubCode=40900. Conflict. The messaging entity '{name}' already exists.",
        )
    max_kb = description.get("MaxMessageSizeInKilobytes")
    if max_kb is not None and max_kb != str(STANDARD_MAX_MESSAGE_KB):
        return _error(
            400,
            f"SubCode=40000. MaxMessageSizeInKilobytes={max_kb} is only supported on Premium "
            f"namespaces; this namespace is Standard (messages up to "
            f"{STANDARD_MAX_MESSAGE_KB} KB).",
        )
    base_properties = existing.properties if existing else broker.config.default_properties
    notes: list[str] = []
    try:
        properties = _apply(base_properties, description, notes)
    except ValueError as exc:
        return _error(400, str(exc))
    if properties.unsupported:
        return _error(501, "; ".join(n for n in notes if "not supported" in n))
    if existing is not None and properties.requires_session != existing.properties.requires_session:
        # "You can't enable or disable message sessions after the queue or subscription
        # is created" (Microsoft Learn, Enable message sessions).
        return _error(
            400,
            "SubCode=40000. The value for the RequiresSession property of an existing "
            f"Queue cannot be changed. Entity: '{name}'.",
        )
    for note in notes:
        _log.warning("admin: queue %r: %s", name, note)
    try:
        queue = broker.create_queue(name, properties)
    except ValueError as exc:
        return _error(400, str(exc))
    queue.updated_at = _now()
    return AdminResponse(200 if update else 201, _xml(_entry(base, queue)), ATOM_TYPE)


def _delete(broker: Broker, name: str, on_delete: Callable[[Queue], None]) -> AdminResponse:
    queue = _find(broker, name)
    if queue is None:
        return _error(404, f"Entity '{name}' was not found.")
    broker.delete_queue(name)
    on_delete(queue)
    return AdminResponse(200, b"", XML_TYPE)


def _list(broker: Broker, base: str, query: dict[str, str]) -> AdminResponse:
    skip = int(query.get("$skip") or 0)
    top = int(query.get("$top") or 100)
    queues = sorted(broker.queues, key=lambda q: q.name.casefold())
    page = queues[skip : skip + top]
    more = skip + top < len(queues)
    next_href = f"{base}/$Resources/queues?$skip={skip + top}&$top={top}" if more else None
    return AdminResponse(
        200, _xml(_feed(base, "queues", [_entry(base, q) for q in page], next_href)), FEED_TYPE
    )


def _namespace(broker: Broker, base: str) -> AdminResponse:
    entry = ET.Element(f"{{{ATOM}}}entry")
    _text(entry, f"{{{ATOM}}}id", f"{base}/$namespaceinfo")
    _text(entry, f"{{{ATOM}}}title", broker.config.namespace).set("type", "text")
    _text(entry, f"{{{ATOM}}}updated", _iso(_now()))
    content = ET.SubElement(entry, f"{{{ATOM}}}content", {"type": "application/xml"})
    info = ET.SubElement(content, f"{{{SB}}}NamespaceInfo")
    created = _iso(broker.created_at)
    for tag, value in (
        ("CreatedTime", created),
        ("MessagingSKU", "Standard"),
        ("ModifiedTime", created),
        ("Name", broker.config.namespace),
        ("NamespaceType", "Messaging"),
    ):
        _text(info, f"{{{SB}}}{tag}", value)
    return AdminResponse(200, _xml(entry), ATOM_TYPE)


def _find(broker: Broker, name: str) -> Queue | None:
    try:
        return broker.queue(name, create=False)
    except EntityNotFound:
        return None


# -- request bodies ------------------------------------------------------------------------------


def _description(body: bytes) -> dict[str, str] | None:
    """The QueueDescription's elements by local name; ``None`` for another entity kind."""
    root = ET.fromstring(body)
    for element in root.iter():
        local = element.tag.rsplit("}", 1)[-1]
        if local == "QueueDescription":
            return {
                child.tag.rsplit("}", 1)[-1]: (child.text or "").strip()
                for child in element
                if _is_set(child)
            }
        if local in ("TopicDescription", "SubscriptionDescription", "RuleDescription"):
            return None
    raise ValueError("no QueueDescription element")


def _is_set(element: ET.Element) -> bool:
    return element.get(f"{{{XSI}}}nil", "false").lower() != "true"


def _apply(base: QueueProperties, description: dict[str, str], notes: list[str]) -> QueueProperties:
    """``base`` with the description's properties applied (Config.json names are the same)."""
    properties = {k: v for k, v in description.items() if k not in _IGNORED}
    return base.updated(properties, notes)


# -- response bodies -----------------------------------------------------------------------------


def _entry(base: str, queue: Queue) -> ET.Element:
    entry = ET.Element(f"{{{ATOM}}}entry")
    href = f"{base}/{queue.name}?api-version=2021-05"
    _text(entry, f"{{{ATOM}}}id", href)
    _text(entry, f"{{{ATOM}}}title", queue.name).set("type", "text")
    _text(entry, f"{{{ATOM}}}published", _iso(queue.created_at))
    _text(entry, f"{{{ATOM}}}updated", _iso(queue.updated_at))
    author = ET.SubElement(entry, f"{{{ATOM}}}author")
    _text(author, f"{{{ATOM}}}name", "leasekit-servicebus-emulator")
    ET.SubElement(entry, f"{{{ATOM}}}link", {"rel": "self", "href": href})
    content = ET.SubElement(entry, f"{{{ATOM}}}content", {"type": "application/xml"})
    description = ET.SubElement(content, f"{{{SB}}}QueueDescription")
    for tag, value in _queue_values(queue):
        if tag == "CountDetails":
            details = ET.SubElement(description, f"{{{SB}}}CountDetails")
            for name, count in value:
                _text(details, f"{{{SB_COUNTS}}}{name}", str(count))
        elif tag == "AuthorizationRules":
            ET.SubElement(description, f"{{{SB}}}AuthorizationRules")
        else:
            _text(description, f"{{{SB}}}{tag}", value)
    return entry


def _queue_values(queue: Queue) -> list[tuple[str, Any]]:
    props = queue.properties
    counts = _counts(queue)
    values: dict[str, Any] = {
        "LockDuration": _duration(props.lock_duration),
        "MaxSizeInMegabytes": "1024",
        "RequiresDuplicateDetection": "false",
        "RequiresSession": _bool(props.requires_session),
        "DefaultMessageTimeToLive": (
            NEVER if props.default_ttl is None else _duration(props.default_ttl)
        ),
        "DeadLetteringOnMessageExpiration": _bool(props.dead_lettering_on_message_expiration),
        "DuplicateDetectionHistoryTimeWindow": "PT10M",
        "MaxDeliveryCount": str(props.max_delivery_count),
        "EnableBatchedOperations": "true",
        "SizeInBytes": str(counts["size"]),
        "MessageCount": str(counts["total"]),
        "IsAnonymousAccessible": "false",
        "AuthorizationRules": None,
        "Status": "Active",
        "CreatedAt": _iso(queue.created_at),
        "UpdatedAt": _iso(queue.updated_at),
        "AccessedAt": "0001-01-01T00:00:00Z",
        "SupportOrdering": "true",
        "CountDetails": [
            ("ActiveMessageCount", counts["active"]),
            ("DeadLetterMessageCount", counts["dead"]),
            ("ScheduledMessageCount", counts["scheduled"]),
            ("TransferMessageCount", 0),
            ("TransferDeadLetterMessageCount", 0),
        ],
        "AutoDeleteOnIdle": NEVER,
        "EnablePartitioning": "false",
        "EntityAvailabilityStatus": "Available",
        "EnableExpress": "false",
        "MaxMessageSizeInKilobytes": str(STANDARD_MAX_MESSAGE_KB),
    }
    return [(tag, values[tag]) for tag in _QUEUE_FIELDS]


def _counts(queue: Queue) -> dict[str, int]:
    active = scheduled = size = 0
    for message in queue.active.messages():
        size += message.size
        if message.state is MessageState.SCHEDULED:
            scheduled += 1
        else:
            active += 1
    dead = 0
    for message in queue.dead_letter.messages():
        size += message.size
        dead += 1
    return {
        "active": active,
        "scheduled": scheduled,
        "dead": dead,
        "total": active + scheduled + dead,
        "size": size,
    }


def _feed(
    base: str, title: str, entries: list[ET.Element], next_href: str | None = None
) -> ET.Element:
    feed = ET.Element(f"{{{ATOM}}}feed")
    _text(feed, f"{{{ATOM}}}title", title).set("type", "text")
    _text(feed, f"{{{ATOM}}}id", f"{base}/{title}")
    _text(feed, f"{{{ATOM}}}updated", _iso(_now()))
    ET.SubElement(feed, f"{{{ATOM}}}link", {"rel": "self", "href": f"{base}/{title}"})
    if next_href is not None:
        ET.SubElement(feed, f"{{{ATOM}}}link", {"rel": "next", "href": next_href})
    feed.extend(entries)
    return feed


def _error(status: int, detail: str) -> AdminResponse:
    root = ET.Element("Error")
    _text(root, "Code", str(status))
    _text(root, "Detail", detail)
    return AdminResponse(status, _xml(root), XML_TYPE)


def _text(parent: ET.Element, tag: str, text: str) -> ET.Element:
    element = ET.SubElement(parent, tag)
    element.text = text
    return element


def _xml(element: ET.Element) -> bytes:
    return bytes(ET.tostring(element, encoding="utf-8", xml_declaration=True))


def _bool(value: bool) -> str:
    return "true" if value else "false"


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _iso(moment: datetime.datetime) -> str:
    return moment.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _duration(seconds: float) -> str:
    """An ISO 8601 duration as .NET writes a TimeSpan (``PT1M``, ``PT2S``, ``PT0.5S``)."""
    whole = int(seconds)
    fraction = round(seconds - whole, 7)
    days, rest = divmod(whole, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    text = "P" + (f"{days}D" if days else "")
    clock = ""
    if hours:
        clock += f"{hours}H"
    if minutes:
        clock += f"{minutes}M"
    if secs or fraction or not (days or hours or minutes):
        value = secs + fraction
        clock += f"{value:.7f}".rstrip("0").rstrip(".") + "S"
    return text + ("T" + clock if clock else "")

# House docstring style uses "Parameters:"/"Returns:"/"Raises:" sections (STYLE.md 14), which
# ruff's unconfigured pydocstyle misreads as numpy sections.
"""MNS's XML bodies: parse what clients send, build what MNS answers.

All elements live in the namespace ``http://mns.aliyuncs.com/doc/v1/``. Request
parsing ignores namespaces (clients differ in whether they send one); responses
always declare it on the root element, carry no insignificant whitespace (the
Python SDK's minidom decoder reads ``firstChild``), and times are milliseconds
since the epoch.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from xml.etree import ElementTree
from xml.sax.saxutils import escape

from .errors import MnsError
from .store import MessageView, OutgoingMessage, Property, QueueInfo, SentMessage

__all__ = [
    "XMLNS",
    "batch_delete_errors_xml",
    "change_visibility_xml",
    "error_xml",
    "message_xml",
    "messages_xml",
    "parse_messages",
    "parse_queue_attributes",
    "parse_receipt_handles",
    "queue_xml",
    "queues_xml",
    "sent_xml",
]

XMLNS = "http://mns.aliyuncs.com/doc/v1/"
_DECLARATION = '<?xml version="1.0" encoding="UTF-8"?>\n'
_PROPERTY_CONTAINERS = (
    ("UserProperties", "PropertyValue"),
    ("SystemProperties", "SystemPropertyValue"),
)


def _ms(seconds: float) -> str:
    return str(int(seconds * 1000))


def _elements(pairs: Iterable[tuple[str, str]]) -> str:
    return "".join(f"<{tag}>{escape(value)}</{tag}>" for tag, value in pairs)


def _document(root: str, inner: str) -> bytes:
    return f'{_DECLARATION}<{root} xmlns="{XMLNS}">{inner}</{root}>'.encode()


def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


def _parse(body: bytes, root: str | tuple[str, ...]) -> ElementTree.Element:
    try:
        element = ElementTree.fromstring(body)
    except ElementTree.ParseError:
        raise MnsError.malformed_xml() from None
    roots = (root,) if isinstance(root, str) else root
    if _local(element.tag) not in roots:
        raise MnsError.invalid_argument(f"The root element must be {' or '.join(roots)}.")
    return element


def _int(element: ElementTree.Element) -> int:
    try:
        return int((element.text or "").strip())
    except ValueError:
        raise MnsError.invalid_argument(
            f"The XML you provided did not validate against our published schema, "
            f"cause by {_local(element.tag)}."
        ) from None


# ----------------------------------------------------------------- requests


def parse_queue_attributes(body: bytes) -> tuple[dict[str, int], bool | None]:
    """Parse a ``<Queue>`` body (CreateQueue, SetQueueAttributes).

    Returns:
        The numeric attributes present, and LoggingEnabled if present.

    Raises:
        MnsError: ``MalformedXML`` or ``InvalidArgument``.
    """
    if not body.strip():
        return {}, None
    root = _parse(body, "Queue")
    attributes: dict[str, int] = {}
    logging: bool | None = None
    for child in root:
        name = _local(child.tag)
        if name == "LoggingEnabled":
            text = (child.text or "").strip().lower()
            if text not in ("true", "false"):
                raise MnsError.invalid_argument("LoggingEnabled must be True or False.")
            logging = text == "true"
        else:
            attributes[name] = _int(child)
    return attributes, logging


def _properties(element: ElementTree.Element, item_tag: str) -> tuple[Property, ...]:
    found = []
    for item in element:
        if _local(item.tag) != item_tag:
            continue
        fields = {_local(f.tag): f.text or "" for f in item}
        found.append(
            Property(fields.get("Name", ""), fields.get("Value", ""), fields.get("Type", ""))
        )
    return tuple(found)


def _message(element: ElementTree.Element) -> OutgoingMessage:
    body = ""
    delay: int | None = None
    priority: int | None = None
    group: str | None = None
    props: dict[str, tuple[Property, ...]] = {}
    for child in element:
        name = _local(child.tag)
        if name == "MessageBody":
            body = child.text or ""
        elif name == "DelaySeconds":
            delay = _int(child)
        elif name == "Priority":
            priority = _int(child)
        elif name == "MessageGroupId":
            group = child.text or None  # an empty element is no group
        else:
            for container, item_tag in _PROPERTY_CONTAINERS:
                if name == container:
                    props[container] = _properties(child, item_tag)
    return OutgoingMessage(
        body=body,
        delay_seconds=delay,
        priority=priority,
        user_properties=props.get("UserProperties", ()),
        system_properties=props.get("SystemProperties", ()),
        group=group,
    )


def parse_messages(body: bytes) -> tuple[list[OutgoingMessage], bool]:
    """Parse a SendMessage (``<Message>``) or BatchSendMessage (``<Messages>``) body.

    Returns:
        The messages, and whether the body was the batch form.

    Raises:
        MnsError: ``MalformedXML`` or ``InvalidArgument``.
    """
    root = _parse(body, ("Message", "Messages"))
    if _local(root.tag) == "Message":
        return [_message(root)], False
    return [_message(child) for child in root if _local(child.tag) == "Message"], True


def parse_receipt_handles(body: bytes) -> list[str]:
    """Parse a BatchDeleteMessage ``<ReceiptHandles>`` body.

    Raises:
        MnsError: ``MalformedXML`` or ``InvalidArgument``.
    """
    root = _parse(body, "ReceiptHandles")
    return [(c.text or "").strip() for c in root if _local(c.tag) == "ReceiptHandle"]


# ---------------------------------------------------------------- responses


def error_xml(code: str, message: str, request_id: str, host_id: str) -> bytes:
    """Build MNS's ``<Error>`` body."""
    return _document(
        "Error",
        _elements(
            [("Code", code), ("Message", message), ("RequestId", request_id), ("HostId", host_id)]
        ),
    )


def _properties_xml(view: MessageView) -> str:
    parts = []
    for (container, item_tag), props in zip(
        _PROPERTY_CONTAINERS, (view.user_properties, view.system_properties), strict=True
    ):
        if props:
            items = "".join(
                f"<{item_tag}>"
                + _elements([("Name", p.name), ("Value", p.value), ("Type", p.type)])
                + f"</{item_tag}>"
                for p in props
            )
            parts.append(f"<{container}>{items}</{container}>")
    return "".join(parts)


def _message_fields(view: MessageView) -> str:
    pairs = [("MessageId", view.message_id)]
    if view.receipt_handle is not None:
        pairs.append(("ReceiptHandle", view.receipt_handle))
    pairs += [
        ("MessageBodyMD5", view.body_md5),
        ("MessageBody", view.body),
        ("EnqueueTime", _ms(view.enqueue_time)),
    ]
    if view.next_visible_time is not None:
        pairs.append(("NextVisibleTime", _ms(view.next_visible_time)))
    first = view.first_dequeue_time
    pairs += [
        # Never-received messages (peek only) report 0; MNS does not document this case.
        ("FirstDequeueTime", _ms(first) if first is not None else "0"),
        ("DequeueCount", str(view.dequeue_count)),
        ("Priority", str(view.priority)),
    ]
    if view.group is not None:
        # "ReceiveMessage … 返回体包含MessageGroupId" (the body contains MessageGroupId).
        pairs.append(("MessageGroupId", view.group))
    return _elements(pairs) + _properties_xml(view)


def message_xml(view: MessageView) -> bytes:
    """Build a ReceiveMessage/PeekMessage ``<Message>`` body."""
    return _document("Message", _message_fields(view))


def messages_xml(views: Sequence[MessageView]) -> bytes:
    """Build a BatchReceiveMessage/BatchPeekMessage ``<Messages>`` body."""
    return _document("Messages", "".join(f"<Message>{_message_fields(v)}</Message>" for v in views))


def sent_xml(sent: Sequence[SentMessage], batch: bool) -> bytes:
    """Build the SendMessage (``<Message>``) or BatchSendMessage (``<Messages>``) answer.

    A message sent to an ordered queue carries its ``MessageGroupId`` (which the
    SDKs read from the answer when present).
    """
    items = [
        _elements(
            [("MessageId", s.message_id), ("MessageBodyMD5", s.body_md5)]
            + ([("MessageGroupId", s.group)] if s.group is not None else [])
        )
        for s in sent
    ]
    if not batch:
        return _document("Message", items[0])
    return _document("Messages", "".join(f"<Message>{i}</Message>" for i in items))


def change_visibility_xml(handle: str, next_visible_time: float) -> bytes:
    """Build the ChangeMessageVisibility ``<ChangeVisibility>`` answer."""
    return _document(
        "ChangeVisibility",
        _elements([("ReceiptHandle", handle), ("NextVisibleTime", _ms(next_visible_time))]),
    )


def batch_delete_errors_xml(failures: Sequence[tuple[str, MnsError]]) -> bytes:
    """Build BatchDeleteMessage's per-handle ``<Errors>`` body."""
    items = "".join(
        "<Error>"
        + _elements([("ErrorCode", e.code), ("ErrorMessage", e.message), ("ReceiptHandle", handle)])
        + "</Error>"
        for handle, e in failures
    )
    return _document("Errors", items)


def queue_xml(info: QueueInfo) -> bytes:
    """Build the GetQueueAttributes ``<Queue>`` body."""
    attrs: Mapping[str, int] = info.attributes
    pairs = [
        ("QueueName", info.name),
        ("CreateTime", str(int(info.create_time))),
        ("LastModifyTime", str(int(info.last_modify_time))),
        ("VisibilityTimeout", str(attrs["VisibilityTimeout"])),
        ("MaximumMessageSize", str(attrs["MaximumMessageSize"])),
        ("MessageRetentionPeriod", str(attrs["MessageRetentionPeriod"])),
        ("DelaySeconds", str(attrs["DelaySeconds"])),
        ("PollingWaitSeconds", str(attrs["PollingWaitSeconds"])),
        ("ActiveMessages", str(info.active_messages)),
        ("InactiveMessages", str(info.inactive_messages)),
        ("DelayMessages", str(info.delay_messages)),
        ("LoggingEnabled", "True" if info.logging_enabled else "False"),
    ]
    return _document("Queue", _elements(pairs))


def queues_xml(
    base_url: str, infos: Sequence[QueueInfo], next_marker: str, with_meta: bool
) -> bytes:
    """Build the ListQueue ``<Queues>`` body.

    Parameters:
        base_url: ``http://host:port`` used to form each QueueURL.
        infos: the queues to list.
        next_marker: the marker for the next page, or "".
        with_meta: include each queue's attributes (``x-mns-with-meta``).
    """
    items = []
    for info in infos:
        pairs = [("QueueURL", f"{base_url}/queues/{info.name}")]
        if with_meta:
            pairs += [
                ("QueueName", info.name),
                ("CreateTime", str(int(info.create_time))),
                ("LastModifyTime", str(int(info.last_modify_time))),
                ("VisibilityTimeout", str(info.attributes["VisibilityTimeout"])),
                ("MaximumMessageSize", str(info.attributes["MaximumMessageSize"])),
                ("MessageRetentionPeriod", str(info.attributes["MessageRetentionPeriod"])),
                ("DelaySeconds", str(info.attributes["DelaySeconds"])),
                ("PollingWaitSeconds", str(info.attributes["PollingWaitSeconds"])),
                ("ActiveMessages", str(info.active_messages)),
                ("InactiveMessages", str(info.inactive_messages)),
                ("DelayMessages", str(info.delay_messages)),
            ]
        items.append(f"<Queue>{_elements(pairs)}</Queue>")
    marker = _elements([("NextMarker", next_marker)]) if next_marker else ""
    return _document("Queues", "".join(items) + marker)

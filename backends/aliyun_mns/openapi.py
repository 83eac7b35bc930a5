"""MNS's control-plane OpenAPI (``2022-01-19``), for what the XML API cannot do: ordered queues.

The data-plane XML API (``aliyun-mns-sdk``) has no way to create an ordered
(FIFO) queue or to ask a queue's type. The OpenAPI has: ``CreateQueue`` takes
``QueueType`` ("normal: standard queue. fifo: FIFO queue.") and
``GetQueueAttributes`` returns it (Alibaba's ``alibabacloud-mns-open20220119``,
the SDK used here). It is served at ``mns-open.<region>.aliyuncs.com`` — the SDK
forms that host from the region — or at an endpoint given explicitly (the MNS
emulator serves it on its own port).

Only the MNS driver (:mod:`leasekit.backends.aliyun_mns`) uses this module, and only for ordered
queues: creating one (``create=True``) and checking, once, that a queue opened
as ordered is a FIFO queue. It translates; the errors it lets through are the
SDK's (``AlibabaCloudException`` with MNS's ``code``, ``UnretryableException``
for a network failure), classified by the driver.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

__all__ = ["ControlPlane", "Keys"]

#: ``(access_key_id, access_key_secret, security_token)``; the token is "" without STS.
Keys = tuple[str, str, str]


class ControlPlane:
    """Calls to the MNS OpenAPI for one account, with the driver's credentials and timeouts.

    Parameters
    ----------
        endpoint: ``http(s)://HOST[:PORT]`` of the OpenAPI, or ``None`` to let the SDK
            form ``mns-open.<region>.aliyuncs.com`` from ``region``.
        region: the region id (``cn-hangzhou``); needed when ``endpoint`` is ``None``.
        keys: returns the current credentials (called for every request, so rotated
            STS credentials are picked up).
        connect_timeout: seconds to open a connection.
        read_timeout: seconds to wait for an answer.

    No network call is made until a method is called. Secrets are never part of a
    repr or an error message from here.
    """

    def __init__(
        self,
        endpoint: str | None,
        region: str | None,
        keys: Callable[[], Keys],
        connect_timeout: float,
        read_timeout: float,
    ) -> None:
        if endpoint is None and region is None:
            raise ValueError("aliyun-mns: the OpenAPI needs an endpoint or a region")
        self._endpoint = endpoint
        self._region = region
        self._keys = keys
        self._connect_ms = max(1, round(connect_timeout * 1000))
        self._read_ms = max(1, round(read_timeout * 1000))

    def __repr__(self) -> str:
        where = self._endpoint or f"mns-open.{self._region}.aliyuncs.com"
        return f"<ControlPlane {where}>"

    def _client(self) -> Any:
        from alibabacloud_mns_open20220119.client import Client
        from alibabacloud_tea_openapi.models import Config

        key_id, secret, token = self._keys()
        config = Config(
            access_key_id=key_id,
            access_key_secret=secret,
            security_token=token or None,
            region_id=self._region,
            connect_timeout=self._connect_ms,
            read_timeout=self._read_ms,
        )
        if self._endpoint is not None:
            parts = urlsplit(self._endpoint)
            config.endpoint = parts.netloc
            config.protocol = parts.scheme
        return Client(config)

    def create_queue(self, name: str, queue_type: str) -> None:
        """``CreateQueue`` with ``QueueType`` and MNS's default attributes.

        Raises the SDK's error (``QueueAlreadyExist`` when a different queue of that
        name exists).
        """
        from alibabacloud_mns_open20220119.models import CreateQueueRequest

        self._client().create_queue(CreateQueueRequest(queue_name=name, queue_type=queue_type))

    def queue_type(self, name: str) -> str:
        """``GetQueueAttributes``' ``QueueType`` (``normal`` or ``fifo``)."""
        from alibabacloud_mns_open20220119.models import GetQueueAttributesRequest

        answer = self._client().get_queue_attributes(GetQueueAttributesRequest(queue_name=name))
        return str(answer.body.data.queue_type or "normal")

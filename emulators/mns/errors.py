# House docstring style uses "Parameters:"/"Returns:"/"Raises:" sections (STYLE.md 14), which
# ruff's unconfigured pydocstyle misreads as numpy sections.
"""MNS error codes as the emulator returns them.

Every failure the emulator reports is an :class:`MnsError`; the HTTP layer turns
it into MNS's XML error body::

    <Error xmlns="http://mns.aliyuncs.com/doc/v1/">
      <Code/><Message/><RequestId/><HostId/>
    </Error>

Codes and statuses follow Alibaba Cloud's "Error codes" page and the per-API
"Special Error" tables; the code names match the table the official Go SDK
(``aliyun-mns-go-sdk`` ``client.go``) maps. MNS documents no dedicated code for a
body over ``MaximumMessageSize``: such requests get the documented
``InvalidArgument`` ("The value of Element should between Low and High
seconds/bytes").
"""

from __future__ import annotations

__all__ = ["MnsError", "int_param"]


class MnsError(Exception):
    """Raised for any request MNS would refuse; carries the wire code and status.

    Parameters:
        code: the MNS error code, e.g. ``QueueNotExist``.
        status: the HTTP status MNS sends with that code.
        message: the human-readable text for the ``<Message>`` element.
    """

    def __init__(self, code: str, status: int, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.status = status
        self.message = message

    # Factories for the codes the emulator uses, so call sites cannot pair a code
    # with the wrong status.

    @classmethod
    def queue_not_exist(cls) -> MnsError:
        """Return ``QueueNotExist`` (404)."""
        return cls("QueueNotExist", 404, "The queue name you provided is not exist.")

    @classmethod
    def queue_already_exist(cls) -> MnsError:
        """Return ``QueueAlreadyExist`` (409): same name, different attributes."""
        return cls(
            "QueueAlreadyExist",
            409,
            "The queue you want to create is already exist with different attributes.",
        )

    @classmethod
    def message_not_exist(cls) -> MnsError:
        """Return ``MessageNotExist`` (404): empty queue, or stale/expired handle."""
        return cls("MessageNotExist", 404, "Message not exist.")

    @classmethod
    def receipt_handle_error(cls) -> MnsError:
        """Return ``ReceiptHandleError`` (400): a malformed receipt handle."""
        return cls("ReceiptHandleError", 400, "The receipt handle you provide is not valid.")

    @classmethod
    def invalid_argument(cls, message: str) -> MnsError:
        """Return ``InvalidArgument`` (400) with ``message``."""
        return cls("InvalidArgument", 400, message)

    @classmethod
    def out_of_range(cls, element: str, low: int, high: int, unit: str) -> MnsError:
        """Return the documented ``InvalidArgument`` for a value outside ``[low, high]``."""
        return cls.invalid_argument(
            f"The value of {element} should between {low} and {high} {unit}."
        )

    @classmethod
    def fifo_missing_message_group_id(cls) -> MnsError:
        """Return ``FifoMissingMessageGroupId``: a send without a group to an ordered queue.

        The code is documented ("若不携带MessageGroupId，将返回错误码
        FifoMissingMessageGroupId"); its status is not: 400, like MNS's other
        request errors, is the emulator's choice.
        """
        return cls(
            "FifoMissingMessageGroupId",
            400,
            "The queue is a FIFO queue: every message needs a MessageGroupId.",
        )

    @classmethod
    def malformed_xml(cls) -> MnsError:
        """Return ``MalformedXML`` (400)."""
        return cls("MalformedXML", 400, "The XML you provided was not well-formed.")


def int_param(raw: str | None, name: str) -> int | None:
    """A request parameter's integer value (``None`` if absent); InvalidArgument if not one."""
    if raw is None:
        return None
    try:
        return int(raw)
    except ValueError:
        raise MnsError.invalid_argument(f"The value of {name} must be an integer.") from None

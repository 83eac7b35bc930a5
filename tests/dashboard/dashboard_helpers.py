"""Helpers shared by the dashboard's tests."""

from __future__ import annotations

import re

import leasekit

CSRF = re.compile(r'name="csrf" value="([^"]+)"')
PLAN = re.compile(r'name="plan" value="([^"]+)"')


def dead_letter(queue: leasekit.Queue, bodies: list[bytes], reason: str = "boom") -> list[str]:
    """Send ``bodies`` and dead-letter each; return their ids in order."""
    ids = [queue.send(body) for body in bodies]
    left = set(ids)
    while left:
        for lease in queue.lease(max_messages=10, duration=30):
            lease.dead_letter(reason)
            left.discard(lease.message.id)
    return ids


def csrf_of(html: str) -> str:
    match = CSRF.search(html)
    assert match, "the page has no CSRF token"
    return match.group(1)

"""The dashboard over a network backend (Azurite) behind the fault proxy: down, then back."""

from __future__ import annotations

import pytest
from _fixtures.azurite import Azurite
from dashboard_helpers import csrf_of

import leasekit


@pytest.fixture
def azure_queue(azurite: Azurite, fault_proxy):
    proxy = fault_proxy(azurite.port)
    via = Azurite(host=proxy.host, port=proxy.port)
    queue = leasekit.open(
        "azure-storage-queue",
        queue="dashboard-down",
        connection_string=via.connection_string,
        create=True,
        call_timeout=3,
    )
    try:
        yield queue, proxy, azurite.account_key
    finally:
        proxy.pass_()
        queue.delete_queue()
        queue.close()


def test_a_backend_that_goes_down_is_shown_and_the_page_recovers(azure_queue, make_client):
    queue, proxy, key = azure_queue
    queue.send(b"x")
    client, application = make_client([queue])
    dashboard = application.state.dashboard
    [row] = client.get("/api/queues").json()["queues"]
    assert row["counts"]["total"] == 1
    assert row["counts"]["visible"] is None and "visible" in row["not_reported"]
    queue.send(b"y")
    dashboard.sample_now()
    [row] = client.get("/api/queues").json()["queues"]
    assert row["charted"] == "total" and row["history"][-2:] == [1, 2]  # charted: all it tells
    assert row["rate_per_s"] > 0
    assert "not reported" in client.get("/").text

    proxy.drop()
    dashboard.sample_now()
    [row] = client.get("/api/queues").json()["queues"]
    assert row["error"], row
    page = client.get("/queues/dashboard-down")
    assert page.status_code == 200 and 'id="backend-error"' in page.text
    letters = client.get("/queues/dashboard-down/dead-letters")
    assert letters.status_code == 503 and "not answering" in letters.text
    for text in (page.text, letters.text, str(row), client.get("/api/queues").text):
        assert key not in text and "AccountKey" not in text and "Traceback" not in text

    proxy.pass_()
    dashboard.sample_now()
    [row] = client.get("/api/queues").json()["queues"]
    assert row["error"] is None and row["counts"]["total"] == 2
    assert 'id="backend-error"' not in client.get("/queues/dashboard-down").text


def test_browse_peeks_for_free_on_azure_storage_queue(azure_queue, make_client):
    queue, _proxy, _key = azure_queue
    queue.send(b'{"peek": "me"}')
    client, _ = make_client([queue])
    page = client.get("/queues/dashboard-down/browse").text
    assert 'id="peek-cost">free<' in page
    peeked = client.post("/queues/dashboard-down/peek", data={"csrf": csrf_of(page), "count": "3"})
    assert peeked.status_code == 200 and "&#34;peek&#34;: &#34;me&#34;" in peeked.text
    assert queue.stats().total == 1
    [lease] = queue.lease(duration=30)
    assert lease.message.delivery_count == 1  # looking did not count as a delivery
    lease.complete()


def test_a_poison_queue_cannot_page_its_dead_letters_and_pages_fall_back(azure_queue, make_client):
    queue, _proxy, _key = azure_queue
    with pytest.raises(leasekit.UnsupportedOperation, match="cannot page"):
        queue.peek_dead_letters(5, after="some-id")
    for i in range(3):
        queue.send(f"m{i}".encode())
    left = 3
    while left:
        for lease in queue.lease(max_messages=3, duration=30):
            lease.dead_letter("boom")
            left -= 1
    client, _ = make_client([queue])
    first = client.get("/api/queues/dashboard-down/dead-letters?size=2").json()
    second = client.get(
        f"/api/queues/dashboard-down/dead-letters?size=2&cursor={first['next_cursor']}"
    ).json()
    assert len(first["letters"]) == 2 and len(second["letters"]) == 1
    assert second["scanned"] == 3  # from the oldest again: this store has no cursor

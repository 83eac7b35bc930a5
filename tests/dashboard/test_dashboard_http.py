"""The dashboard over HTTP (starlette's TestClient): every page, the security rules, bad input."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from dashboard_helpers import PLAN, csrf_of, dead_letter
from starlette.applications import Starlette
from starlette.routing import Mount
from starlette.testclient import TestClient

import leasekit
from leasekit.dashboard import app
from leasekit.dashboard._sampler import Sampler
from leasekit.health import Health, HealthServer
from leasekit.lease_report import LeaseReporter

PAGES = [
    "/",
    "/queues/orders",
    "/queues/orders/dead-letters",
    "/queues/orders/redrive",
    "/queues/orders/redrive?dry_run=1",
    "/queues/orders/browse",
    "/leases",
    "/capabilities",
    "/api/queues",
    "/api/queues/orders/dead-letters",
    "/api/leases",
    "/api/capabilities",
]
INLINE_SCRIPT = re.compile(r"<script(?![^>]*\bsrc=)[^>]*>", re.I)
EVENT_HANDLER = re.compile(r"<[^>]+\son[a-z]+\s*=", re.I)


@pytest.mark.parametrize("backend", ["sqlite", "memory"])
def test_every_page_answers_with_a_strict_csp_and_no_inline_script(
    backend: str, sqlite_url: str, make_client
) -> None:
    url = sqlite_url if backend == "sqlite" else "memory://orders"
    with leasekit.open(url, create=True) as queue:
        queue.send(b"hello")
        dead_letter(queue, [b'{"a": 1}'])
        client, _ = make_client([queue])
        for path in PAGES:
            response = client.get(path)
            assert response.status_code == 200, (path, response.text[:300])
            csp = response.headers["content-security-policy"]
            assert "script-src 'self'" in csp and "unsafe-inline" not in csp
            assert "frame-ancestors 'none'" in csp
            assert response.headers["x-content-type-options"] == "nosniff"
            assert not INLINE_SCRIPT.search(response.text), path
            assert not EVENT_HANDLER.search(response.text), path


def test_the_queues_page_shows_counts_and_says_what_is_not_reported(orders, make_client) -> None:
    for _ in range(3):
        orders.send(b"x")
    client, _ = make_client([orders])
    data = client.get("/api/queues").json()["queues"][0]
    assert data["counts"]["visible"] == 3 and data["charted"] == "visible"
    assert data["counts"]["dead_lettered"] == 0
    # The oldest message's age where the backend reports it (this one does)...
    assert data["oldest_age"] is not None and 0 <= data["oldest_age"] < 60
    assert data["not_reported"] == []  # SQLite tells every count; see the test below
    assert "not reported" not in client.get("/").text


def test_the_oldest_message_age_is_not_reported_where_the_backend_cannot_tell(
    orders, make_client
) -> None:
    driver = orders.driver
    driver.capabilities = driver.capabilities.replace(reports_oldest_age=False)
    original = driver.stats
    driver.stats = lambda: dataclasses.replace(original(), oldest_age=None)  # type: ignore[method-assign]
    orders.send(b"x")
    client, _ = make_client([orders])
    data = client.get("/api/queues").json()["queues"][0]
    assert data["oldest_age"] is None and "reports_oldest_age" in data["oldest_age_why"]
    assert "not reported" in client.get(f"/queues/{data['id']}").text


def test_one_sampler_per_process_with_a_backend_minimum_interval(orders, make_client) -> None:
    _, first = make_client([orders], interval=0.01)
    _, second = make_client(["memory://other"], interval=0.01)
    assert first.state.dashboard.sampler is second.state.dashboard.sampler is Sampler.shared()
    assert first.state.dashboard.targets["orders"].interval == 1.0  # sqlite's minimum
    assert second.state.dashboard.targets["other"].interval == 0.5  # memory's minimum


# ----------------------------------------------------------------- security


def test_a_host_header_outside_the_allowlist_is_refused(orders) -> None:
    application = app([orders])  # default: loopback names only
    try:
        client = TestClient(application, base_url="http://evil.example")
        assert client.get("/").status_code == 400
        local = TestClient(application, base_url="http://127.0.0.1:8050")
        assert local.get("/").status_code == 200
    finally:
        application.state.dashboard.close()


def test_the_token_is_exchanged_for_an_httponly_samesite_cookie(orders, make_client) -> None:
    client, _ = make_client([orders], token="s3cret-token")
    assert client.get("/").status_code == 401
    assert client.get("/api/queues").status_code == 401
    assert client.get("/?token=wrong").status_code == 401
    response = client.get("/leases?token=s3cret-token")
    assert response.status_code == 303
    assert response.headers["location"] == "/leases"  # the token leaves the address bar
    cookie = response.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie
    assert "s3cret-token" not in cookie
    assert client.get("/").status_code == 200  # the cookie now opens every page
    assert "s3cret-token" not in client.get("/").text


def test_a_change_needs_the_csrf_token_and_the_same_origin(orders, make_client) -> None:
    client, _ = make_client([orders])
    csrf = csrf_of(client.get("/queues/orders/browse").text)
    form = {"body": "hi"}
    assert client.post("/queues/orders/send", data=form).status_code == 403
    assert client.post("/queues/orders/send", data={**form, "csrf": "x" * 64}).status_code == 403
    cross = client.post(
        "/queues/orders/send",
        data={**form, "csrf": csrf},
        headers={"Sec-Fetch-Site": "cross-site"},
    )
    assert cross.status_code == 403
    other = client.post(
        "/queues/orders/send",
        data={**form, "csrf": csrf},
        headers={"Origin": "http://evil.example"},
    )
    assert other.status_code == 403
    assert orders.stats().visible == 0
    ok = client.post(
        "/queues/orders/send",
        data={**form, "csrf": csrf},
        headers={"Sec-Fetch-Site": "same-origin", "Origin": "http://testserver"},
    )
    assert ok.status_code == 200 and 'id="sent"' in ok.text
    assert orders.stats().visible == 1


def test_no_change_is_made_by_a_get(orders, make_client) -> None:
    client, _ = make_client([orders])
    assert client.get("/queues/orders/send?body=x").status_code == 405
    assert client.get("/queues/orders/peek").status_code == 405
    assert orders.stats().visible == 0


def test_read_only_refuses_every_change_on_the_server(orders, make_client) -> None:
    dead_letter(orders, [b"a"])
    client, _ = make_client([orders], read_only=True)
    page = client.get("/queues/orders/redrive?dry_run=1").text
    assert re.search(r'id="confirm-redrive"[^>]*disabled', page)
    csrf = "unused"  # the pages still carry it, but read-only refuses before it is read
    plan = PLAN.search(page)
    assert plan is not None
    for path, form in [
        ("/queues/orders/redrive", {"plan": plan.group(1)}),
        ("/queues/orders/send", {"body": "x"}),
        ("/queues/orders/peek", {"count": "1"}),
    ]:
        response = client.post(path, data={**form, "csrf": csrf})
        assert response.status_code == 403, path
        assert "read-only" in response.text
    assert orders.stats().dead_lettered == 1 and orders.stats().visible == 0


def test_the_access_function_is_asked_on_every_request(orders, make_client) -> None:
    levels = {"/": "all"}

    def access(request) -> str:
        return request.headers.get("x-access", "forbidden")

    client, _ = make_client([orders], access=access)
    assert client.get("/").status_code == 403
    assert client.get("/", headers={"x-access": "read-only"}).status_code == 200
    csrf = csrf_of(client.get("/queues/orders/browse", headers={"x-access": "all"}).text)
    refused = client.post(
        "/queues/orders/send", data={"csrf": csrf, "body": "x"}, headers={"x-access": "read-only"}
    )
    assert refused.status_code == 403
    allowed = client.post(
        "/queues/orders/send", data={"csrf": csrf, "body": "x"}, headers={"x-access": "all"}
    )
    assert allowed.status_code == 200 and levels


def test_a_message_body_is_escaped_everywhere(orders, make_client) -> None:
    evil = b'<script>alert(1)</script><img src=x onerror="alert(2)">'
    dead_letter(orders, [evil], reason='<b onmouseover="x()">why</b>')
    orders.send(evil, properties={"<i>": "<svg onload=alert(3)>"})
    client, _ = make_client([orders])
    page = client.get("/queues/orders/dead-letters").text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "<script>alert" not in page and "<img src=x" not in page
    assert "<b onmouseover" not in page
    csrf = csrf_of(client.get("/queues/orders/browse").text)
    api = client.get("/api/queues/orders/dead-letters").json()
    assert api["letters"][0]["text"] == evil.decode()  # JSON carries it as data
    assert "<svg" not in client.get("/queues/orders/browse").text
    del csrf


def test_a_body_is_shown_as_text_json_and_hex_and_cut_with_its_size(orders, make_client) -> None:
    big = json.dumps({"items": list(range(2000))}).encode()
    dead_letter(orders, [big, b"\xff\xfe binary"])
    client, _ = make_client([orders])
    page = client.get("/queues/orders/dead-letters").text
    assert f"{len(big):,} bytes" in page and "text cut at 2,000 characters" in page
    assert "<summary>JSON</summary>" in page
    assert "ff fe 20 62 69 6e" in page  # the hex view
    assert "not UTF-8" in page


# --------------------------------------------------------------- dead letters


def test_dead_letters_page_by_signed_cursor_reading_no_more_than_needed(
    orders, make_client
) -> None:
    ids = dead_letter(orders, [f"m{i}".encode() for i in range(45)])
    client, _ = make_client([orders])
    first = client.get("/api/queues/orders/dead-letters?size=20").json()
    assert [dl["id"] for dl in first["letters"]] == ids[:20]
    assert first["scanned"] == 21  # a page and one more, to know there is a next
    second = client.get(
        f"/api/queues/orders/dead-letters?size=20&cursor={first['next_cursor']}"
    ).json()
    assert [dl["id"] for dl in second["letters"]] == ids[20:40]
    assert second["scanned"] == 21  # from where page 1 ended, not from the oldest
    third = client.get(
        f"/api/queues/orders/dead-letters?size=20&cursor={second['next_cursor']}"
    ).json()
    assert [dl["id"] for dl in third["letters"]] == ids[40:]
    assert third["next_cursor"] is None and third["scanned"] == 5


def test_a_filter_searches_on_page_by_page_past_the_scan_bound(
    orders, make_client, monkeypatch
) -> None:
    from leasekit.dashboard import _app

    monkeypatch.setattr(_app, "MAX_SCAN", 50)
    dead_letter(orders, [b"old"] * 120, reason="timeout")
    wanted = dead_letter(orders, [b"new"] * 3, reason="bad json")
    client, _ = make_client([orders])
    seen: list[str] = []
    url = "/api/queues/orders/dead-letters?reason=json&size=10"
    for _ in range(5):
        page = client.get(url).json()
        assert page["scanned"] <= 50
        seen += [dl["id"] for dl in page["letters"]]
        if page["next_cursor"] is None:
            break
        url = f"/api/queues/orders/dead-letters?reason=json&size=10&cursor={page['next_cursor']}"
    assert seen == wanted
    html = client.get("/queues/orders/dead-letters?reason=json&size=10").text
    assert "the next page goes on from there" in html


def test_a_cursor_past_a_dead_letter_that_was_redriven_says_start_again(
    orders, make_client
) -> None:
    dead_letter(orders, [b"a", b"b", b"c"])
    client, _ = make_client([orders])
    cursor = client.get("/api/queues/orders/dead-letters?size=1").json()["next_cursor"]
    assert orders.redrive() == 3
    response = client.get(f"/queues/orders/dead-letters?size=1&cursor={cursor}")
    assert response.status_code == 400 and "read from the oldest again" in response.text


def test_dead_letters_filter_by_reason_and_age(orders, make_client) -> None:
    dead_letter(orders, [b"a", b"b"], reason="timeout talking to billing")
    dead_letter(orders, [b"c"], reason="bad json")
    client, _ = make_client([orders])
    page = client.get("/api/queues/orders/dead-letters?reason=TIMEOUT").json()
    assert len(page["letters"]) == 2
    assert client.get("/api/queues/orders/dead-letters?older_than=1d").json()["letters"] == []
    assert len(client.get("/api/queues/orders/dead-letters?older_than=0s").json()["letters"]) == 3


@pytest.mark.parametrize(
    ("query", "why"),
    [
        ("cursor=abc.def", "not valid here"),
        ("older_than=yesterday", "older than takes"),
        ("size=0", "size takes"),
        ("size=100000", "size takes"),
        ("reason=" + "x" * 300, "at most 200"),
    ],
)
def test_bad_dead_letter_parameters_get_a_400_page(orders, make_client, query, why) -> None:
    client, _ = make_client([orders])
    response = client.get(f"/queues/orders/dead-letters?{query}")
    assert response.status_code == 400
    assert why in response.text and "Traceback" not in response.text
    assert client.get(f"/api/queues/orders/dead-letters?{query}").json()["error"]


def test_a_cursor_tampered_with_or_for_another_filter_is_refused(orders, make_client) -> None:
    dead_letter(orders, [f"m{i}".encode() for i in range(5)])
    client, _ = make_client([orders])
    cursor = client.get("/api/queues/orders/dead-letters?size=2").json()["next_cursor"]
    data, mac = cursor.split(".")
    flipped = data[:-2] + ("A" if data[-2] != "A" else "B") + data[-1]
    assert client.get(f"/queues/orders/dead-letters?size=2&cursor={flipped}.{mac}").status_code == (
        400
    )
    other = client.get(f"/queues/orders/dead-letters?size=2&reason=x&cursor={cursor}")
    assert other.status_code == 400 and "another queue or filter" in other.text


def test_an_unknown_queue_gets_a_404_page(orders, make_client) -> None:
    client, _ = make_client([orders])
    for path in ["/queues/nope", "/queues/nope/dead-letters", "/queues/nope/redrive"]:
        response = client.get(path)
        assert response.status_code == 404 and "no queue &#39;nope&#39;" in response.text
    assert client.get("/api/queues/nope/dead-letters").json() == {
        "error": "no queue 'nope' on this dashboard"
    }


# ------------------------------------------------------------------- redrive


def _redrive(client: TestClient, query: str = "") -> tuple[str, str]:
    page = client.get(f"/queues/orders/redrive?dry_run=1&{query}").text
    plan = PLAN.search(page)
    assert plan, page
    return plan.group(1), csrf_of(page)


def _wait_job(client: TestClient, location: str) -> dict:
    job_id = location.rsplit("/", 1)[1]
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        job = client.get(f"/api/jobs/{job_id}").json()
        if job["state"] != "running":
            return job
        time.sleep(0.05)
    raise AssertionError("the redrive did not end")


def test_redrive_moves_exactly_what_the_dry_run_counted(orders, make_client) -> None:
    counted = dead_letter(orders, [b"a", b"b", b"c"], reason="boom")
    client, _ = make_client([orders])
    page = client.get("/queues/orders/redrive?dry_run=1").text
    assert "<b>3</b> dead letter(s) match" in page
    plan, csrf = _redrive(client)
    later = dead_letter(orders, [b"d", b"e"], reason="boom")  # arrive after the count
    response = client.post("/queues/orders/redrive", data={"plan": plan, "csrf": csrf})
    assert response.status_code == 303
    job = _wait_job(client, response.headers["location"])
    assert job == {"state": "done", "counted": 3, "moved": 3, "failures": []}
    left = {dl.id for dl in orders.peek_dead_letters(10)}
    assert left == set(later) and not left & set(counted)
    assert (
        client.post("/queues/orders/redrive", data={"plan": plan, "csrf": csrf}).status_code == 400
    )  # a plan is used once


def test_redrive_lists_what_it_could_not_move(orders, make_client) -> None:
    dead_letter(orders, [b"a", b"b"], reason="boom")
    client, _ = make_client([orders])
    plan, csrf = _redrive(client)
    assert orders.redrive(1) == 1  # someone else moves one meanwhile
    response = client.post("/queues/orders/redrive", data={"plan": plan, "csrf": csrf})
    job = _wait_job(client, response.headers["location"])
    assert job["moved"] == 1 and len(job["failures"]) == 1
    assert "no longer a dead letter" in job["failures"][0]["why"]
    page = client.get(response.headers["location"]).text
    assert "Not moved (1)" in page


def test_a_redrive_with_nothing_to_move_says_so(orders, make_client) -> None:
    client, _ = make_client([orders])
    page = client.get("/queues/orders/redrive?dry_run=1").text
    assert "<b>0</b> dead letter(s) match" in page and 'id="nothing-to-redrive"' in page
    csrf = csrf_of(client.get("/queues/orders/browse").text)
    response = client.post("/queues/orders/redrive", data={"plan": "made-up", "csrf": csrf})
    assert response.status_code == 400 and "unknown or expired" in response.text


# -------------------------------------------------------------- browse, send


def test_browse_says_what_looking_costs_and_peeks_only_on_a_click(orders, make_client) -> None:
    client, _ = make_client([orders])
    page = client.get("/queues/orders/browse").text
    assert 'id="peek-cost"' in page
    assert 'data-refresh="0"' in page  # never refreshed by itself
    # SQLite's driver has no peek: the page says so rather than guessing.
    assert 'id="cannot-peek"' in page


# ------------------------------------------------------------------- leases


def _healthy() -> Health:
    return Health(live=True, ready=True)


def test_consumers_report_lease_ids_and_timings_never_a_receipt(orders, make_client) -> None:
    reporter = LeaseReporter(consumer="worker-1").install()
    try:
        with HealthServer(_healthy, leases=reporter.snapshot) as server:
            orders.send(b"secret body")
            [lease] = orders.lease(duration=30)
            with urllib.request.urlopen(f"{server.url}/leases") as response:
                raw = json.loads(response.read())
            [row] = raw["leases"]
            assert row["message_id"] == lease.message.id
            assert 29 < row["time_left"] <= 30
            text = json.dumps(raw)
            assert lease.receipt not in text and "secret body" not in text
            client, _ = make_client([orders], consumers=[server.url])
            page = client.get("/leases").text
            assert lease.message.id in page and "worker-1" in page
            lease.complete()
    finally:
        reporter.uninstall()


def test_a_health_server_without_leases_answers_404_there(orders) -> None:
    with HealthServer(_healthy) as server:
        with pytest.raises(urllib.error.HTTPError) as caught:
            urllib.request.urlopen(f"{server.url}/leases")
        assert caught.value.code == 404


# -------------------------------------------------------------- mounting, CLI


def test_the_app_mounts_under_a_prefix(orders) -> None:
    dashboard = app([orders], allowed_hosts=["testserver"])
    try:
        host = Starlette(routes=[Mount("/ops/queues", dashboard)])
        client = TestClient(host)
        page = client.get("/ops/queues/")
        assert page.status_code == 200
        assert 'href="/ops/queues/queues/orders"' in page.text
        assert 'src="/ops/queues/static/dashboard.js"' in page.text
        assert client.get("/ops/queues/static/dashboard.css").status_code == 200
    finally:
        dashboard.state.dashboard.close()


def test_import_leasekit_imports_no_web_framework() -> None:
    code = (
        "import sys, leasekit, leasekit.cli; "
        "print([m for m in sys.modules if m.split('.')[0] in ('starlette', 'jinja2', 'uvicorn')])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_cli_refuses_no_token_on_another_address(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/x.db?queue=q"
    result = subprocess.run(
        [sys.executable, "-m", "leasekit", "dashboard", url, "--host", "0.0.0.0", "--no-token"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "--no-token is refused" in result.stderr


def test_requests_beyond_max_connections_get_a_503() -> None:
    import asyncio

    from leasekit.dashboard._guard import Guard, Settings

    release = asyncio.Event()

    async def slow(scope, receive, send) -> None:
        await release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    settings = Settings(
        secret=b"k" * 32,
        token=None,
        read_only=False,
        allowed_hosts=["testserver"],
        access=None,
        max_connections=2,
    )
    guard = Guard(slow, settings)
    scope = {
        "type": "http",
        "method": "GET",
        "path": "/",
        "query_string": b"",
        "headers": [(b"host", b"testserver")],
    }

    async def request() -> int:
        sent: list[dict] = []

        async def receive() -> dict:
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message: dict) -> None:
            sent.append(message)

        await guard(dict(scope), receive, send)
        return sent[0]["status"]

    async def main() -> list[int]:
        first = asyncio.create_task(request())
        second = asyncio.create_task(request())
        while guard.active < 2:  # both slow ones have their place
            await asyncio.sleep(0)
        third = await request()
        release.set()
        return [await first, await second, third]

    # On a thread of its own: a test session with a browser has an event loop running here.
    statuses: list[list[int]] = []
    runner = threading.Thread(target=lambda: statuses.append(asyncio.run(main())))
    runner.start()
    runner.join(30)
    assert statuses == [[200, 200, 503]]
    assert guard.active == 0


def test_the_capabilities_page_shows_why_a_button_does_not_work_and_the_matrix(
    orders, make_client, tmp_path: Path
) -> None:
    report = {
        "backend": "memory://",
        "properties": {
            "expiry and redelivery": {"result": "passed", "reason": ""},
            "expired receipt": {"result": "skipped", "reason": "<b>not</b> usable here"},
        },
        "backends": {
            "memory://": {
                "expiry and redelivery": {"result": "passed", "reason": ""},
                "expired receipt": {"result": "skipped", "reason": "<b>not</b> usable here"},
            }
        },
        "tests": [],
    }
    path = tmp_path / "matrix.json"
    path.write_text(json.dumps(report))
    client, _ = make_client([orders], conformance=[path])
    page = client.get("/capabilities").text
    assert "peek: no — the backend&#39;s driver cannot peek" in page
    assert "expiry and redelivery" in page and "&lt;b&gt;not&lt;/b&gt; usable here" in page
    api = client.get("/api/capabilities").json()
    assert api["queues"][0]["actions"]["peek"] == {
        "works": False,
        "why_not": "the backend's driver cannot peek",
    }
    assert api["conformance"][0]["backends"]["memory://"]["expired receipt"]["result"] == (
        "skipped"
    )
    path.write_text("not json")
    with pytest.raises(leasekit.InvalidArgument, match="cannot read the conformance report"):
        app([orders], conformance=[path])


def test_an_unwatched_dashboard_stops_sampling_until_the_next_request(orders, make_client) -> None:
    from leasekit.dashboard import _sampler

    _, application = make_client([orders])
    target = application.state.dashboard.targets["orders"]
    target.wanted_until = time.monotonic() - 1  # nobody looked for IDLE seconds
    deadline = time.monotonic() + 10
    while target.sampling:  # a sample in flight ends
        assert time.monotonic() < deadline
        time.sleep(0.01)
    before = len(target.samples)
    due = max(target.next_at, time.monotonic()) + 0.5
    while time.monotonic() < due:  # past its next due point: not sampled, nobody watches
        time.sleep(0.05)
    assert len(target.samples) == before
    TestClient(application).get("/")  # a look wakes it
    assert target.wanted_until > time.monotonic() + _sampler.IDLE - 5
    while len(target.samples) == before:
        assert time.monotonic() < deadline, "the sampler did not resume"
        time.sleep(0.02)


def test_a_test_message_too_large_gets_a_400_and_a_huge_form_a_413(make_client) -> None:
    from leasekit.dashboard._app import MAX_FORM, MAX_SEND

    with leasekit.open("memory://small", create=True) as queue:
        client, _ = make_client([queue])
        csrf = csrf_of(client.get("/queues/small/browse").text)
        response = client.post(
            "/queues/small/send", data={"csrf": csrf, "body": "x" * (MAX_SEND + 1)}
        )
        assert response.status_code == 400 and "at most 65,536 bytes" in response.text
        huge = client.post("/queues/small/send", data={"csrf": csrf, "body": "x" * MAX_FORM})
        assert huge.status_code == 413
        assert queue.stats().visible == 0


@pytest.mark.parametrize(
    ("queues", "kwargs", "words"),
    [
        ([], {}, "at least one queue"),
        ([42], {}, "a queue is a URL"),
        (["memory://a"], {"interval": 0}, "interval must be"),
        (["memory://a"], {"redrive_rate": -1}, "redrive_rate must be"),
        (["memory://a"], {"max_connections": 0}, "max_connections must be"),
        (["nosuch://a"], {}, "nosuch"),
    ],
)
def test_the_app_refuses_bad_arguments_up_front(queues, kwargs, words) -> None:
    with pytest.raises(leasekit.LeaseError, match=words):
        app(queues, **kwargs)


def test_the_cli_serves_on_loopback_and_prints_the_token_once(tmp_path: Path) -> None:
    import http.cookiejar
    import socket

    url = f"sqlite:///{tmp_path}/cli.db?queue=jobs"
    with leasekit.open(url, create=True) as queue:
        queue.send(b"x")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen(
        [sys.executable, "-m", "leasekit", "dashboard", url, "--port", str(port), "--read-only"],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stderr is not None
        line = server.stderr.readline()
        match = re.search(r"open (http://127\.0\.0\.1:\d+/\?token=(\S+))", line)
        assert match and "(read-only)" in line, line
        login, token = match.groups()
        jar = http.cookiejar.CookieJar()
        opener = urllib.request.build_opener(
            urllib.request.ProxyHandler({}), urllib.request.HTTPCookieProcessor(jar)
        )
        deadline = time.monotonic() + 20
        while True:
            try:
                with opener.open(login, timeout=5) as response:
                    page = response.read().decode()
                break
            except OSError:
                assert time.monotonic() < deadline, "the dashboard did not start"
                time.sleep(0.1)
        assert response.url == f"http://127.0.0.1:{port}/"  # redirected without the token
        assert ">jobs<" in page and token not in page
        assert [c.name for c in jar] == ["leasekit_dashboard"]
        with pytest.raises(urllib.error.HTTPError) as caught:
            urllib.request.build_opener(urllib.request.ProxyHandler({})).open(
                f"http://127.0.0.1:{port}/api/queues", timeout=5
            )
        assert caught.value.code == 401  # no cookie, no page
    finally:
        server.terminate()
        server.wait(10)
        assert server.stderr is not None
        rest = server.stderr.read()
    assert "token=" not in rest  # printed once, never logged again


def test_the_leases_page_lists_a_bounded_number_of_leases(make_client) -> None:
    from leasekit.dashboard._app import MAX_LEASE_ROWS

    reporter = LeaseReporter(consumer="busy").install()
    try:
        with (
            leasekit.open("memory://many", create=True) as queue,
            HealthServer(_healthy, leases=reporter.snapshot) as server,
        ):
            queue.send_many([b"x"] * (MAX_LEASE_ROWS + 100))
            leases = queue.lease(max_messages=MAX_LEASE_ROWS + 100, duration=60)
            assert len(leases) == MAX_LEASE_ROWS + 100
            client, _ = make_client([queue], consumers=[server.url])
            data = client.get("/api/leases").json()
            assert len(data["leases"]) == MAX_LEASE_ROWS and data["leases_not_listed"] == 100
            page = client.get("/leases").text
            assert page.count("<tr data-message=") == MAX_LEASE_ROWS
            assert "100 more lease(s) held, not listed" in page
            queue.complete_many(leases)
    finally:
        reporter.uninstall()


def test_the_token_login_works_under_a_prefix(orders) -> None:
    dashboard = app([orders], allowed_hosts=["testserver"], token="t0ken")
    try:
        client = TestClient(Starlette(routes=[Mount("/ops", dashboard)]), follow_redirects=False)
        assert client.get("/ops/").status_code == 401
        login = client.get("/ops/leases?token=t0ken")
        assert login.status_code == 303 and login.headers["location"] == "/ops/leases"
        assert "Path=/ops" in login.headers["set-cookie"]
        page = client.get("/ops/")
        assert page.status_code == 200 and 'href="/ops/leases"' in page.text
        csrf = csrf_of(client.get("/ops/queues/orders/browse").text)
        sent = client.post(
            "/ops/queues/orders/send",
            data={"csrf": csrf, "body": "x"},
            headers={"Origin": "http://testserver"},
        )
        assert sent.status_code == 200 and orders.stats().visible == 1
    finally:
        dashboard.state.dashboard.close()

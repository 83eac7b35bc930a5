"""The dashboard in a real browser: Debian's Chromium, headless, driven by Playwright.

One browser for the module (not the session: see the ``browser`` fixture); each
test opens a new page with no cookie from another.
The app runs under uvicorn on a free loopback port, as ``leasekit dashboard``
runs it. Screenshots go to ``$LEASEKIT_DASHBOARD_SCREENSHOTS`` when set (the
docs' images: ``LEASEKIT_DASHBOARD_SCREENSHOTS=docs/img``), else to a temporary
directory.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from dashboard_helpers import dead_letter

CHROMIUM = "/usr/bin/chromium"
if not os.path.exists(CHROMIUM):
    pytest.skip(
        f"{CHROMIUM} is absent (apt-get install chromium; tools/install-system-packages.sh)",
        allow_module_level=True,
    )
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
uvicorn = pytest.importorskip("uvicorn", reason="the dashboard extra is not installed")

from leasekit.dashboard import app  # noqa: E402

ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
TOKEN = "browser-test-token"
WIDE = {"width": 1280, "height": 800}
NARROW = {"width": 390, "height": 844}


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """One headless Chromium for these tests, with a fresh user data dir.

    Module-scoped, not session-scoped: while Playwright's sync API is open, its
    event loop runs on the main thread, and every later ``asyncio.run()`` in the
    session would fail. Stopped after this module's tests, it leaves none behind.
    """
    with (
        tempfile.TemporaryDirectory(prefix="leasekit-chromium-") as profile,
        sync_api.sync_playwright() as playwright,
    ):
        context = playwright.chromium.launch_persistent_context(
            profile, executable_path=CHROMIUM, headless=True, args=ARGS, viewport=WIDE
        )
        try:
            yield context
        finally:
            context.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    """A new page with no cookie from another test."""
    browser.clear_cookies()
    page = browser.new_page()
    page.set_viewport_size(WIDE)
    page.set_default_timeout(15_000)
    try:
        yield page
    finally:
        page.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


Serve = Callable[..., str]


@pytest.fixture
def serve() -> Iterator[Serve]:
    """``serve(queues, **app_kwargs)`` -> the base URL of the app under uvicorn (with a token)."""
    servers: list[tuple[Any, threading.Thread, Any]] = []

    def start(queues: Any, **kwargs: Any) -> str:
        port = _free_port()
        kwargs.setdefault("token", TOKEN)
        application = app(queues, **kwargs)
        config = uvicorn.Config(
            application, host="127.0.0.1", port=port, log_level="warning", lifespan="on"
        )
        server = uvicorn.Server(config)
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        deadline = time.monotonic() + 10
        while not server.started:
            assert time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.02)
        servers.append((server, thread, application))
        return f"http://127.0.0.1:{port}"

    yield start
    for server, thread, application in servers:
        server.should_exit = True
        thread.join(10)
        application.state.dashboard.close()


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    where = os.environ.get("LEASEKIT_DASHBOARD_SCREENSHOTS")
    path = Path(where) if where else tmp_path
    path.mkdir(parents=True, exist_ok=True)
    return path


def login(page: Any, base: str, path: str = "/") -> None:
    page.goto(f"{base}{path}{'&' if '?' in path else '?'}token={TOKEN}")


def test_a_queue_backing_up_shows_in_the_counts(page, serve, orders, shots) -> None:
    base = serve([orders])
    login(page, base)
    cell = page.locator('tr[data-queue="orders"] td[data-count="visible"]')
    sync_api.expect(cell).to_have_text("0")
    for i in range(7):
        orders.send(f"job {i}".encode())
    # No reload: the page's script re-reads it every 2 s, the sampler every 1 s.
    sync_api.expect(cell).to_have_text("7", timeout=15_000)
    row = page.locator('tr[data-queue="orders"]')
    sync_api.expect(row.locator("svg.chart:not(.rate)")).to_be_visible(timeout=15_000)
    sync_api.expect(row.locator("svg.chart.rate")).to_be_visible(timeout=15_000)
    page.screenshot(path=str(shots / "dashboard-queues.png"))


CONSUMER = textwrap.dedent(
    """
    import sys, time, leasekit
    from leasekit.health import Health, HealthServer
    from leasekit.lease_report import LeaseReporter

    url, port = sys.argv[1], int(sys.argv[2])
    reporter = LeaseReporter(consumer="worker-a").install()
    queue = leasekit.open(url)

    def handle(message):
        print("handling", message.id, flush=True)
        time.sleep(3600)

    consumer = leasekit.Consumer(queue, handle, lease_duration=3)
    with HealthServer(consumer, port=port, leases=reporter.snapshot):
        print("ready", flush=True)
        consumer.run()
    """
)


def test_a_lease_shows_its_time_left_then_its_loss_once_its_consumer_freezes(
    page, serve, orders, sqlite_url, shots
) -> None:
    port = _free_port()
    message_id = orders.send(b"slow job")
    worker = subprocess.Popen(
        [sys.executable, "-c", CONSUMER, sqlite_url, str(port)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert worker.stdout is not None
        assert worker.stdout.readline().strip() == "ready"
        assert worker.stdout.readline().split() == ["handling", message_id]
        base = serve([orders], consumers=[f"http://127.0.0.1:{port}"])
        login(page, base, "/leases")
        row = page.locator(f'#leases tr[data-message="{message_id}"]')
        sync_api.expect(row.locator(".status")).to_have_text("held", timeout=15_000)
        time_left = re.compile(r"^\d+ ms$|^[0-3]\.\d s$")
        sync_api.expect(row.locator(".time-left")).to_have_text(time_left)
        sync_api.expect(row.locator("td").nth(5)).not_to_have_text("0", timeout=15_000)  # renewed
        page.screenshot(path=str(shots / "dashboard-leases.png"))
        worker.send_signal(signal.SIGSTOP)  # frozen: no renewal, no answer
        sync_api.expect(row.locator(".status")).to_have_text(
            "lost (its consumer stopped answering and the lease ended)", timeout=20_000
        )
        timeline = page.locator(f'section.timeline[data-message="{message_id}"]')
        sync_api.expect(timeline.locator("li.ev-lost")).to_contain_text("stopped answering")
        worker.send_signal(signal.SIGCONT)  # it wakes up and finds its lease lost
        # Its own report replaces the dashboard's guess: leased, renewed, lost and why.
        sync_api.expect(timeline.locator("li.ev-leased")).to_contain_text(
            "worker-a", timeout=20_000
        )
        sync_api.expect(timeline.locator("li.ev-renewed")).to_be_visible()
        sync_api.expect(timeline.locator("li.ev-lost")).not_to_contain_text("seen by the dashboard")
        page.screenshot(path=str(shots / "dashboard-lost-lease.png"))
    finally:
        worker.send_signal(signal.SIGCONT)
        worker.kill()
        worker.wait(10)


def test_a_dead_letter_is_inspected_and_redriven_after_a_dry_run(page, serve, orders, shots):
    [letter] = dead_letter(orders, [b'{"order": 42, "note": "card declined"}'], reason="declined")
    dead_letter(orders, [b"other"], reason="timeout")
    base = serve([orders])
    login(page, base, "/queues/orders/dead-letters")
    page.fill('input[name="reason"]', "declined")
    page.click('form.filter button[type="submit"]')
    article = page.locator(f'article.letter[data-id="{letter}"]')
    sync_api.expect(article.locator(".reason")).to_have_text("declined")
    article.locator("summary", has_text="JSON").click()
    sync_api.expect(article.locator("pre.json")).to_contain_text('"order": 42')
    article.locator("summary", has_text="hex").click()
    sync_api.expect(article.locator("pre.hex")).to_contain_text("7b 22 6f 72")
    page.screenshot(path=str(shots / "dashboard-dead-letters.png"), full_page=True)
    page.click("text=Redrive these…")
    page.click("#dry-run")
    sync_api.expect(page.locator("#dry-run-count")).to_contain_text("1 dead letter(s) match")
    page.screenshot(path=str(shots / "dashboard-redrive.png"))
    page.click("#confirm-redrive")
    sync_api.expect(page.locator("#job-done")).to_have_text("All 1 moved back.", timeout=15_000)
    left = orders.peek_dead_letters(10)
    assert [dl.reason for dl in left] == ["timeout"]
    [back] = orders.lease(duration=30)
    assert back.message.body == b'{"order": 42, "note": "card declined"}'


EVIL = b'<script>window.__pwned = 1</script><img src=x onerror="window.__pwned = 2">'


def test_a_body_with_script_and_img_onerror_runs_nothing(page, serve, orders) -> None:
    dead_letter(orders, [EVIL], reason='<img src=y onerror="window.__pwned = 3">')
    base = serve([orders])
    dialogs: list[str] = []
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    login(page, base, "/queues/orders/dead-letters")
    sync_api.expect(page.locator("pre.text").first).to_have_text(EVIL.decode())
    page.wait_for_load_state("networkidle")
    assert page.evaluate("window.__pwned") is None
    assert page.locator("article.letter img").count() == 0
    assert page.locator("main script").count() == 0
    assert dialogs == []


def test_read_only_offers_no_enabled_change_and_the_server_refuses_it(
    page, serve, orders, shots
) -> None:
    dead_letter(orders, [b"a"])
    base = serve([orders], read_only=True)
    login(page, base, "/queues/orders/redrive?dry_run=1")
    sync_api.expect(page.locator("#read-only-badge")).to_be_visible()
    sync_api.expect(page.locator("#confirm-redrive")).to_be_disabled()
    for path in ["/queues/orders/redrive?dry_run=1", "/queues/orders/browse"]:
        page.goto(base + path)
        for button in page.locator('form[method="post"] button').all():
            sync_api.expect(button).to_be_disabled()
    page.screenshot(path=str(shots / "dashboard-read-only.png"))
    status = page.evaluate(
        """async () => {
            const csrf = document.querySelector('input[name=csrf]').value;
            const r = await fetch('/queues/orders/send', {method: 'POST',
                headers: {'Content-Type': 'application/x-www-form-urlencoded'},
                body: 'csrf=' + encodeURIComponent(csrf) + '&body=x'});
            return r.status;
        }"""
    )
    assert status == 403
    assert orders.stats().visible == 0 and orders.stats().dead_lettered == 1


@pytest.mark.parametrize("viewport", [WIDE, NARROW], ids=["1280x800", "390x844"])
def test_the_pages_fit_the_viewport(page, serve, orders, viewport, shots) -> None:
    dead_letter(orders, [b"x" * 3000], reason="a long body")
    orders.send(b"y")
    base = serve([orders])
    page.set_viewport_size(viewport)
    login(page, base)
    for path in [
        "/",
        "/queues/orders",
        "/queues/orders/dead-letters",
        "/queues/orders/redrive",
        "/queues/orders/browse",
        "/leases",
        "/capabilities",
    ]:
        page.goto(base + path)
        sync_api.expect(page.locator("h1")).to_be_visible()
        overflow = page.evaluate(
            "document.documentElement.scrollWidth - document.documentElement.clientWidth"
        )
        assert overflow <= 0, f"{path} is {overflow}px wider than {viewport['width']}px"
    if viewport is NARROW:
        page.goto(base + "/")
        page.screenshot(path=str(shots / "dashboard-queues-phone.png"))


def test_live_updates_pause_while_the_tab_is_hidden(page, serve, orders) -> None:
    base = serve([orders])
    login(page, base)
    refreshes: list[str] = []
    page.on("request", lambda r: refreshes.append(r.url) if r.resource_type == "fetch" else None)
    with page.expect_request(lambda r: r.resource_type == "fetch"):
        pass  # live: the page re-reads itself every 2 s
    page.evaluate(
        "Object.defineProperty(document, 'visibilityState', {get: () => 'hidden',"
        " configurable: true})"
    )
    refreshes.clear()
    page.wait_for_timeout(5000)  # two and a half refresh periods, hidden
    assert refreshes == []
    with page.expect_request(lambda r: r.resource_type == "fetch", timeout=5000):
        page.evaluate(
            "Object.defineProperty(document, 'visibilityState', {get: () => 'visible',"
            " configurable: true}); document.dispatchEvent(new Event('visibilitychange'))"
        )

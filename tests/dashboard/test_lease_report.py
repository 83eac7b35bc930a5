"""The consumers' side of the Leases page: LeaseReporter and ``consume --report-leases``."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import leasekit
from leasekit.lease_report import LeaseReporter


def test_a_lost_lease_gets_a_timeline_through_its_redelivery_and_settling() -> None:
    reporter = LeaseReporter(consumer="w").install()
    try:
        with leasekit.open("memory://report", create=True) as queue:
            queue.send(b"body that is never reported")
            [first] = queue.lease(duration=0.05)
            first.renew(0.05)
            snapshot = reporter.snapshot()
            [held] = snapshot["leases"]
            assert held["message_id"] == first.message.id and held["renewals"] == 1
            assert held["delivery_count"] == 1 and 0 < held["time_left"] <= 0.05
            deadline = time.monotonic() + 5
            again = []
            while not again:
                assert time.monotonic() < deadline, "the message did not come back"
                again = queue.lease(duration=30)
            assert first.expire() is not None  # found lost by core's clock
            again[0].complete()
        report = reporter.snapshot()
        assert report["leases"] == []
        [timeline] = report["timelines"]
        events = [e["event"] for e in timeline["events"]]  # in the order things happened
        assert events == ["leased", "renewed", "lost", "redelivered", "completed"]
        lost = next(e for e in timeline["events"] if e["event"] == "lost")
        assert "the lease ended" in lost["reason"]
        text = json.dumps(report)
        assert "never reported" not in text and first.receipt not in text
    finally:
        reporter.uninstall()


def test_an_uninstalled_reporter_hears_nothing() -> None:
    reporter = LeaseReporter().install()
    reporter.uninstall()
    with leasekit.open("memory://quiet", create=True) as queue:
        queue.send(b"x")
        [lease] = queue.lease(duration=30)
        assert reporter.snapshot()["leases"] == []
        lease.complete()


HANDLER = """
import time
def handle(message):
    time.sleep(3600)
"""


def test_consume_report_leases_serves_them_on_the_health_port(tmp_path: Path) -> None:
    (tmp_path / "slow_handler.py").write_text(HANDLER)
    url = f"sqlite:///{tmp_path}/q.db?queue=jobs"
    with leasekit.open(url, create=True) as queue:
        message_id = queue.send(b"x")
    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "leasekit",
            "consume",
            url,
            "--handler",
            "slow_handler:handle",
            "--health-port",
            "0",
            "--report-leases",
        ],
        cwd=tmp_path,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert worker.stderr is not None
        line = ""
        while "health:" not in line:
            line = worker.stderr.readline()
            assert line, "the consumer exited"
        match = re.search(r"leases: (http://\S+/leases)", line)
        assert match, line
        deadline = time.monotonic() + 10
        while True:
            with urllib.request.urlopen(match.group(1)) as response:
                report = json.loads(response.read())
            if report["leases"]:
                break
            assert time.monotonic() < deadline, report
            time.sleep(0.05)
        assert [row["message_id"] for row in report["leases"]] == [message_id]
    finally:
        worker.kill()
        worker.wait(10)


def test_consume_report_leases_needs_a_health_port(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/q.db?queue=jobs"
    result = subprocess.run(
        [sys.executable, "-m", "leasekit", "consume", url, "--handler", "x:y", "--report-leases"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2 and "--report-leases needs --health-port" in result.stderr

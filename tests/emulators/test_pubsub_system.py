"""google-cloud-pubsub's own system tests (``tests/system.py`` of its sdist) against the emulator.

Google's tests run unchanged, in three subprocesses (so that a parallel run
spreads their sleeps, up to a minute, over workers), in their gRPC variants,
against the session's emulator through ``PUBSUB_EMULATOR_HOST``.

Not run, and why:

* every ``rest`` variant: the client's REST transport does not honour
  ``PUBSUB_EMULATOR_HOST`` (it always speaks HTTPS to pubsub.googleapis.com);
  the emulator speaks gRPC only;
* ``TestBasicRBAC`` (5 tests): they need service-account keys with limited IAM
  roles from Google's Kokoro CI (``KOKORO_GFILE_DIR``) and a service that
  enforces IAM; the emulator has no identities. They skip themselves, and
  :func:`test_the_rbac_tests_skip_for_want_of_kokoro_service_accounts` checks that.

``google.auth.default()`` (the ``project`` fixture) is given a credentials file
of type ``authorized_user`` with made-up values and ``GOOGLE_CLOUD_PROJECT``: the
clients never use it (with ``PUBSUB_EMULATOR_HOST`` they send no credentials).
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow

#: Google's tests that run here, by node id within system.py, in three
#: subprocesses (each pays ~3 s of imports; the groups balance their sleeps).
SYSTEM_GROUPS = {
    "ack-deadline": ("TestStreamingPull::test_streaming_pull_ack_deadline",),  # waits 60 s
    "streaming": (
        "test_subscribe_to_messages_async_callbacks",
        "TestStreamingPull::test_streaming_pull_max_messages",
        "TestStreamingPull::test_streaming_pull_blocking_shutdown",
    ),
    "the-rest": (
        "test_publish_messages",
        "test_publish_large_messages",
        "test_subscribe_to_messages",
        "test_creating_subscriptions_with_non_default_settings",
        "test_listing_project_topics",
        "test_listing_project_subscriptions",
        "test_listing_topic_subscriptions",
        "test_managing_topic_iam_policy",
        "test_managing_subscription_iam_policy",
        "test_subscriber_not_leaking_open_sockets",
        "test_synchronous_pull_no_deadline_error_if_no_messages",
        "TestStreamingPull::test_streaming_pull_callback_error_propagation",
    ),
}
SYSTEM_TESTS = tuple(node for group in SYSTEM_GROUPS.values() for node in group)
#: The tests that need Google's CI service accounts (see the module docstring).
RBAC_TESTS = "TestBasicRBAC"


def _run(system: Any, server: Any, tmp_path: Path, *nodes: str) -> subprocess.CompletedProcess[str]:
    credentials = tmp_path / "made-up-authorized-user.json"
    credentials.write_text(
        json.dumps(
            {
                "type": "authorized_user",
                "client_id": "emulator",
                "client_secret": "emulator",
                "refresh_token": "emulator",
            }
        )
    )
    env = {
        **os.environ,
        "PUBSUB_EMULATOR_HOST": server.address,
        "GOOGLE_APPLICATION_CREDENTIALS": str(credentials),
        "GOOGLE_CLOUD_PROJECT": server.project,
        "PYTHONPATH": str(system.deps),
    }
    env.pop("KOKORO_GFILE_DIR", None)
    command = [
        sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
        # Hypothesis's plugin imports hypothesis at the end of the run, with the
        # client's threads still about; on CPython 3.11.7 that import's assertion
        # rewriting once failed ("AST constructor recursion depth mismatch", fixed
        # in later CPythons) after every test had passed. system.py uses none of it.
        "-p", "no:hypothesispytest",
        "-rA", *(f"{system.system_py}::{node}" for node in nodes), "-k", "not rest",
    ]  # fmt: skip
    return subprocess.run(
        command,
        cwd=system.system_py.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_every_test_in_system_py_is_run_or_named_with_why(pubsub_system_tests: Any) -> None:
    tree = ast.parse(pubsub_system_tests.system_py.read_text())
    found = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
            found.add(node.name)
        elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
            if node.name == RBAC_TESTS:
                found.add(node.name)
                continue
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name.startswith("test_"):
                    found.add(f"{node.name}::{item.name}")
    assert found == {*SYSTEM_TESTS, RBAC_TESTS}


@pytest.mark.parametrize("group", sorted(SYSTEM_GROUPS))
def test_google_system_tests_pass_on_the_emulator(
    pubsub_system_tests: Any, pubsub_server: Any, tmp_path: Path, group: str
) -> None:
    nodes = SYSTEM_GROUPS[group]
    done = _run(pubsub_system_tests, pubsub_server, tmp_path, *nodes)
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "failed" not in summary and "skipped" not in summary, summary
    passed = [line for line in done.stdout.splitlines() if line.startswith("PASSED ")]
    for node in nodes:  # each in its gRPC variant(s)
        assert any(f"::{node}[" in line for line in passed), f"{node} did not pass: {summary}"


def test_the_rbac_tests_skip_for_want_of_kokoro_service_accounts(
    pubsub_system_tests: Any, pubsub_server: Any, tmp_path: Path
) -> None:
    done = _run(pubsub_system_tests, pubsub_server, tmp_path, RBAC_TESTS)
    assert done.returncode == 0, done.stdout[-3000:]
    assert "5 skipped" in done.stdout and "Requires Kokoro environment" in done.stdout

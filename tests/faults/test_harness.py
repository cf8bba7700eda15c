"""The fault tests' own harness: a `serve` a test starts is one the clean-up kills, and a failed
test shows where each service still running was."""

from __future__ import annotations

import sys

import pytest

from pipeline.bus import Topics
from pipeline.bus.kafka import ensure_topics
from tests.faults import conftest
from tests.faults.factories import ServiceProc, wait_for, write_config


def test_the_clean_up_sees_every_service_a_test_starts(tmp_path):
    # pytest imports this directory's conftest.py under its own module name, the tests import it
    # as tests.faults.conftest: two module objects of one file. The services one registers must
    # be the ones the other's clean-up fixture kills, or a failed test leaves `serve` running.
    copies = [m for m in list(sys.modules.values()) if getattr(m, "__file__", None) == conftest.__file__]
    svc = ServiceProc(tmp_path / "svc.json", tmp_path / "svc.log")
    assert copies and all(svc in m._LIVE for m in copies)
    conftest._LIVE.remove(svc)


@pytest.mark.kafka
def test_a_failed_wait_shows_where_each_live_service_is(kafka_bootstrap, topic_prefix, tmp_path):
    # SIGUSR1 makes `serve` write every thread's stack (pipeline/stackdump.py) and go on: what a failed
    # test attaches for each service still running, so a replica stuck in a rebalance says where.
    ensure_topics(kafka_bootstrap, Topics(topic_prefix), partitions=4)
    svc = ServiceProc(write_config(tmp_path / "svc.json", kafka_bootstrap, topic_prefix), tmp_path / "svc.log")
    svc.start()
    wait_for(lambda: any("no checkpoint" in x.get("message", "") for x in svc.lines()), 90, what="an assignment")
    # The dump, taken while the service runs its loop: every thread, the pid, and the service
    # still running after it (a C-level dump of running threads once killed it here).
    stacks = conftest._stacks_of_live_services()
    assert "Current thread" in stacks or "Thread 0x" in stacks
    assert f"pid {svc.proc.pid}" in stacks and "most recent call first" in stacks
    assert "pipeline/service/" in stacks  # the loop's own frames, whole
    assert svc.alive()
    assert svc.term() == 0

"""The fault tests' own harness: a `serve` a test starts is one the clean-up kills."""

from __future__ import annotations

import sys

from tests.faults import conftest
from tests.faults.conftest import ServiceProc


def test_the_clean_up_sees_every_service_a_test_starts(tmp_path):
    # pytest imports this directory's conftest.py under its own module name, the tests import it
    # as tests.faults.conftest: two module objects of one file. The services one registers must
    # be the ones the other's clean-up fixture kills, or a failed test leaves `serve` running.
    copies = [m for m in list(sys.modules.values()) if getattr(m, "__file__", None) == conftest.__file__]
    svc = ServiceProc(tmp_path / "svc.json", tmp_path / "svc.log")
    assert copies and all(svc in m._LIVE for m in copies)
    conftest._LIVE.remove(svc)

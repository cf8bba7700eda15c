"""Fabric Manager log lines as real tools print them (#34), beyond test_producer_fabric_manager.py:
each layout here was once dropped or miscounted.

Origins:

- Fabric Manager's prefix is ``[%b %d %Y %H:%M:%S] [LEVEL] [tid N] `` and its levels are those of
  ``LOG_LEVEL`` in ``fabricmanager.cfg`` (CumulusNetworks/docs
  ``content/cumulus-netq-48/NVLink4/Edit-GFM-Variables.md`` @ ba64370c: "1 - Set log level to
  CRITICAL and above", then ERROR, WARNING, INFO): ``[CRITICAL]`` is printed, ``[FATAL]`` is not;
- a line without ``[tid N]``: leptonai/gpud
  ``components/accelerator/nvidia/fabric-manager/log_matcher_test.go`` @ 4a8de33a ("match topology
  mismatch from log file");
- ``Detected a trunk link failure event for partition Id N.`` at ``[WARNING]``: the NMX-C
  fabric-log analyser already cited in test_producer_fabric_manager.py (its line regex, beside
  ``Trunk port failure detected``).
"""

from __future__ import annotations

from pipeline.catalog import FIELDS
from producers.fabric_manager import FabricManagerLog, classify, parse_fm_line
from producers.kmsg import KmsgFileSource, parse_pci_map
from tests.unit.producers.kmsg_factories import PCI_MAP, write
from tests.unit.producers.fabric_manager_factories import CRITICAL, NO_TID, TRUNK_LINK


def val(rec, alias):
    return getattr(rec.fields, FIELDS.by_alias(alias).names[0])


def test_a_line_without_a_thread_id_is_a_message_not_a_continuation():
    line = parse_fm_line(NO_TID)
    assert line is not None and line.error is None and line.ts is not None
    assert line.msg == "[ERROR] " + NO_TID.split("] [ERROR] ", 1)[1]
    assert classify(line.msg)[0] == "fm_errors"
    # A thread field that is not one still costs its line, as before.
    assert parse_fm_line(NO_TID.replace("[ERROR] ", "[ERROR] [tid x] ")).error == "bad_timestamp"
    assert parse_fm_line("[Feb 30 2025 13:59:45] [INFO] multicast group 0 is freed.").error == "bad_timestamp"


def test_a_saved_log_counts_the_startup_error_without_a_thread_id(tmp_path):
    p = write(tmp_path, "fabricmanager.log", NO_TID + "\n")
    pci = parse_pci_map(PCI_MAP)
    src = KmsgFileSource(str(p), pci, host="n1", sample=False, log=FabricManagerLog(pci, host="n1"), parse=parse_fm_line)
    recs = src.poll()
    assert recs and {val(r, "fm_errors") for r in recs if r.labels} == {1}
    assert src.summary()["error_lines"] == 1


def test_a_critical_line_is_an_error():
    got = classify(parse_fm_line(CRITICAL).msg)
    assert got is not None and got[0] == "fm_errors" and got[1]["fm.level"] == "CRITICAL"
    assert FabricManagerLog({}, host="n1").wants(parse_fm_line(CRITICAL).msg)


def test_a_trunk_link_failure_event_is_an_nvlink_error():
    got = classify(parse_fm_line(TRUNK_LINK).msg)
    assert got is not None and got[0] == "fm_nvlink_errors"

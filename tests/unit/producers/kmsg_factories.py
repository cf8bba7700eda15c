"""Builders of kernel-log inputs for the kernel-log producer's tests: nvidia-smi's PCI map, XID and
SXid lines as the driver prints them (open-gpu-kernel-modules 595.45.04), dmesg logs, and a fake
/dev/kmsg reader."""

from __future__ import annotations

import os

from pipeline.catalog import FIELDS

# nvidia-smi --query-gpu=index,pci.bus_id --format=csv, as nvidia-smi prints it.
PCI_MAP = """index, pci.bus_id
0, 00000000:3B:00.0
1, 00000000:5E:00.0
2, 00000000:86:00.0
3, 00000000:AF:00.0
4, 00000000:D8:00.0
"""

XID_79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
XID_119 = (
    "NVRM: Xid (PCI:0000:5e:00): 119, pid=2103, name=python3, Timeout after 6s of waiting for RPC "
    "response from GPU1 GSP! Expected function 76 (GSP_RM_CONTROL) (0x20801348 0x4)."
)
XID_13 = (
    "NVRM: Xid (PCI:0000:86:00): 13, pid=5012, name=train.py, Graphics Exception: ESR 0x504648=0x102000e "
    "0x504650=0x0 0x504644=0xd3eff2 0x50464c=0x17f"
)
XID_94_MIG = (
    "NVRM: Xid (PCI:0000:af:00 GPU-I:05): 94, pid=7194, name=python, Contained: CE User Channel (0x9). "
    "RST: No, D-RST: No"
)
XID_31_OLD = "NVRM: Xid (0000:d8:00): 31, Ch 00000008, intr 00000000. MMU Fault: ENGINE GRAPHICS faulted"
XID_79_R4XX = "NVRM: Xid (PCI:0000:10:00): 79, pid=0, GPU has fallen off the bus."  # pid, no name
XID_UNMAPPED = (
    "NVRM: Xid (PCI:0000:99:00): 48, pid=88, name=x, An uncorrectable double bit error (DBE) has been detected"
)
SXID_NONFATAL = (
    "nvidia-nvswitch2: SXid (PCI:0000:c1:00.0): 12028, Non-fatal, Link 44 egress non-posted PRIV error (First)"
)
SXID_FATAL = "nvidia-nvswitch1: SXid (PCI:0000:07:00.0): 20034, Fatal, Link 30 LTSSM Fault Up"

EVENTS = [XID_79, XID_119, XID_13, XID_94_MIG, XID_31_OLD, XID_UNMAPPED, SXID_NONFATAL, SXID_FATAL]


def dmesg(events, start=1000.0, step=2.0):
    """A dmesg log: boot noise, then the events ``step`` seconds apart."""
    lines = [
        "[    0.000000] Linux version 6.8.0-49-generic (buildd@lcy02-amd64-103) #49-Ubuntu SMP",
        "[   12.345678] nvidia: loading out-of-tree module taints kernel.",
        f"[{start - 1:12.6f}] NVRM: GPU at PCI:0000:3b:00: GPU-5c6ff2f3-8c5e-2f5b-3b67-6d0a3b1f2c11",
    ]
    lines += [f"[{start + i * step:12.6f}] {e}" for i, e in enumerate(events)]
    return "\n".join(lines) + "\n"


def write(tmp_path, name, text, mtime=None):
    p = tmp_path / name
    p.write_text(text)
    if mtime is not None:
        os.utime(p, (mtime, mtime))
    return p


XID = FIELDS.by_alias("xid")


def val(rec, f):
    return getattr(rec.fields, f.names[0])


class FakeReader:
    def __init__(self):
        self.batches = []

    def read(self):
        return self.batches.pop(0) if self.batches else []

    def close(self):
        pass


def produce_and_replay(tmp_path, lines, step, capsys) -> tuple[str, list[dict]]:
    """``gpuwarden produce kmsg --file`` of ``lines`` as a dmesg (the PCI map above, host n1, a
    fixed boot time), then ``gpuwarden replay`` of its records: the producer's exit summary
    (stderr) and the alerts that fired."""
    import json

    from pipeline.cli import main

    log = write(tmp_path, "dmesg.txt", dmesg(lines, step=step))
    pci = write(tmp_path, "pci.csv", PCI_MAP)
    out, alerts = tmp_path / "kmsg.jsonl", tmp_path / "alerts.jsonl"
    argv = ["produce", "kmsg", "--file", str(log), "--pci-map", str(pci), "--boot-time", "1800000000",
            "--host", "n1", "--out", str(out), "--interval", "10"]  # fmt: skip
    assert main(argv) == 0
    summary = capsys.readouterr().err
    assert main(["replay", str(out), "--alerts-out", str(alerts), "-q"]) == 0
    return summary, [a for a in map(json.loads, alerts.read_text().splitlines()) if a["state"] == "firing"]


def block(seq, *lines):
    """``lines`` as one GHES record ``{seq}`` prints them (ghes.c's ``{N}[Hardware Error]: ``)."""
    return [f"{{{seq}}}[Hardware Error]: {ln}" for ln in lines]


def lkml_record(seq, bdf="0000:60:03.1", drv="pcieport"):
    """A corrected firmware-first PCIe report as linux-kernel's 5.7 capture shows it (2020-06-27):
    the GHES record ``{seq}`` and the AER driver's print of it, for device ``bdf``."""
    cper = block(
        seq,
        "Hardware error from APEI Generic Hardware Error Source: 4",
        "It has been corrected by h/w and requires no further action",
        "event severity: corrected",
        " Error 0, type: corrected",
        " fru_text: PcieError",
        "  section_type: PCIe error",
        "  port_type: 4, root port",
        "  version: 0.2",
        "  command: 0x0407, status: 0x0010",
        f"  device_id: {bdf}",
        "  slot: 19",
        "  secondary_bus: 0x62",
        "  vendor_id: 0x1022, device_id: 0x1453",
        "  class_code: 060400",
        "  bridge: secondary_status: 0x2000, control: 0x0012",
    )
    return cper, lkml_print(bdf, drv)


def lkml_print(bdf="0000:60:03.1", drv="pcieport"):
    """``pci_print_aer()``'s lines of that corrected report."""
    return [
        f"{drv} {bdf}: AER: aer_status: 0x00001000, aer_mask: 0x00006000",
        f"{drv} {bdf}: AER:    [12] Timeout               ",
        f"{drv} {bdf}: AER: aer_layer=Data Link Layer, aer_agent=Transmitter ID",
    ]

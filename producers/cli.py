"""``gpuwarden produce SOURCE ...``: the producers for real clusters, one subcommand each."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
from typing import Any

from pipeline.argtypes import int_in, non_negative_float, port, positive_float, positive_int

log = logging.getLogger(__name__)

# Exit status: 0 done; 3 the input holds a critical finding (nccl-tests wrong results) or a file
# producer lost input (a poll raised, a counted drop that is not "no value", records not
# delivered, a gzip input cut or damaged); 4 the broker refused the login; 2 bad arguments or a source that cannot start.
FINDINGS_EXIT = 3


def _gpus_per_node(text: str) -> int:
    """GPUs of one node, 1..4096 (the decoder's GPU indices stop at 4095).

    >>> _gpus_per_node("8")
    8
    """
    return int_in(text, 1, 4096, "an integer 1..4096")


def _http_url(text: str) -> str:
    """An http(s)://host[:port]/... URL, the only kind a scrape can fetch.

    >>> _http_url("http://127.0.0.1:9400/metrics")
    'http://127.0.0.1:9400/metrics'
    """
    from producers.httpget import FetchError, _origin

    try:
        _origin(text)
    except FetchError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def _interval_paces(args: argparse.Namespace, from_file: bool) -> None:
    """``--interval 0`` polls without a pause: a usage error where nothing ends the run (a live
    source without ``--count``), which would otherwise spin a CPU and hammer the source."""
    if args.interval == 0 and args.count is None and not from_file:
        raise SystemExit(
            f"gpuwarden produce {args.source}: --interval 0 would poll without pause forever: "
            "give seconds > 0 (or --count N)"
        )


def _gzip_file(path: str) -> bool:
    """Whether ``path`` is a regular file that starts with gzip's magic (a FIFO is not looked at:
    reading its head would eat input)."""
    from producers.textinput import GZIP_MAGIC

    if not os.path.isfile(path):
        return False
    try:
        with open(path, "rb") as fh:
            return fh.read(2) == GZIP_MAGIC
    except OSError:
        return False  # the source's own open says why


def _input_is_there(args: argparse.Namespace) -> None:
    """A named input that is not there is the user's mistake, said once before anything starts
    (an --out file is made, a broker asked): file sources open it at their first poll, which
    would log a traceback and exit 3."""
    given = getattr(args, "file", None)
    for path in given if isinstance(given, list) else [given] if isinstance(given, str) else []:
        if path != "-" and not os.path.isfile(path):
            why = "not a file" if os.path.exists(path) else "no such file"
            raise SystemExit(f"gpuwarden produce {args.source}: cannot start: {path}: {why}")


def _sender(args: argparse.Namespace, backpressure: bool = False, check: Any = None) -> Any:
    from pipeline.bus import Topics, connection
    from pipeline.errors import BrokerUnavailableError
    from producers.common import BoundedSender, JsonlSink, KafkaSink

    if bool(args.out) == connection.wanted(args):
        raise SystemExit(
            f"gpuwarden produce {args.source}: give exactly one of --out FILE or "
            "--kafka BOOTSTRAP / --kafka-config FILE"
        )
    if args.buffer <= 0:
        raise SystemExit("gpuwarden produce: --buffer must be a positive number of records")
    if check is not None:
        check(args)
    if args.out:
        return BoundedSender(JsonlSink(args.out), max_records=args.buffer, backpressure=backpressure)
    conn = connection.from_args(args)
    # A broker that is down is an outage the buffer rides out; a refused login or TLS never
    # heals by waiting, so it stops the producer at once (exit 4, one line).
    refused = connection.login_refused(conn, timeout_s=max(args.send_timeout, 5.0))
    if refused:
        raise BrokerUnavailableError(refused)
    sink = KafkaSink(
        conn.bootstrap,
        Topics(args.prefix).telemetry,
        send_timeout_s=args.send_timeout,
        security=conn.options(),
        encoding=args.encoding,
    )
    return BoundedSender(sink, max_records=args.buffer, backpressure=backpressure)


def _run(args: argparse.Namespace, make_source: Any, *, from_file: bool = False) -> int:
    """Run a producer; ``from_file``: its input is a file, read to the end (back-pressure instead
    of dropping, and a non-zero exit when input was lost)."""
    from producers.common import (
        ProducerMetrics,
        RunResult,
        format_counts,
        install_stop_handlers,
        lost_input,
        run,
        serve_metrics,
        source_counts,
    )

    _interval_paces(args, from_file)
    if not getattr(args, "verbose", False):
        # The sender says when delivery fails and when it recovers; kafka-python's own connection
        # errors repeat at each retry (87 lines in 13 s with the broker down). -v shows them.
        logging.getLogger("kafka").setLevel(logging.CRITICAL)
    sender = _sender(args, backpressure=from_file, check=_input_is_there)
    try:
        source = make_source()
    except Exception as e:  # noqa: BLE001 - no NVML, no dcgmi, unreadable input: one clear line
        sender.close()
        raise SystemExit(f"gpuwarden produce {args.source}: cannot start: {e}") from e
    stop = threading.Event()
    res = RunResult()
    endpoint = None
    if getattr(args, "metrics_port", None) is not None:
        try:
            endpoint = serve_metrics(
                ProducerMetrics(args.source, source, sender, res), args.metrics_port, args.metrics_host
            )
        except OSError as e:
            source.close()
            sender.close()
            raise SystemExit(f"gpuwarden produce {args.source}: --metrics-port {args.metrics_port}: {e}") from e
        log.info("metrics on http://%s:%d/metrics", args.metrics_host, endpoint.port)
    restore = install_stop_handlers(stop, getattr(source, "interrupt", None))
    try:
        res = run(source, sender, interval_s=args.interval, stop=stop, max_polls=args.count, result=res)
    finally:
        restore()
        if endpoint is not None:
            endpoint.stop()
    s = res.sender
    print(
        f"gpuwarden produce {args.source}: {res.records} records read, {s.sent} delivered, "
        f"{s.dropped + s.too_large + s.unencodable} dropped unsent, {s.failures} failed sends, {res.poll_errors} failed polls",
        file=sys.stderr,
        flush=True,
    )
    counts = source_counts(source)
    if counts:
        print(f"gpuwarden produce {args.source}: " + format_counts(counts), file=sys.stderr, flush=True)
    # Findings (nccl-tests wrong results): the run "succeeded" at reading, but what it read is a fault.
    findings = getattr(getattr(source, "stats", None), "findings", None) or []
    for f in findings:
        print(f"gpuwarden produce {args.source}: CRITICAL {f.describe()}", file=sys.stderr, flush=True)
    lost = lost_input(source, res) if from_file else {}
    if lost:
        # A file read in part is not a success: scripts and CI must see it (exit 3).
        print(
            f"gpuwarden produce {args.source}: LOST input: {format_counts(lost)} (exit {FINDINGS_EXIT})",
            file=sys.stderr,
            flush=True,
        )
    # A file with text but not one line of the tool's output (the wrong file, an error page) is
    # no success either; an empty one, or a report that all is well, is (docs/producers.md).
    unread = from_file and getattr(source, "unrecognised", False) is True
    if unread:
        print(
            f"gpuwarden produce {args.source}: {getattr(source, 'path', args.file)}: not one line could be read "
            f"as {args.source} output (exit {FINDINGS_EXIT})",
            file=sys.stderr,
            flush=True,
        )
    return FINDINGS_EXIT if findings or lost or unread else 0


def _cmd_dcgm_exporter(args: argparse.Namespace) -> int:
    from producers.dcgm_exporter import ExporterSource

    if bool(args.url) == bool(args.file):
        raise SystemExit("gpuwarden produce dcgm-exporter: give exactly one of --url URL or --file FILE...")
    return _run(
        args,
        lambda: ExporterSource(args.url, files=args.file, timeout_s=args.timeout, host=args.host),
        from_file=bool(args.file),
    )


def _cmd_dcgmi(args: argparse.Namespace) -> int:
    from producers.dcgmi import DEFAULT_FIELD_IDS, DmonFileSource, DmonSource

    if args.file:
        if args.interval == 0:  # a saved log's rounds are --interval apart: 0 stamps them all at one time
            raise SystemExit("gpuwarden produce dcgmi: --file: --interval must be the -d the log was taken with (> 0)")
        return _run(args, lambda: DmonFileSource(args.file, interval_s=args.interval, host=args.host), from_file=True)

    ids: tuple[int, ...] = DEFAULT_FIELD_IDS
    if args.fields:
        try:
            ids = tuple(int_in(x, 1, 65535, "") for x in args.fields.split(","))  # DCGM's ids are unsigned short
        except argparse.ArgumentTypeError:
            raise SystemExit(
                f"gpuwarden produce dcgmi: --fields must be comma-separated field ids 1..65535, got {args.fields!r}"
            )
    return _run(
        args,
        lambda: DmonSource(ids, interval_s=args.interval, host=args.host, dcgmi=args.dcgmi, probe=not args.no_probe),
    )


def _cmd_nvml(args: argparse.Namespace) -> int:
    from producers.nvml import NvmlSource

    return _run(args, lambda: NvmlSource(host=args.host, links=not args.no_links))


def _cmd_nccl_inspector(args: argparse.Namespace) -> int:
    from producers.nccl_inspector import InspectorFollower, PromFileSource

    if bool(args.dir) == bool(args.prom):
        raise SystemExit("gpuwarden produce nccl-inspector: give a DIR or --prom PATH")
    return _run(
        args,
        lambda: (
            PromFileSource(args.prom, host=args.host, job=args.job, gpus_per_node=args.gpus_per_node)
            if args.prom
            else InspectorFollower(args.dir, gpus_per_node=args.gpus_per_node, job=args.job, host=args.host)
        ),
    )


def _cmd_nccl_tests(args: argparse.Namespace) -> int:
    from producers.nccl_tests import NcclTestsSource

    # The output file as the other file producers take it (--file), or as a positional.
    if bool(args.file) == bool(args.file_opt):
        raise SystemExit("gpuwarden produce nccl-tests: give the output file once: FILE or --file FILE (- for stdin)")
    args.file = args.file or args.file_opt
    return _run(args, lambda: NcclTestsSource(args.file, coll=args.coll, host=args.host, job=args.job), from_file=True)


def _cmd_kmsg(args: argparse.Namespace) -> int:
    from producers.kmsg import (
        DEFAULT_BOOT_MARKER,
        DevKmsgReader,
        JournalReader,
        KmsgFileSource,
        KmsgFollower,
        load_pci_map,
    )

    if sum(map(bool, (args.file, args.journal, args.kmsg))) > 1:
        raise SystemExit("gpuwarden produce kmsg: give at most one of --file, --journal, --kmsg")

    def make() -> object:
        pci = load_pci_map(args.pci_map, args.nvidia_smi)
        if args.file:
            return KmsgFileSource(
                args.file,
                pci,
                host=args.host,
                interval_s=args.interval,
                boot_time=args.boot_time,
                sample=not args.events_only,
            )
        reader = JournalReader(args.journalctl) if args.journal else DevKmsgReader(args.kmsg or "/dev/kmsg")
        marker = DEFAULT_BOOT_MARKER if args.boot_marker is None else args.boot_marker
        return KmsgFollower(reader, pci, host=args.host, sample=not args.events_only, boot_marker=marker)

    return _run(args, make, from_file=bool(args.file))


def _cmd_fabric_manager(args: argparse.Namespace) -> int:
    from producers.fabric_manager import FabricManagerLog, FileFollower, parse_fm_line
    from producers.kmsg import KmsgFileSource, KmsgFollower, load_pci_map

    def make() -> object:
        pci = load_pci_map(args.pci_map, args.nvidia_smi)
        log = FabricManagerLog(pci, host=args.host)
        if args.follow:
            reader = FileFollower(args.follow)
            return KmsgFollower(reader, pci, host=args.host, sample=not args.events_only, log=log, parse=parse_fm_line)
        return KmsgFileSource(
            args.file,
            pci,
            host=args.host,
            interval_s=args.interval,
            sample=not args.events_only,
            log=log,
            parse=parse_fm_line,
        )

    if bool(args.file) == bool(args.follow):
        raise SystemExit("gpuwarden produce fabric-manager: give exactly one of --file FILE or --follow [FILE]")
    if args.follow and _gzip_file(args.follow):
        # A compressed log is a rotated one, which grows no more: read once, whole, as --file reads it.
        log.warning("%s is gzip, a rotated log: read once, whole, not followed", args.follow)
        args.file, args.follow = args.follow, None
    return _run(args, make, from_file=bool(args.file))


def _cmd_pcie_aer(args: argparse.Namespace) -> int:
    from producers.kmsg import load_pci_map
    from producers.pcie_aer import AerSource

    def make() -> object:
        pci = None
        if args.pci_map:
            pci = load_pci_map(args.pci_map)
        return AerSource(args.root, host=args.host, pci_map=pci)

    return _run(args, make)


def _cmd_ib_sysfs(args: argparse.Namespace) -> int:
    from producers.ib_sysfs import IbSysfsSource, bus_ids
    from producers.ibpeers import PeerFile
    from producers.kmsg import load_pci_map

    def make() -> object:
        gpus = None
        if args.pci_map:
            gpus = bus_ids(load_pci_map(args.pci_map))
        peers = PeerFile(args.peers) if args.peers else None
        return IbSysfsSource(args.root, host=args.host, gpu_bus_ids=gpus, peers=peers)

    return _run(args, make)


def _cmd_ibstat(args: argparse.Namespace) -> int:
    from producers.ibpeers import PeerFile
    from producers.ibstat import IbstatSource

    def make() -> object:
        peers = PeerFile(args.peers) if args.peers else None
        return IbstatSource(args.file, host=args.host, device=args.device, peers=peers)

    return _run(args, make, from_file=True)


def _cmd_torch_watchdog(args: argparse.Namespace) -> int:
    from producers.torch_watchdog import WatchdogLogSource

    return _run(
        args,
        lambda: WatchdogLogSource(args.file, job=args.job, host=args.host, gpus_per_node=args.gpus_per_node),
        from_file=True,
    )


def _cmd_ncclras(args: argparse.Namespace) -> int:
    from producers.ncclras import RasStatusSource

    return _run(args, lambda: RasStatusSource(args.file, job=args.job), from_file=True)


def _peers_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--peers",
        metavar="FILE",
        help="saved `iblinkinfo` (either layout) or `ibnetdiscover` (topology or -p) output: label each port "
        "with its link partner (switch name, GUID, port, LID); re-read when the file changes",
    )


def _common(p: argparse.ArgumentParser, interval: float) -> None:
    from pipeline.bus.connection import add_arguments

    add_arguments(p, bootstrap_help="publish to <prefix>.telemetry on this broker")
    p.add_argument("--out", metavar="FILE", help="write JSONL here instead (.gz to compress, - for stdout)")
    p.add_argument("--prefix", default="gpuwarden", help="topic prefix")
    p.add_argument("--host", help="host name for the records (default: what the source says, else this host)")
    p.add_argument(
        "--interval", type=non_negative_float, default=interval, help="seconds between polls (default %(default)s)"
    )
    p.add_argument("--count", type=positive_int, default=None, help="stop after this many polls")
    p.add_argument(
        "--buffer",
        type=int,
        default=200_000,
        help="records held while the broker is away; the oldest are dropped beyond it (a file "
        "waits for the sink instead, while it makes progress) (default %(default)s)",
    )
    p.add_argument(
        "--send-timeout", type=positive_float, default=5.0, help="seconds one send may wait (default %(default)s)"
    )
    p.add_argument(
        "--encoding",
        choices=("columnar", "json"),
        default="columnar",
        help="Kafka message encoding: columnar (DCGM-only messages, with its content-type header; "
        "others JSON) or json (default %(default)s)",
    )
    p.add_argument(
        "--metrics-port",
        type=port,
        default=None,
        help="serve the producer's counters (records, "
        "drops by reason, failed sends, queue depth) on http://HOST:PORT/metrics (0: any free port)",
    )
    p.add_argument("--metrics-host", default="0.0.0.0", help="address for --metrics-port (default %(default)s)")


def register(sub: Any) -> None:
    """Add ``produce`` and its per-source subcommands to the ``gpuwarden`` parser."""
    pr = sub.add_parser("produce", help="read real telemetry (dcgm-exporter, dcgmi, NVML, NCCL) and publish it")
    psub = pr.add_subparsers(dest="source", required=True)

    d = psub.add_parser("dcgm-exporter", help="scrape dcgm-exporter's /metrics (or read saved scrapes)")
    d.add_argument("--url", type=_http_url, help="e.g. http://127.0.0.1:9400/metrics")
    d.add_argument("--file", nargs="+", help="saved scrape(s), one per poll")
    d.add_argument("--timeout", type=positive_float, default=5.0, help="scrape timeout in seconds")
    _common(d, 10.0)
    d.set_defaults(func=_cmd_dcgm_exporter)

    g = psub.add_parser("dcgmi", help="run `dcgmi dmon` and parse its stream")
    g.add_argument("--fields", help="comma-separated DCGM field ids (default: what the rules use)")
    g.add_argument("--dcgmi", default="dcgmi", help="path of the dcgmi binary")
    g.add_argument("--no-probe", action="store_true", help="skip the per-field support check")
    g.add_argument(
        "--file",
        help="read a saved dmon log instead of running dcgmi (rounds are --interval "
        "seconds apart, the last one at the file's modification time)",
    )
    _common(g, 1.0)
    g.set_defaults(func=_cmd_dcgmi)

    n = psub.add_parser("nvml", help="read GPUs directly through NVML (nvidia-ml-py)")
    n.add_argument("--no-links", action="store_true", help="skip per-NVLink records")
    _common(n, 1.0)
    n.set_defaults(func=_cmd_nvml)

    i = psub.add_parser("nccl-inspector", help="follow the NCCL Inspector plugin's dump directory")
    i.add_argument("dir", nargs="?", help="the plugin's dump directory (JSON mode)")
    i.add_argument(
        "--prom",
        metavar="PATH",
        help="read its Prometheus-mode output instead: a file, or the dump directory (one file per GPU)",
    )
    i.add_argument("--gpus-per-node", type=_gpus_per_node, help="map ranks of whole-node communicators to local GPUs")
    i.add_argument("--job", help="job id to stamp on the records")
    _common(i, 5.0)
    i.set_defaults(func=_cmd_nccl_inspector)

    t = psub.add_parser("nccl-tests", help="parse nccl-tests output (text tables or -J JSON)")
    t.add_argument("file", nargs="?", help="output file, or - for stdin (or --file)")
    t.add_argument("--file", dest="file_opt", metavar="FILE", help="the same, as the other file producers take it")
    t.add_argument("--coll", help="collective name if the output does not say (AllReduce, ...)")
    t.add_argument("--job", help="job id to stamp on the records")
    _common(t, 1.0)
    t.set_defaults(func=_cmd_nccl_tests)

    k = psub.add_parser(
        "kmsg",
        help="follow the kernel log's XIDs, NVSwitch SXids, NIC and PCIe AER lines (/dev/kmsg, journalctl, or a saved "
        "dmesg/journal file)",
    )
    k.add_argument(
        "--file",
        help="a saved log instead of following one: dmesg (with or without -T or "
        "timestamps), journalctl (short, short-iso, json) or a copy of /dev/kmsg; - for stdin",
    )
    k.add_argument("--kmsg", metavar="PATH", help="follow this kmsg device (default: /dev/kmsg)")
    k.add_argument("--journal", action="store_true", help="follow `journalctl -k -b -f -o json` instead of /dev/kmsg")
    k.add_argument("--journalctl", default="journalctl", help="path of the journalctl binary")
    k.add_argument(
        "--pci-map",
        metavar="FILE",
        help="GPU index by PCI bus id: saved `nvidia-smi "
        "--query-gpu=index,pci.bus_id --format=csv` (default: run nvidia-smi on this host)",
    )
    k.add_argument("--nvidia-smi", default="nvidia-smi", help="path of the nvidia-smi binary")
    k.add_argument(
        "--boot-time",
        type=non_negative_float,
        help="--file: epoch seconds of the boot that dmesg/kmsg times count "
        "from (default: the last line falls at the file's modification time)",
    )
    k.add_argument(
        "--boot-marker",
        metavar="PATH",
        help="where the follower records the boot whose BERT records (fatal hardware errors of the "
        "previous boot) it counted, so a restart within that boot does not count them again "
        "(default: /var/lib/gpuwarden/kmsg-boot-id; '' counts none; if PATH cannot be read or "
        "written they are not counted, with a warning; --file counts them regardless)",
    )
    k.add_argument(
        "--events-only",
        action="store_true",
        help="send XID lines only, no sample of every GPU each "
        "--interval (for hosts whose dcgm-exporter already reports every GPU: docs/producers.md)",
    )
    _common(k, 10.0)
    k.set_defaults(func=_cmd_kmsg)

    fm = psub.add_parser(
        "fabric-manager",
        help="count NVSwitch, NVLink and fabric errors in NVIDIA Fabric Manager's log (fabricmanager.log)",
    )
    fm.add_argument("--file", help="read a saved fabricmanager.log once; - for stdin")
    fm.add_argument(
        "--follow",
        nargs="?",
        const="/var/log/fabricmanager.log",
        metavar="FILE",
        help="follow the log as it grows, across rotation (default FILE: %(const)s, Fabric Manager's LOG_FILE_NAME)",
    )
    fm.add_argument(
        "--pci-map",
        metavar="FILE",
        help="the GPUs whose records carry the host's counters: saved `nvidia-smi "
        "--query-gpu=index,pci.bus_id --format=csv` (default: run nvidia-smi on this host)",
    )
    fm.add_argument("--nvidia-smi", default="nvidia-smi", help="path of the nvidia-smi binary")
    fm.add_argument(
        "--events-only",
        action="store_true",
        help="send the error lines only, no sample of every GPU each --interval",
    )
    _common(fm, 10.0)
    fm.set_defaults(func=_cmd_fabric_manager)

    a = psub.add_parser(
        "pcie-aer",
        help="poll the PCIe AER error counters of each GPU and NIC and the bridges above them (sysfs aer_dev_*)",
    )
    a.add_argument(
        "--root",
        default="/",
        help="read sys/bus/pci/devices under this directory (a container's mount of the host's /sys "
        "parent, a saved tree); no link is followed out of it (default: %(default)s)",
    )
    a.add_argument(
        "--pci-map",
        metavar="FILE",
        help="GPU index by PCI bus id: saved `nvidia-smi --query-gpu=index,pci.bus_id --format=csv` "
        "(default: the GPUs in PCI bus order, as nvidia-smi numbers them)",
    )
    _common(a, 10.0)
    a.set_defaults(func=_cmd_pcie_aer)

    ib = psub.add_parser(
        "ib-sysfs", help="read every InfiniBand/RoCE port's state, rate and counters from /sys/class/infiniband"
    )
    ib.add_argument(
        "--root",
        default="/",
        help="read <root>/sys/... (a container's mount of the host's /sys; default %(default)s)",
    )
    ib.add_argument(
        "--pci-map",
        metavar="FILE",
        help="saved `nvidia-smi --query-gpu=index,pci.bus_id --format=csv`: name the GPUs behind each NIC "
        "(nearest common PCIe bridge under <root>/sys/bus/pci/devices)",
    )
    _peers_arg(ib)
    _common(ib, 10.0)
    ib.set_defaults(func=_cmd_ib_sysfs)

    st = psub.add_parser("ibstat", help="parse saved `ibstat` or `ibstatus` output (port state and rate)")
    st.add_argument("--file", required=True, help="the saved output, or - for stdin")
    st.add_argument("--device", help="the device of `ibstat CA PORT` output, which does not name it")
    _peers_arg(st)
    _common(st, 1.0)
    st.set_defaults(func=_cmd_ibstat)

    w = psub.add_parser(
        "torch-watchdog",
        help="read PyTorch's NCCL watchdog lines (timeouts, last enqueued/completed work) and NCCL's InfiniBand "
        "completion errors and async events (per HCA) from a training log",
    )
    w.add_argument("--file", required=True, help="the training log (torchrun, Slurm or Ray output), - for stdin")
    w.add_argument("--job", required=True, help="job id to stamp on the records")
    w.add_argument(
        "--gpus-per-node",
        type=_gpus_per_node,
        help="a rank's GPU is rank %% N (default: torchrun's [defaultN]: local rank when the log has it)",
    )
    _common(w, 1.0)
    w.set_defaults(func=_cmd_torch_watchdog)

    r = psub.add_parser("ncclras", help="read NCCL RAS status output (ncclras, text or -f json)")
    r.add_argument("--file", required=True, help="saved `ncclras` output, - for stdin")
    r.add_argument("--job", help="job id to stamp on the records")
    _common(r, 1.0)
    r.set_defaults(func=_cmd_ncclras)

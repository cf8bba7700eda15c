"""``gpuwarden serve``: the Kafka consumer-group detection service."""

from __future__ import annotations

import argparse
from typing import Any

from pipeline.cli.args import kafka_options, port


def _cmd_serve(args: argparse.Namespace) -> int:
    from pipeline.bus import connection
    from pipeline.service.app import Service, setup_logging
    from pipeline.service.config import load_config

    cfg = load_config(args.config)
    conn = connection.from_args(args, base=connection.KafkaConnection(cfg.kafka.bootstrap, cfg.kafka.security))
    cfg.kafka.bootstrap, cfg.kafka.security = conn.bootstrap, conn.security
    if (conn.security.security_protocol or "PLAINTEXT") != "PLAINTEXT":
        # A refused login or certificate: one line and exit 4 now, not kafka-python's retries in the
        # log until a timeout (docs/operations.md, Secured Kafka). Plain brokers are left to the
        # service, which first refuses to start without its state key.
        connection.check(conn)
    if args.prefix:
        cfg.kafka.prefix = args.prefix
    if args.group:
        cfg.kafka.group = args.group
    if args.http_port is not None:
        cfg.http.port = args.http_port
    if args.rules:
        cfg.service.rules = [args.rules]
    if args.insecure_state:
        cfg.service.insecure_state = True
    if args.stage:
        cfg.service.stage = args.stage
    setup_logging(cfg.service.log_level)
    # `kill -USR1 <pid>`: every thread's stack to stderr, for a service that seems stuck
    # (docs/operations.md, Troubleshooting); the service goes on afterwards.
    from pipeline import stackdump

    stackdump.install()
    stage = cfg.service.stage
    if stage == "fleet":
        from pipeline.errors import ConfigError
        from pipeline.service.app import fleet_on

        if not fleet_on(cfg):
            raise ConfigError(
                "service.stage",
                "the fleet stage runs the models, the hang detector or the incidents; service.models finds "
                "none, no hang.yaml is beside service.rules and service.incidents is off",
            )
        return Service(cfg, stage="fleet").run()
    host = Service(cfg)
    if stage == "all" and host.forwards:
        return host.run(Service(cfg, stage="fleet", metrics=host.metrics))
    return host.run()


def register(sub: Any) -> None:
    """Add ``gpuwarden serve`` to the subcommands ``sub``."""
    sv = sub.add_parser("serve", help="run the Kafka consumer-group detection service")
    sv.add_argument("--config", help="YAML config (see docs/operations.md)")
    kafka_options(sv, "override kafka.bootstrap")
    sv.add_argument("--prefix", help="override kafka.prefix")
    sv.add_argument("--group", help="override kafka.group")
    sv.add_argument("--http-port", type=port, help="override http.port (0: any free port)")
    sv.add_argument("--rules", help="override service.rules with one directory")
    sv.add_argument(
        "--insecure-state",
        action="store_true",
        help="run without GPUWARDEN_STATE_KEY: checkpoints unsigned, the state topic trusted (service.insecure_state)",
    )
    sv.add_argument(
        "--stage",
        choices=["all", "host", "fleet"],
        help="run only this stage (service.stage; default all: the host stage and, with models, a hang.yaml or incidents, the fleet stage)",
    )
    sv.set_defaults(func=_cmd_serve)

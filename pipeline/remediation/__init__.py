"""Remediation: alerts -> routes -> actions, behind guardrails, every decision audited.

``specs`` (the config's typed parts), ``config`` (the YAML file, loaded and checked), ``routes`` (the Alertmanager-style route tree), ``safety``
(values allowed to reach a command line), ``actions`` (log, webhook, kafka, command),
``presets`` (Slurm, Kubernetes, GPU reset, checkpoint, webhook formats), ``payloads`` (Slack and
PagerDuty bodies), ``alertmanager`` (alerts posted to Alertmanager, its silences honoured),
``inventory`` (the hosts we may act on), ``targets`` (webhook URLs alert values cannot
redirect), ``guardrails`` (dry-run, circuit
breaker, cooldown, attempt cap, once per alert id; persisted), ``audit`` (one record per
decision), ``incidents`` (incident events as remediation decides them: what acts, equivalence
groups), ``remediator`` (the decision loop), ``service`` (the Kafka driver), ``cli``.
"""

"""Fabric Manager log lines for the producer's tests, laid out as real tools print them (origins in
test_producer_fabric_manager_real.py's docstring)."""

from __future__ import annotations


# gpud log_matcher_test.go @ 4a8de33a, "from log file": no [tid N] between the level and the message.
NO_TID = (
    "[Sep 08 2025 23:21:50] [ERROR] detected number of NVSwitches don't match with any supported system "
    "topology, aborting fabric manager"
)
# The prefix as Fabric Manager prints it, at the level LOG_LEVEL=1 names (Edit-GFM-Variables.md @ ba64370c);
# the message is illustrative.
CRITICAL = (
    "[Sep 08 2025 23:21:49] [CRITICAL] [tid 812] failed to open NVSwitch driver device handle, aborting fabric manager"
)
# The NMX-C analyser's trunk-link-failure regex: [WARNING] [tid N] Detected a trunk link failure event ...
TRUNK_LINK = "[Jul 19 2025 18:34:57] [WARNING] [tid 134] Detected a trunk link failure event for partition Id 32766."

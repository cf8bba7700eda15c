"""Scoring detectors on labelled simulator scenarios (``gpuwarden eval``)."""

"""Where the shipped rule packs, ``models.yaml`` and ``routes.yaml`` are: one answer for everyone.

The repository's ``rules/`` is their source, edited in place. A wheel carries a copy of it as
package data, ``pipeline/packs/`` (the build step in ``setup.py``); an installed gpuwarden
reads that. A source checkout (an editable install, ``python -m pipeline``) has no copy and
reads ``rules/`` beside the package. A directory given on the command line or in a config
always wins over both (docs/architecture.md §2).

>>> (rules_dir() / "models.yaml").is_file()
True
"""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


def rules_dir() -> Path:
    """The default rule packs: the installed package's copy, else the checkout's ``rules/``."""
    bundled = _PACKAGE / "packs"
    if bundled.is_dir():
        return bundled
    return _PACKAGE.parent / "rules"


def default_models() -> Path:
    """``models.yaml`` of the default packs."""
    return rules_dir() / "models.yaml"


def default_routes() -> Path:
    """The example remediation routes (``routes.yaml``) shipped with the packs."""
    return rules_dir() / "routes.yaml"


def version() -> str:
    """gpuwarden's version as installed (``dev`` when run from a checkout that is not installed)."""
    from importlib.metadata import PackageNotFoundError, version as _version

    try:
        return _version("gpuwarden")
    except PackageNotFoundError:
        return "dev"

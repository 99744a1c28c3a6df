"""What ``diva-prep --version`` and ``diva-report --version`` print: this distribution's version and verl's, read from
the installed packages' metadata (nothing is imported)."""

from __future__ import annotations

from importlib import metadata

DISTRIBUTION = "diva-grpo-verl"


def _installed(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


def version_line(prog: str) -> str:
    """``<prog> <version> (diva-grpo-verl; verl <version>)``; the checkout's ``verl_ext.__version__`` when the
    distribution is not installed (run from a source tree)."""
    from verl_ext import __version__

    mine = _installed(DISTRIBUTION)
    return f"{prog} {__version__ if mine == 'not installed' else mine} ({DISTRIBUTION}; verl {_installed('verl')})"

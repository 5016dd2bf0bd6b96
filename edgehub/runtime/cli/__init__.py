"""The ``edgehub`` command line; ``main`` (``edgehub.runtime.cli.app``) is the console script of pyproject.toml.

Each command has its own module (``run`` and its option groups in ``run``, ``config show`` in ``config``, the
operator's tools in ``capacity``, ``identity``, ``linksim``, ``status``, ``store``); the ones a serving hub never runs
are imported only when named (``edgehub.runtime.cli.app``)."""

from edgehub.runtime.cli.app import main

__all__ = ["main"]

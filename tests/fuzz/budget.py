"""How long each fuzz target runs: a number of examples, scaled by the Hypothesis profile.

``make test`` runs the ``edgehub`` profile (100 examples per test by Hypothesis' count): each target runs the
examples its test names, which keeps all of tests/fuzz well under a minute on a 2-core box.
``HYPOTHESIS_PROFILE=fuzz`` (registered in tests/conftest.py, 100 times the examples) runs the same tests
longer; ``python -m bench.fuzz`` runs the same properties for minutes.
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings

__all__ = ["fuzz_settings"]

_BASE = 100  # Hypothesis' own default max_examples: the ``edgehub`` profile keeps it


def fuzz_settings(examples: int) -> settings:
    """``examples`` under the default profile, proportionally more under a longer one; no deadline (a slow
    example on a loaded box is not a bug) and no health check about slow or large generation."""
    default = settings.default
    scale = max(1.0, default.max_examples / _BASE) if default is not None else 1.0
    return settings(
        max_examples=int(examples * scale),
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
    )

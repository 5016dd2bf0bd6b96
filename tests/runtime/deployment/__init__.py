"""Tests of edgehub.runtime.deployment."""

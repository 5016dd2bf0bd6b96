"""Tests of edgehub.runtime.cli."""

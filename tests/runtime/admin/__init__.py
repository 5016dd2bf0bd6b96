"""Tests of edgehub.runtime.admin."""

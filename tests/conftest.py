"""Shared fixtures. Every test is bounded in time (pytest-timeout) and warnings are errors."""

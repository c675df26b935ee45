"""Shared test helpers: oracles, test-only families and proposers, subprocess runners."""

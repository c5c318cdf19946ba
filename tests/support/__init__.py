"""Helpers shared by the tests: the list of the repository's programs."""

"""Helpers shared by the tests: recorded change records and the embedded-stack fixtures."""

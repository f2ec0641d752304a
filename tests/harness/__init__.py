"""Test harnesses that bring up real daemons and emulated hosts for integration tests and benchmarks."""

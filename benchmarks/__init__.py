"""Benchmarks run against the local Slurm cluster (``make bench-preempt``); not tests."""

"""Tests of rft_runtime.rewards."""

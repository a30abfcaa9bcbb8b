"""rft_runtime: the data plane."""

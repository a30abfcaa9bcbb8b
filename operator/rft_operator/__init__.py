"""rft_operator."""

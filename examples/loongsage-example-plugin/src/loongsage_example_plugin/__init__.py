"""A worked third-party LoongSage plugin package."""

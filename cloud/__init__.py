"""cloud package."""

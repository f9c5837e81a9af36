"""population: reserved for a later issue (see README)."""

"""planner: reserved for a later issue (see README)."""

"""spark_io: reserved for a later issue (see README)."""

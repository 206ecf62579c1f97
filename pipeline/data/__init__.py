"""Converters from the real input formats (DESIGN.md §6) to the Parquet contracts (DESIGN.md §2)."""

"""Converters from the real input formats (docs/input-formats.md) to the Parquet contracts (docs/stores.md)."""

"""Negatives and losses: samplers, contrastive losses, the false-negative filter, bias diagnostics.

Pure torch and numpy; candidate lists come in as tensors of entity ids and scores (docs/math.md).
"""

"""The BLINK-on-AIDA recipe (paper §6.8): BLINK's bi-encoder fine-tuned on KILT AIDA against the
whole Wikipedia catalogue with mixed-50 negatives and the asynchronous refresh."""

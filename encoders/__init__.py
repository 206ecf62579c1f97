"""Text to vectors and vectors to scores: BERT towers, score functions, the joint reranker, checkpoints.

Pure torch and transformers; knows nothing of Ray or FAISS (docs/architecture.md, docs/math.md).
"""

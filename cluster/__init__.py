"""On-disk contracts, Ray actors and jobs: catalogue tables, encoder pool, sharded FAISS index,
index store, miner and the asynchronous refresh (docs/stores.md, docs/refresh.md). The only package that imports
Ray and FAISS.
"""

"""On-disk contracts, Ray actors and jobs: catalogue tables, encoder pool, sharded FAISS index,
index store, miner and the asynchronous refresh (DESIGN.md §2, §5). The only package that imports
Ray and FAISS.
"""

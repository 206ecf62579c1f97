"""Ray compute over the stores (docs/refresh.md): starting or joining Ray, the encoder actors that
encode the catalogue and hold index shards, the miner, the refresh with its coordinator and
stand-alone job, the cluster-wide run lock, and retrieval for evaluation.
"""

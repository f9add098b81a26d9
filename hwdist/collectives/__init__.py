"""Collectives: every function reaches its backend through hwdist.registry."""

"""Benchmark drivers and the wire types they read from a server."""

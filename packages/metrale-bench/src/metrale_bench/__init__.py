"""Metrale benchmark wire types and harness (talks to servers over HTTP; never imports torch)."""

from metrale_bench.host import HostDescription, describe_host

__all__ = ["HostDescription", "describe_host"]

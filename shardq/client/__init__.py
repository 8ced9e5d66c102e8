"""shardq's Python client. So far: a synchronous, pipelining TCP connection."""

from shardq.client._tcp import CommandFailed, ConnectionClosed, TcpConnection

__all__ = ["CommandFailed", "ConnectionClosed", "TcpConnection"]

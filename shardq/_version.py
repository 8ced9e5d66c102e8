"""shardq's version, in a module of its own: every layer may import it without importing the
root package (whose lazy re-exports sit above everything else)."""

__version__ = "0.1.0"

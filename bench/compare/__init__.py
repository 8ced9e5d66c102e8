"""`python -m bench compare`: shardq against bunqueue and the Python job queues, side by side.

Modules whose names start with `peer_` and `_record` run inside the peers' own virtual
environment (they import only the standard library and the peer they drive); the rest run in
the project's environment.
"""

"""The `shardq` command line (installed as `shardq_cli`, so it never shadows a module `cli`)."""

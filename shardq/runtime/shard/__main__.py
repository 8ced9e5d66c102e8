"""`python -m shardq.runtime.shard`: run the shard process."""

import sys

from shardq.runtime.shard._process import main

sys.exit(main())

"""`python -m shardq.runtime.shard`: run the shard process."""

import sys

from shardq.runtime._lean import skip_extras

skip_extras()  # before the role's imports

from shardq.runtime.shard._process import main  # noqa: E402

sys.exit(main())

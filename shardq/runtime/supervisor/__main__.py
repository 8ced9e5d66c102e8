"""`python -m shardq.runtime.supervisor`: run the supervisor process."""

import sys

from shardq.runtime.supervisor._process import main

sys.exit(main())

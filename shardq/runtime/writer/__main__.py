"""`python -m shardq.runtime.writer`: run the writer process."""

import sys

from shardq.runtime.writer._process import main

sys.exit(main())

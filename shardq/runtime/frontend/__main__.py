"""`python -m shardq.runtime.frontend`: run the frontend process."""

import sys

from shardq.runtime.frontend._process import main

sys.exit(main())

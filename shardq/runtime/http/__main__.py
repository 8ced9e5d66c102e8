"""`python -m shardq.runtime.http`: run the HTTP process."""

import sys

from shardq.runtime.http._process import main

sys.exit(main())

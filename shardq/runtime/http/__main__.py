"""`python -m shardq.runtime.http`: run the HTTP process."""

import sys

from shardq.runtime._lean import skip_extras

skip_extras()  # before the role's imports

from shardq.runtime.http._process import main  # noqa: E402

sys.exit(main())

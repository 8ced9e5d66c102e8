"""`python -m shardq.runtime.frontend`: run the frontend process."""

import sys

from shardq.runtime._lean import skip_extras

skip_extras()  # before the role's imports

from shardq.runtime.frontend._process import main  # noqa: E402

sys.exit(main())

"""`python -m shardq.runtime.writer`: run the writer process."""

import sys

from shardq.runtime._lean import skip_extras

skip_extras()  # before the role's imports

from shardq.runtime.writer._process import main  # noqa: E402

sys.exit(main())

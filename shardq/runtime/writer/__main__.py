"""`python -m shardq.runtime.writer`: run the writer process."""

import sys

from shardq.runtime._lean import defer_asyncio, skip_extras

skip_extras()  # before the role's imports
defer_asyncio()  # it runs no event loop

from shardq.runtime.writer._main import main  # noqa: E402

sys.exit(main())

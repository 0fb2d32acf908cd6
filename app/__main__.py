"""`python -m app` starts the Shoal window."""

import sys

from app.main import main

sys.exit(main())

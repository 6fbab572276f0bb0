import sys

from remote_ops.cli import main

sys.exit(main())

"""``python3 -m fedjax_dp``: the ``fedjax-dp`` command."""

import sys

from fedjax_dp.cli import main

sys.exit(main())

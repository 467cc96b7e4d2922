"""`python -m grpo_plugin train ...` (also `accelerate launch -m grpo_plugin ...`)."""

import sys

from grpo_plugin.cli import main

sys.exit(main())

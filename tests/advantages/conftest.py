"""Make the helper modules next to these tests (loop_reference, step_data) importable: the
project runs pytest with --import-mode=importlib, which does not put test folders on sys.path."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

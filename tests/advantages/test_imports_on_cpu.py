"""The pure-math package stays light: importing it pulls in neither torch, Ray nor verl's trainer."""

import subprocess
import sys


def test_import_needs_numpy_only():
    code = (
        "import sys, verl_ext.advantages, verl_ext.advantages.median, verl_ext.rewards.tool_path, "
        "verl_ext.steps\n"
        "heavy = [m for m in ('torch', 'ray', 'verl.trainer') if m in sys.modules]\n"
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True)

"""Importing the DVReward maths, schema, client and builder must not pull in torch or transformers:
they run in every reward worker and in the question builder, where no model is loaded."""

import subprocess
import sys


def test_light_modules_do_not_import_torch_or_transformers():
    code = (
        "import sys\n"
        "import verl_ext.rewards.dvreward.scoring, verl_ext.rewards.dvreward.question_set\n"
        "import verl_ext.rewards.dvreward.judge, verl_ext.rewards.dvreward.settings\n"
        "import verl_ext.rewards.dvreward.questions, verl_ext.rewards.dvreward.judge_server\n"
        "print(sorted(m for m in ('torch', 'transformers', 'verl') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"

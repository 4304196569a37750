"""Every configuration variable is documented where users look for it, with the default the code uses."""

import re

from contracts import settings
from tests.conftest import REPO


def test_the_readme_configuration_table_lists_every_variable_with_its_default():
    readme = (REPO / "README.md").read_text()
    documented = dict(re.findall(r"^\| `([A-Z_]+)` \| ([^|]+) \|", readme, re.M))
    assert set(settings.VARIABLES) <= set(documented), set(settings.VARIABLES) - set(documented)
    literal = {name: default for name, (default, _) in settings.VARIABLES.items() if " " not in default}
    assert {name: documented[name] for name in literal} == {name: f"`{d}`" for name, d in literal.items()}

"""Every configuration variable is documented where users look for it."""

import re

from pipelines import settings
from tests.conftest import REPO


def test_the_readme_configuration_table_lists_every_variable():
    readme = (REPO / "README.md").read_text()
    documented = set(re.findall(r"^\| `([A-Z_]+)` \|", readme, re.M))
    assert set(settings.VARIABLES) <= documented, set(settings.VARIABLES) - documented

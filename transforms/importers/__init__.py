"""Real-data importers: each public dataset in ../shared/data -> the landing zone the simulator writes.

``genrank import movielens|mind|ebnerd|obd --src PATH --out DIR`` calls :func:`import_dataset`, which
writes ``DIR/landing/date=YYYY-MM-DD/{impressions,clicks,behaviors}-00000.jsonl.gz`` + ``_SUCCESS``
through :func:`transforms.landing.write_day` (one atomic call per UTC day) and returns an
:class:`ImportReport` whose ``summary()`` prints source rows, landed lines, drops and the
reconciliation of the two.

| name | module | source folder (default) |
|---|---|---|
| ``movielens`` | :mod:`.movielens` | ``movielens_latest_small`` |
| ``mind`` | :mod:`.mind` | ``mind_small_subset`` |
| ``ebnerd`` | :mod:`.ebnerd` | ``ebnerd_test_fixture`` |
| ``obd`` | :mod:`.obd` | ``open_bandit_dataset_small`` |

Each module's docstring documents its field mapping; :mod:`.common` the shared conventions (UTC,
synthetic click delay, ids, ordering, ``limit_users``, ``since``/``until``, ``fill_gaps``);
:mod:`.skeleton` the one flow every importer follows, each module supplying only its dataset's
parts as an :class:`~.skeleton.Importer`.
Importer-specific options (passed as keyword arguments to :func:`import_dataset`):
every importer: ``since``, ``until``, ``fill_gaps``; mind: ``history`` (default True);
ebnerd: ``fmt`` (``auto``/``parquet``/``tsv``); obd: ``policy`` (``random``/``bts``), ``campaigns``.

Errors: an unknown dataset name, a missing source directory or file, a corrupt file (short row,
bad value, truncated parquet, missing column) or a bad option raise :class:`SourceDataError`
(a ``ValueError``) whose message names the value or the file (and line) and what is wrong.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from transforms.importers.common import Check, ImportReport, SourceDataError
from transforms.importers.ebnerd import import_ebnerd
from transforms.importers.mind import import_mind
from transforms.importers.movielens import import_movielens
from transforms.importers.obd import import_obd

IMPORTERS: dict[str, Callable[..., ImportReport]] = {
    "movielens": import_movielens,
    "mind": import_mind,
    "ebnerd": import_ebnerd,
    "obd": import_obd,
}

# Folder of each dataset under ../shared/data (for a CLI default of --src).
DATASET_DIRS: dict[str, str] = {
    "movielens": "movielens_latest_small",
    "mind": "mind_small_subset",
    "ebnerd": "ebnerd_test_fixture",
    "obd": "open_bandit_dataset_small",
}


def import_dataset(
    name: str, src: str | Path, out: str | Path, limit_users: int | None = None, **options: Any
) -> ImportReport:
    """Import dataset ``name`` from folder ``src`` into the landing zone under ``out``."""
    importer = IMPORTERS.get(name)
    if importer is None:
        raise SourceDataError(f"unknown dataset {name!r}: expected one of {', '.join(IMPORTERS)}")
    return importer(Path(src), Path(out), limit_users, **options)


__all__ = ["Check", "DATASET_DIRS", "IMPORTERS", "ImportReport", "SourceDataError", "import_dataset"]

"""Where benchmark and SFT data come from: a local directory in the official layout, or the Hugging Face hub.

Contract: ``resolve_data_dir(explicit)`` returns the local root (explicit value, else ``$CALSWEEP_DATA_DIR``,
else None). Loaders try the local copy first; with no local copy they call ``datasets.load_dataset``;
if that fails too they raise ``DataSourceError`` with one line naming both ways.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

DATA_DIR_ENV = "CALSWEEP_DATA_DIR"


class DataSourceError(RuntimeError):
    """Data could not be found locally nor fetched from the hub, or a data row is malformed."""


def resolve_data_dir(explicit: str | os.PathLike | None = None) -> Path | None:
    """Return the local data root: ``explicit``, else ``$CALSWEEP_DATA_DIR``, else None (hub only).

    A root that is named but does not exist is an error, not a silent fall-back to the hub.
    """
    value = explicit if explicit not in (None, "") else os.environ.get(DATA_DIR_ENV) or None
    if value is None:
        return None
    root = Path(value).expanduser()
    if not root.is_dir():
        source = "data_dir" if explicit not in (None, "") else f"${DATA_DIR_ENV}"
        raise DataSourceError(f"{source} = {str(value)!r} is not a directory; expected the root of local copies "
                              f"(mmlu/, hellaswag/, arc_easy/, alpaca/) or unset it to use the Hugging Face hub")
    return root


def load_hub_dataset(hub_id: str, *, name: str | None, split: str, local_hint: str) -> Any:
    """``datasets.load_dataset(hub_id, name, split=split)`` with a one-line error naming the local alternative."""
    import datasets

    try:
        return datasets.load_dataset(hub_id, name, split=split)
    except Exception as exc:  # noqa: BLE001 - any hub failure becomes one clear line
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise DataSourceError(
            f"cannot load {hub_id}{'/' + name if name else ''} ({split}) from the Hugging Face hub ({reason[:160]}); "
            f"either set ${DATA_DIR_ENV} (or data_dir in the config) to a directory holding {local_hint}, "
            f"or make the hub reachable") from None

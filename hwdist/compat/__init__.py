"""Drop-in modules for the distributed APIs that came before hwdist.

Each module reproduces one API's names, signatures, defaults, return
conventions and errors while running every call through hwdist's public
operations (and so through its drivers), so code written for that API
changes one import:

* [`hwdist.compat.vis4d`][hwdist.compat.vis4d]: ``vis4d.common.distributed``.
* [`hwdist.compat.legacy`][hwdist.compat.legacy]: ``torch.distributed`` of torch 0.3/0.4.
* [`hwdist.compat.megengine`][hwdist.compat.megengine]: ``megengine.distributed.helper``.

``mmengine.dist`` needs no module here: top-level ``hwdist`` is its drop-in.
Importing this package imports none of the modules (nor any vendor package).
"""

from __future__ import annotations

__all__: list[str] = []

"""The driver file ``hwdist check --measure --write-driver PATH`` writes: a measured table as a driver.

[`driver_source`][hwdist.checks.driver_file.driver_source] turns a
[`Measurement`][hwdist.checks.measure.Measurement] into the Python source of a driver module that
declares exactly the ops, reduce ops and dtypes that passed; the refusals are kept as comments.
Register the file (``register_backend`` or an entry point) and hwdist plans with that table.
"""

from __future__ import annotations

import datetime
import keyword
import re
from typing import Sequence

from .measure import Measurement

__all__ = ["class_name", "driver_source", "write_driver"]


def class_name(backend: str) -> str:
    """``'my-ccl'`` -> ``'MyCclDriver'``."""
    words = [w for w in re.split(r"[^0-9A-Za-z]+", backend) if w]
    name = "".join(w[:1].upper() + w[1:] for w in words) + "Driver"
    if not name[0].isalpha() or keyword.iskeyword(name):
        name = "Backend" + name
    return name


def _frozen(names: Sequence[str], dtype: bool = False) -> str:
    if not names:
        return "frozenset()"
    items = ", ".join(f"torch.{n}" if dtype else repr(n) for n in names)
    return f"frozenset({{{items}}})"


def driver_source(m: Measurement) -> str:
    """The Python source of a driver module declaring ``m``'s measured table."""
    t = m.table
    info = m.info
    cls = class_name(m.backend)
    accelerator = bool(info.get("accelerator"))
    base = "AcceleratorDriver" if accelerator else "hwdist.Driver"
    creator = info.get("creator_module")
    vendor = creator if creator and creator not in ("__main__", "__mp_main__") else None
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    refused = {
        f"{op} {d or '-'}{' ' + r if r else ''}": f"{s}: {why}"[:160]
        for (op, d, r), (s, why) in m.results.items()
        if s != "ok"
    }
    lines = [
        f'"""hwdist driver for backend {m.backend!r}, measured by `hwdist check --backend {m.backend}'
        ' --write-driver`.',
        "",
        f"Measured on {m.world_size} rank(s), device {info.get('device_type')}, torch {m.torch_version},"
        f" {when}: every op x dtype x reduce op",
        "issued with raw torch.distributed calls and checked against values computed from the rank numbers."
        " A table",
        "from one machine and one release: measure again after upgrading the backend. What was refused",
        "or wrong is in MEASURED_REFUSALS below.",
        "",
        "Register it in every process before hwdist uses the backend:",
        "",
        "    import hwdist",
        f"    from <this module> import {cls}",
        f"    hwdist.register_backend({m.backend!r}, {cls})",
        "",
        f"or declare it as an entry point of your package (group ``hwdist.drivers``, name ``{m.backend}``).",
        '"""',
        "",
        "import torch",
        "",
        "import hwdist",
    ]
    if accelerator:
        lines.append("from hwdist.drivers._common import AcceleratorDriver")
    lines += [
        "",
        "",
        f"class {cls}({base}):",
        f'    """{m.backend} on {info.get("device_type")}: the table `hwdist check` measured."""',
        "",
        f"    device_type = {info.get('device_type')!r}",
        f"    torch_backend = {m.backend!r}",
    ]
    if vendor:
        lines.append(f"    vendor_module = {vendor!r}  # registers the backend with torch when imported")
    lines += [
        f"    description = {m.backend + ' (measured by hwdist check, torch ' + m.torch_version + ')'!r}",
        f"    native_ops = {_frozen(t['native_ops'])}",
        f"    flat_ops = {_frozen(t['flat_ops'])}",
        f"    reduce_ops = {_frozen(t['reduce_ops'])}",
        f"    dtypes = {_frozen(t['dtypes'], dtype=True)}",
        f"    reduce_dtypes = {_frozen(t['reduce_dtypes'], dtype=True)}",
        f"    avg_dtypes = {_frozen(t['avg_dtypes'], dtype=True)}",
        f"    native_object_collectives = {bool(t['native_object_collectives'])!r}",
        f"    supports_async = {bool(t['supports_async'])!r}",
        "",
        "",
        "#: Every measured case that was refused, wrong or did not finish, with what the backend said.",
        "MEASURED_REFUSALS = {",
    ]
    lines += [f"    {k!r}: {v!r}," for k, v in refused.items()]
    lines += ["}", ""]
    return "\n".join(lines)


def write_driver(m: Measurement, path: str) -> str:
    """Write [`driver_source`][hwdist.checks.measure.driver_source] to ``path``; returns the class name."""
    with open(path, "w") as fh:
        fh.write(driver_source(m))
    return class_name(m.backend)

"""The learner's checks of what it reads, for one deployment: :func:`admission` builds the
:class:`~service.records.admission.Admission` of ``settings`` (the models that decide and
their widths, the partition each one's key maps to, their groups, how a request id is
derived). The learner (:mod:`.joiner`, the pending store) and the label desk use this one
function, so they agree on what is open.

>>> from service.config import load_settings
>>> admit = admission(load_settings(default_model="m", models={
...     "m": {"algorithm": "dsal", "cost": 0.2, "n_features": 2}}))
>>> admit.widths, admit.groups
({'m': 2}, {'m': ('m',)})
"""

from __future__ import annotations

from service.config import Settings
from service.records import request_id
from service.records.admission import Admission
from service.stream.kafka.produce import partition_for

__all__ = ["admission"]


def admission(settings: Settings) -> Admission:
    """The learner's checks of the label topics and its changelog, for ``settings``."""
    deciding = {name: m for name, m in settings.models.items() if m.champion is None}
    n = settings.partitions.labels
    return Admission(
        widths={name: m.n_inputs for name, m in deciding.items()},
        partitions={name: partition_for(name.encode(), n) for name in deciding},
        groups={name: settings.group(name) for name in deciding},
        shadows={name: m.champion for name, m in settings.models.items() if m.champion},
        derive_id=request_id,
    )

"""Events as producers write them: a model's declaration of its events' fields and the
encoding of an event under it (pure; shared by the scorers, the learner, the replay and the
desk).

* :mod:`.declaration` — :class:`FieldsConfig`, the ``fields`` block of a model's settings.
* :mod:`.encode` — :class:`Encoder` (an event's fields as the model's inputs) and
  :class:`FieldError` (a field that does not fit, named).
"""

from service.features.declaration import KINDS, MAX_HASH_BITS, FieldsConfig, FieldSpec
from service.features.encode import Encoder, FieldError, bucket, encoder_of

__all__ = [
    "KINDS",
    "MAX_HASH_BITS",
    "Encoder",
    "FieldError",
    "FieldSpec",
    "FieldsConfig",
    "bucket",
    "encoder_of",
]

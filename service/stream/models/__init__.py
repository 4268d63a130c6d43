"""Models on the stream: what a worker serves and how a version reaches it.

- :mod:`.served`: :class:`~.served.ServedModel` (a snapshot's objects at one version) and
  version 0 of every model, built from the configuration alone;
- :mod:`.book`: :class:`~.book.ModelBook` (the models and the champions record a worker
  scores with), fed by :func:`~.book.follow_models` from the models topic, refusing what does
  not parse, fit or carry a valid signature;
- :mod:`.champions`: champion and challengers (the live comparison, promotion);
- :mod:`.cli`: ``abstain models`` (compare, promote, roll back).
"""

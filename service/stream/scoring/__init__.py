"""The scoring path: feature events in, decisions, label requests and dead letters out.

- :mod:`.batch`: a fetched batch as columns, parsed in one pass into one feature matrix per
  model (pure);
- :mod:`.encode`: a batch's decisions and label requests encoded together, the bytes their
  records' ``to_json`` writes (pure);
- :mod:`.decide`: parse -> decide -> columns of what was decided, as pure functions (no
  Kafka, no clock, no metrics);
- :mod:`.scorer`: :class:`~.scorer.Scorer`, the models once per batch, budgets, shadows,
  the collapse watch and the metrics around :func:`~.decide.score_batch`;
- :mod:`.loop`: :class:`~.loop.ScoreLoop`, its own consumer (group ``<app_id>-score``),
  whole fetched batches, one produce batch per topic partition, commits after the acks.
"""

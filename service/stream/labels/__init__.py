"""The learning path: label requests and labels in, model versions out, safe to redo.

- :mod:`.protocol`: label -> model as pure functions (join, park, the shadows' update);
- :mod:`.joiner`: :class:`~.joiner.LabelJoiner`, the protocol over the learner's state
  (what is written, in which order);
- :mod:`.state`: the typed stores (pending, parked, models) over any table of bytes;
- :mod:`.tables`: the learner's tables in memory, every write a changelog record, read back
  when a partition is assigned;
- :mod:`.loop`: :class:`~.loop.LearnLoop`, its own consumer (group ``<app_id>-learn``), whole
  fetched batches, durable before commit;
- :mod:`.rebuild`: a model rebuilt from its label log through the same protocol.
"""

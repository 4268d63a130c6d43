"""The Kafka plumbing both loops share, and the one catalogue of topics.

- :mod:`.topics`: THE catalogue of the worker's topics and tables (declaration, checks, the
  learner's subscription and tables, the desk's readers and the docs' table come from it);
- :mod:`.guard`: the check that the cluster's topics fit the catalogue (start-up, check mode,
  the partition guard);
- :mod:`.clients`: plain aiokafka clients (group-less readers, topic metadata, one-off
  produce, the loops' consumers and producers, the tools' :class:`~.clients.Client`);
- :mod:`.produce`: records out (:class:`~.produce.OutRecord`), one produce batch per topic
  partition (:class:`~.produce.BatchProducer`), Kafka's partitioner;
- :mod:`.groups`: what a loop does with its consumer group (rebalance listener, where a
  partition starts, commits, seeking back);
- :mod:`.loop`: how the worker sees a loop's consumer (:class:`~.loop.LoopView`, one
  :class:`~.loop.RoutedView` over both) and what a loop processed (:class:`~.loop.Progress`);
- :mod:`.unreadable`: record batches a consumer cannot read (stopped at or skipped, loudly);
- :mod:`.inflate`: decompression within ``max_inflated_bytes`` (a bomb is refused, never
  inflated whole);
- :mod:`.internals`: every use of a faust or aiokafka internal, with the version it was
  written against (among them the bound installed as aiokafka's decoders).
"""

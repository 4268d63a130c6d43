"""How well a model is doing, from the labels it gets and the decisions it makes.

- :mod:`.estimate`: :class:`~.estimate.RiskEstimate`, the importance-weighted 0-d-1 risk with
  a score interval, and :func:`~.estimate.importance_weight`;
- :mod:`.shadow`: a shadow learns from its champion's labels
  (:func:`~.shadow.learn_from_champion`) and is judged by a :class:`~.shadow.Scorecard`;
- :mod:`.collapse`: :class:`~.collapse.CollapseWatch`, a model that rejects (nearly)
  everything while rho keeps growing.
"""

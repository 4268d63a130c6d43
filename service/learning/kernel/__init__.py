"""Kernel reject-option learners with a bounded support set (the paper's appendix).

- :mod:`.kernels`: the kernels (linear, polynomial, RBF, and the data-scaled RBF);
- :mod:`.learner`: :class:`~.learner.KernelLearner`, what every kernel learner shares (the
  support set and its budget, the capped rho, the state record);
- :mod:`.dral`, :mod:`.dsal`: :class:`~.dral.KernelDRAL`, :class:`~.dsal.KernelDSAL` and
  :class:`~.dsal.KernelDSOL`;
- :mod:`.defaults`: their default steps (the linear rule with ``K(x, x)`` for ``|x|^2``).
"""

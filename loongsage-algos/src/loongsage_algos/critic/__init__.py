"""The value model of values-based advantage estimators (``gae``), as the step term ``critic``.

``config`` (the ``algorithm.critic`` section), ``step`` (the step term: validation, memory
estimate, build), ``extension`` (the critic's actor and the training step's hooks), ``engine``
(``embedded_critic``, the value model engine).
"""

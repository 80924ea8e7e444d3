"""A fit's resumable checkpoints, one module per role:

- :mod:`~raycse.train.checkpoints.files`: the files of one checkpoint (layout, writing, verifying, loading);
- :mod:`~raycse.train.checkpoints.choice`: which checkpoint a fit resumes from (the furthest whole one);
- :mod:`~raycse.train.checkpoints.in_fit`: what the worker loop does with them (each one written and
  reported to Ray Train, the chosen one restored).
"""

"""Batch construction: group orders (random, knn, shingle, cluster, none) packed into batches of row ids.

corpus (raycse.data.dataset) -> features (embed) -> group order (strategies, knn; registry, builtin) -> batches
(batches, layout). :func:`raycse.grouping.epochs.plan_epoch` groups and packs one epoch before a fit; the train
workers regroup in it with the same pieces (raycse.train.regroup). A mixture's steps: mixing.
"""

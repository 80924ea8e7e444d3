"""Ray Train: the driver (``driver.py``) and the per-worker loop (``loop.py``)."""

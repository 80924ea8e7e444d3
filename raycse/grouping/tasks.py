"""Ray tasks of the grouping steps, waited for with a bound."""

from __future__ import annotations


# A shard of the kNN search on 2 CPUs takes minutes at 10M vectors; a task still missing after
# this long is waiting for a node that will not come (or hung), not computing.
TASK_WAIT_ENV = "RAYCSE_GROUPING_TASK_TIMEOUT_S"
TASK_WAIT_S = 3600.0


def wait_limit() -> float:
    """Seconds to wait for the grouping's Ray tasks: ``RAYCSE_GROUPING_TASK_TIMEOUT_S`` or 3600."""
    from raycse.platform.conversion import env_seconds

    return env_seconds(TASK_WAIT_ENV, TASK_WAIT_S)


def gather(refs: list, what: str) -> list:
    """``ray.get(refs)``, or a TimeoutError naming ``what`` and how many tasks never finished. Tasks
    still running when the wait ends by an error or an interrupt (Ctrl-C, SIGTERM) are cancelled: on
    a shared cluster, nothing else would stop them."""
    import ray

    limit = wait_limit()
    try:
        _, pending = ray.wait(refs, num_returns=len(refs), timeout=limit)
        if pending:
            raise TimeoutError(f"{len(pending)} of {len(refs)} Ray tasks of {what} did not finish within {limit:g} s "
                               f"(is a node with a free CPU alive? `ray status` shows it); raise {TASK_WAIT_ENV} "
                               "for larger corpora")
        return ray.get(refs, timeout=60)
    except BaseException:
        for ref in refs:
            ray.cancel(ref, force=True)  # (a finished task's cancel does nothing)
        raise

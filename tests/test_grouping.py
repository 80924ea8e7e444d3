"""Ray Data corpus pipeline and grouped batch orders: nothing lost, groups intact, seeded, clear errors."""

import collections
import importlib
import json

import numpy as np
import pytest

from raycse.config import DataConfig, GroupingConfig
from raycse.errors import DataError
from conftest import epoch_batches, lay_out
from raycse.grouping.epochs import plan_epoch
from raycse.grouping import knn as knn_mod
from raycse.grouping.batches import pack
from raycse.grouping.strategies import GroupOrder, keyed_order, knn_order, random_order
from raycse.train.batches import row_examples



# ----------------------------------------------------------------------------- pure parts
def planted(n_clusters=12, per=16, d=24, noise=0.05, seed=0):
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(n_clusters, d))
    labels = np.repeat(np.arange(n_clusters), per)
    x = centers[labels] + noise * rng.normal(size=(len(labels), d))
    perm = rng.permutation(len(labels))
    return x[perm].astype(np.float32), labels[perm]


def test_exact_knn_matches_brute_force_and_shards_merge_identically(ray_cluster):
    x, _ = planted(noise=0.5)
    res = knn_mod.search(x, 5, method="exact")
    xn = x / np.linalg.norm(x, axis=1, keepdims=True)
    sims = xn @ xn.T
    np.fill_diagonal(sims, -np.inf)
    brute = np.argsort(-sims, axis=1)[:, :5]
    assert (res.neighbours == brute).mean() > 0.99  # ties may swap
    sharded = knn_mod.search(x, 5, method="exact", shards=3)
    assert np.array_equal(sharded.neighbours, res.neighbours) and len(sharded.shard_seconds) == 3
    assert res.recall is None  # exact: nothing to measure
    cells = knn_mod.search(x, 5, method="cells", cell_size=40, neighbour_cells=3)
    cells_sharded = knn_mod.search(x, 5, method="cells", cell_size=40, neighbour_cells=3, shards=2)
    assert np.array_equal(cells.neighbours, cells_sharded.neighbours)  # cells split over Ray tasks


def test_ivf_reports_recall_against_exact():
    x, _ = planted(n_clusters=20, per=100, noise=0.3)
    res = knn_mod.search(x, 8, method="ivf", nlist=20, nprobe=20, recall_sample=200)
    assert res.method == "ivf" and res.recall == pytest.approx(1.0)  # every list probed: exact
    low = knn_mod.search(x, 8, method="ivf", nlist=20, nprobe=1, recall_sample=200)
    assert 0 < low.recall <= 1.0
    assert res.neighbours.shape == (2000, 8) and not (res.neighbours == np.arange(2000)[:, None]).any()


def test_cell_partition_covers_every_row_once_in_cells_of_the_asked_size():
    from raycse.grouping.cells import partition

    x, _ = planted(n_clusters=40, per=100, d=16, noise=0.3)
    cells = partition(knn_mod.normalize(x), cell_size=100, neighbour_cells=5, seed=0)
    assert sorted(cells.order.tolist()) == list(range(len(x)))  # a partition: each row in one cell
    sizes = np.diff(cells.bounds)
    assert 30 <= cells.count <= 50 and sizes.sum() == len(x)  # ~N / cell_size cells
    assert cells.near.shape == (cells.count, 5)
    assert all(c in cells.near[c] for c in range(cells.count))  # a cell is always joined with itself


def test_cells_are_even_in_size_where_the_clusters_are_not():
    """A join costs |cell| x |its near cells|, so no cell may grow with N: on 60 planted clusters
    of uneven size (k-means cells came out 1 to 51 rows for a size of 16), every cell holds at
    most 1.5x cell_size rows, the rows of a cell are closer to its centroid than to the corpus
    mean, and every neighbour found through these cells is in its row's planted cluster."""
    from raycse.grouping.cells import partition

    rng = np.random.default_rng(5)
    centres = rng.normal(size=(60, 24))
    labels = rng.integers(0, 60, 20000)
    x = (centres[labels] + 0.3 * rng.normal(size=(20000, 24))).astype(np.float32)
    xn = knn_mod.normalize(x)
    cells = partition(xn, cell_size=16, neighbour_cells=4, seed=0)
    sizes = np.diff(cells.bounds)
    assert sorted(cells.order.tolist()) == list(range(len(x))) and sizes.max() <= 24
    assert 12 <= np.median(sizes) <= 20  # about cell_size: a coarse cluster of m rows gets round(m / 16) cells
    spread = np.mean([np.linalg.norm(xn[cells.members(c)] - xn[cells.members(c)].mean(0), axis=1).mean()
                      for c in range(cells.count)])
    assert spread < 0.5 * np.linalg.norm(xn - xn.mean(0), axis=1).mean()  # cells are compact, not arbitrary
    found = knn_mod.search(x, 8, method="cells", cell_size=16, neighbour_cells=4, recall_sample=0).neighbours
    assert (found >= 0).all() and (labels[found] == labels[:, None]).all()


def test_cell_join_is_each_rows_top_k_over_its_near_cells():
    """A second implementation from the module's words: for every row, score it against every
    member of the cells its own cell is joined with, and keep the k best."""
    from raycse.grouping.cells import join_cells, partition

    x, _ = planted(n_clusters=10, per=60, d=12, noise=0.6)
    xn = knn_mod.normalize(x)
    cells = partition(xn, cell_size=50, neighbour_cells=3, seed=1)
    rows, ids = join_cells(xn, cells, 0, cells.count, k=7)
    assert sorted(rows.tolist()) == list(range(len(x)))
    cell_of = {}
    for c in range(cells.count):
        for r in cells.members(c):
            cell_of[int(r)] = c
    got = dict(zip(rows.tolist(), ids))
    for r in range(len(x)):
        reach = [int(m) for j in cells.near[cell_of[r]] if j >= 0 for m in cells.members(j)]
        scored = sorted(reach, key=lambda m: -float(sum(a * b for a, b in zip(xn[r], xn[m]))))
        want = scored[:7]
        best = [float(np.dot(xn[r], xn[m])) for m in want]
        have = [float(np.dot(xn[r], xn[m])) for m in got[r]]
        assert np.allclose(have, best, atol=1e-5)  # the same scores, nearest first (ties may swap ids)
        assert set(got[r].tolist()) <= set(reach)


def test_auto_search_takes_the_cell_join_above_the_threshold_and_groups_as_purely_as_exact(caplog):
    """The large-N index (issue 67) against exact search on a clustered set: recall measured, and
    the greedy groups it gives are as pure (one planted cluster each) as exact search's."""
    import logging

    x, labels = planted(n_clusters=150, per=80, d=32, noise=0.4, seed=3)
    cfg = GroupingConfig(strategy="knn", group_size=8, neighbours=32, exact_threshold=5000)  # default cells
    with caplog.at_level(logging.INFO, logger="raycse.grouping"):
        approx = knn_order(x, cfg, seed=0, epoch=0)
    assert approx.info["knn_method"] == "cells" and approx.info["knn_recall"] > 0.9
    assert "cell join" in caplog.text and "> grouping.exact_threshold 5,000" in caplog.text  # the choice, and why
    exact = knn_order(x, GroupingConfig(strategy="knn", group_size=8, neighbours=32, search="exact"), seed=0, epoch=0)
    assert sorted(approx.order.tolist()) == list(range(len(x)))

    def purity(go: GroupOrder) -> float:
        return float(np.mean([len(set(labels[g])) == 1 for g in go.groups() if len(g) == 8]))

    assert purity(exact) > 0.9 and purity(approx) >= purity(exact) - 0.02


def test_a_knn_search_larger_than_free_memory_is_refused_in_one_line():
    from raycse.errors import ResourceError

    gib = 2**30
    # 10M x 384 float32 normalised (15.4 GB; the cell join makes no other copy) + (N, 65) int32 ids (2.6 GB)
    assert knn_mod.memory_needed(10_000_000, 384, 64, "cells") == 10_000_000 * (384 * 4 + 65 * 4)
    # in float16, given normalised: only the ids (each row's own id is dropped in place)
    assert knn_mod.memory_needed(10_000_000, 384, 64, "cells", normalized=True, itemsize=2) == 10_000_000 * 65 * 4
    # exact search: faiss's index holds a float32 copy
    assert knn_mod.memory_needed(10_000_000, 384, 64, "exact", normalized=True) == 10_000_000 * (384 * 4 + 129 * 4)
    with pytest.raises(ResourceError) as refused:
        knn_mod.check_memory(10_000_000, 384, 64, "cells", available=16 * gib)
    line = str(refused.value)
    assert "\n" not in line and "10,000,000 examples" in line and "--grouping cluster" in line
    knn_mod.check_memory(100_000, 384, 64, "cells", available=16 * gib)  # fits: nothing said


def test_a_knn_grouping_too_large_for_memory_is_refused_before_it_embeds(capsys):
    """The run's check before the corpus is embedded (hours at 10M on CPUs): the vectors as grouping
    would keep them (float16 here: float32 would take over a quarter of the memory) plus the search's
    (N, k+1) ids must fit in the free memory, else one line naming the ways out."""
    from raycse.errors import ResourceError
    from raycse.grouping.embed import check_room_to_group

    gib = 2**30
    knn_run = GroupingConfig(strategy="knn")
    # 10M x 384 in float16 (7.7 GB) + (N, 65) int32 ids (2.6 GB) = 10.3 GB
    check_room_to_group(10_000_000, 384, knn_run, available=12 * gib)
    with pytest.raises(ResourceError) as refused:
        check_room_to_group(10_000_000, 384, knn_run, available=9 * gib)
    line = str(refused.value)
    assert "\n" not in line and "10,000,000 examples (384-d, 64 neighbours)" in line and "--grouping cluster" in line
    assert "~9.6 GiB" in line and "9.0 GiB is free" in line, line
    assert capsys.readouterr().out == ""  # the float16 choice is said when the vectors are made, not here
    # exact search (few examples) also holds faiss's float32 copy
    with pytest.raises(ResourceError):
        check_room_to_group(40_000, 384, knn_run, available=100 * 2**20)
    check_room_to_group(10_000_000, 384, GroupingConfig(strategy="cluster"), available=1)  # no neighbour lists
    check_room_to_group(10_000_000, None, knn_run, available=1)  # width unknown: the search checks again


@pytest.mark.parametrize("value", ["soon", "0", "-5", "nan", "inf"])
def test_a_bad_grouping_task_timeout_is_one_line(value, monkeypatch):
    from raycse.errors import ConfigError
    from raycse.grouping import tasks

    monkeypatch.setenv(tasks.TASK_WAIT_ENV, value)
    with pytest.raises(ConfigError, match=f"{tasks.TASK_WAIT_ENV} must be a number of seconds > 0, got '{value}'"):
        tasks.wait_limit()
    monkeypatch.setenv(tasks.TASK_WAIT_ENV, "90")
    assert tasks.wait_limit() == 90.0


def test_grouping_tasks_left_by_a_timeout_or_an_interrupt_are_cancelled(ray_cluster, monkeypatch):
    """The driver's wait for the kNN search's Ray tasks ends by its bound or by Ctrl-C (at once, under
    raycse's signal handler): either way the tasks still running are cancelled (on a shared cluster
    nothing else would stop them), and a timeout says what did not finish and how to wait longer."""
    import os
    import signal
    import threading
    import time

    from raycse.grouping import tasks

    @ray_cluster.remote(num_cpus=0)
    def sleeper(seconds):
        time.sleep(seconds)
        return seconds

    def cancelled(ref) -> bool:
        try:
            ray_cluster.get(ref, timeout=20)
        except ray_cluster.exceptions.TaskCancelledError:
            return True
        return False  # it finished: a task left running would instead end this test in GetTimeoutError

    monkeypatch.setenv(tasks.TASK_WAIT_ENV, "2")
    refs = [sleeper.remote(0), sleeper.remote(600)]
    with pytest.raises(TimeoutError, match=f"1 of 2 Ray tasks of the test search did not finish within 2 s.*"
                                           f"raise {tasks.TASK_WAIT_ENV}"):
        tasks.gather(refs, "the test search")
    assert ray_cluster.get(refs[0], timeout=20) == 0 and cancelled(refs[1])

    monkeypatch.setenv(tasks.TASK_WAIT_ENV, "60")  # (bounds this test if the interrupt never came)
    refs = [sleeper.remote(600), sleeper.remote(600)]
    # raycse's handler, as every command installs it: Ray's waits end at once only for a KeyboardInterrupt
    from raycse.platform import interrupts

    inherited = {sig: signal.getsignal(sig) for sig in interrupts.SIGNALS}
    monkeypatch.setitem(interrupts._state, "installed", False)
    monkeypatch.setitem(interrupts._state, "last", None)
    interrupts.install()
    try:
        ctrl_c = threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT))
        ctrl_c.start()
        started = time.monotonic()
        with pytest.raises(KeyboardInterrupt) as stopped:
            tasks.gather(refs, "the test search")
        assert time.monotonic() - started < 30
        assert interrupts.interrupted(stopped.value).signum == signal.SIGINT  # what the command then says
    finally:
        for sig, handler in inherited.items():
            signal.signal(sig, handler)
    assert cancelled(refs[0]) and cancelled(refs[1])


def test_greedy_groups_partition_and_beat_random_on_planted_clusters():
    x, labels = planted()
    cfg = GroupingConfig(strategy="knn", group_size=4, neighbours=8)
    order = knn_order(x, cfg, seed=1, epoch=0)
    assert sorted(order.order.tolist()) == list(range(len(x)))  # every example exactly once
    assert order.sizes.max() <= 4 and order.sizes.sum() == len(x)
    groups = order.groups()
    assert len(groups[0]) <= len(groups[-1])  # reversed: leftovers first
    xn = knn_mod.normalize(x)

    def in_group_cos(go: GroupOrder) -> float:
        vals = [float((xn[g] @ xn[g].T)[np.triu_indices(len(g), 1)].mean()) for g in go.groups() if len(g) > 1]
        return float(np.mean(vals))

    rand = random_order(len(x), 1, 0)
    rand = GroupOrder(rand.order, np.full(len(x) // 4, 4))
    assert in_group_cos(order) > in_group_cos(rand) + 0.5
    purity = np.mean([len(set(labels[g])) == 1 for g in groups if len(g) == 4])
    assert purity > 0.9


def test_keyed_order_cuts_sorted_keys_into_shuffled_groups():
    keys = np.repeat(np.arange(5), 8)
    go = keyed_order(keys, 4, np.random.default_rng(0))
    assert all(len(set(keys[g])) == 1 for g in go.groups())
    assert sorted(go.order.tolist()) == list(range(40))


def algorithm2_group_ids(sorted_keys: list, k: int) -> list[int]:
    """BSC Algorithm 2 as written: walk the sorted list, a new group id whenever the shingle
    changes, and a new one whenever the current group has reached k."""
    ids, gid, count = [], 0, 0
    for pos, key in enumerate(sorted_keys):
        if pos > 0 and (key != sorted_keys[pos - 1] or count == k):
            gid, count = gid + 1, 0
        ids.append(gid)
        count += 1
    return ids


@pytest.mark.parametrize("runs, k", [((3, 5, 2), 4), ((1, 9, 4, 4, 7), 4), ((6,), 3), ((2, 2, 2, 11), 5)])
def test_keyed_order_follows_bsc_algorithm_2_on_uneven_key_runs(runs, k):
    rng = np.random.default_rng(7)
    keys = np.repeat(rng.permutation(100)[:len(runs)], runs)
    rng.shuffle(keys)
    go = keyed_order(keys, k, np.random.default_rng(0))
    groups = go.groups()
    assert sorted(go.order.tolist()) == list(range(len(keys)))
    assert all(len(set(keys[g].tolist())) == 1 for g in groups)  # no group mixes keys
    sorted_keys = sorted(keys.tolist())
    ids = algorithm2_group_ids(sorted_keys, k)
    want = sorted((sorted_keys[ids.index(g)], ids.count(g)) for g in set(ids))  # (key, size) of each group
    assert sorted((int(keys[g[0]]), len(g)) for g in groups) == want


def test_shingle_is_a_random_subset_of_t_content_words():
    """Algorithm 2's shingle: a random subset of t non-stop words; every subset can come up, keys of
    the same subset agree whatever the word order, and a text with fewer words has its own key."""
    import itertools

    from raycse.data.corpus import text_key
    from raycse.grouping.strategies import shingle_key

    text = "The river city music festival"
    words = ["city", "festival", "music", "river"]  # "the" is a stop word
    subsets = {text_key(" ".join(sorted(c))): c for c in itertools.combinations(words, 2)}
    seen = {shingle_key(text, seed, 0, row, size=2) for seed in range(8) for row in range(30)}
    assert seen == set(subsets)  # all 6 pairs, nothing else
    assert shingle_key("music river", 0, 0, 5, size=2) == shingle_key("river music", 0, 0, 5, size=2)
    lone = {shingle_key("the city", s, 0, 1, size=2) for s in range(5)}
    assert not lone & set(subsets) and len(lone) == 5


def test_greedy_groups_can_leave_identical_neighbours_out():
    """kNN groups without duplicates: a neighbour with the example's own embedding is skipped."""
    x = np.eye(6, dtype=np.float32)[[0, 0, 1, 1, 2, 3]]  # rows 0, 1 and rows 2, 3 are duplicates
    neighbours = knn_mod.search(x, 5, method="exact").neighbours
    plain = knn_mod.greedy_groups(neighbours, 2, np.random.default_rng(0))
    assert any(set(g.tolist()) in ({0, 1}, {2, 3}) for g in plain)
    dropped = knn_mod.greedy_groups(neighbours, 2, np.random.default_rng(0), identical=knn_mod.normalize(x))
    assert sorted(i for g in dropped for i in g.tolist()) == list(range(6))
    assert not any(set(g.tolist()) in ({0, 1}, {2, 3}) for g in dropped)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_duplicates_are_told_from_near_duplicates_in_float16_as_in_float32(dtype):
    """Grouping keeps a large corpus's vectors in float16 (a unit vector's norm is then 1 only to
    ~1e-5): exact duplicates are still left out of each other's group, and a near-duplicate
    (cosine 0.9995: another text) is still grouped with its example."""
    rng = np.random.default_rng(2)
    base = knn_mod.normalize(rng.normal(size=(40, 384)).astype(np.float32))
    near = knn_mod.normalize(base[:20] + 0.03 * knn_mod.normalize(rng.normal(size=(20, 384)).astype(np.float32)))
    x = np.concatenate([base, base[:20], near]).astype(dtype)  # rows 40+i duplicate i, rows 60+i are near i
    assert 0.999 < float(np.mean(np.sum(base[:20] * near, axis=1))) < 1 - 1e-6
    xn = knn_mod.normalize(x)
    assert xn.dtype == dtype
    neighbours = knn_mod.search(xn, 3, method="exact", assume_normalized=True).neighbours
    groups = knn_mod.greedy_groups(neighbours, 2, np.random.default_rng(0), identical=xn)
    pairs = {frozenset(g.tolist()) for g in groups if len(g) == 2}
    assert not any({i, 40 + i} <= p for p in pairs for i in range(20))  # duplicates apart
    assert sum(frozenset({i, 60 + i}) in pairs or frozenset({40 + i, 60 + i}) in pairs for i in range(20)) >= 15


def test_grouping_keeps_embeddings_in_float16_only_where_float32_would_crowd_memory(capsys):
    from raycse.grouping.embed import vector_dtype

    gib = 2**30
    assert vector_dtype(1_000_000, 384, available=22 * gib) == np.float32  # 1.4 GiB: fast float32
    assert capsys.readouterr().out == ""
    assert vector_dtype(10_000_000, 384, available=22 * gib) == np.float16  # 14.3 GiB of 22
    said = capsys.readouterr().out
    assert said.count("\n") == 1 and "10,000,000 embeddings kept normalised in float16" in said and "14.3 GiB" in said


def test_the_cell_join_on_float16_vectors_holds_no_copy_of_all_of_them(monkeypatch):
    """10M x 384 vectors are 15.4 GB in float32: grouping keeps them normalised in float16 and the
    cell join reads them where they lie, so its peak is the id arrays and a cell's rows, not a
    float32 or cell-ordered copy of all N, nor a second id array: each row's own id is dropped in
    place, a chunk at a time (measured with tracemalloc, which counts numpy's buffers)."""
    import tracemalloc

    from raycse.grouping import vectors

    monkeypatch.setattr(vectors, "CHUNK", 4096)  # float16 is read in chunks of float32 far smaller than N
    rng = np.random.default_rng(0)
    x = knn_mod.normalize(rng.normal(size=(60000, 128)).astype(np.float16))
    assert knn_mod.normalize(x) is x  # unit float16 rows (as grouping's embeddings come) are not copied again
    ids = 60000 * (8 + 1) * 4  # (N, k+1) int32
    for module in ("faiss", "torch"):  # imported on first use: their module objects are not the search's memory
        importlib.import_module(module)

    tracemalloc.start()
    try:
        res = knn_mod.search(x, 8, method="cells", assume_normalized=True, recall_sample=0, cell_size=64,
                             neighbour_cells=8)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert res.neighbours.shape == (60000, 8) and res.neighbours.dtype == np.int32
    assert peak < ids + 0.3 * x.nbytes, f"peak {peak / 2**20:.1f} MiB: ids {ids / 2**20:.1f}, x {x.nbytes / 2**20:.1f}"


@pytest.mark.parametrize("n, width, k, dtype", [(5000, 9, 8, np.int32), (5000, 9, 8, np.int64), (6, 6, 8, np.int32),
                                                (5000, 12, 8, np.int32)])
def test_each_rows_own_id_is_dropped_from_its_list(monkeypatch, n, width, k, dtype):
    """Row i's list without i, first k kept, -1 padded: where i is in it, where it is not (ties), on
    lists a chunk of rows apart, in place (the cell join's k + 1 int32 columns) or not."""
    from raycse.grouping import vectors

    monkeypatch.setattr(vectors, "CHUNK", 1000)
    rng = np.random.default_rng(width)
    idx = rng.integers(-1, n, size=(n, width)).astype(dtype)
    own = rng.integers(0, width, size=n)
    with_self = rng.random(n) < 0.9
    idx[np.flatnonzero(with_self), own[with_self]] = np.flatnonzero(with_self)
    idx[~with_self] = np.where(idx[~with_self] == np.flatnonzero(~with_self)[:, None], -1, idx[~with_self])
    expected = np.full((n, k), -1)
    for i in range(n):
        kept = [j for j in idx[i].tolist() if j != i][:k]
        expected[i, :len(kept)] = kept
    got = knn_mod._drop_self(idx.copy(), k)
    assert got.shape == (n, k) and got.dtype == np.int32
    assert np.array_equal(got, expected)


@pytest.mark.parametrize("n, group, batch, world", [(1000, 1, 16, 2), (997, 1, 8, 3), (1200, 4, 16, 2), (40, 1, 64, 1)])
def test_equal_groups_pack_as_first_fit_does_without_a_python_object_per_row(n, group, batch, world):
    from raycse.grouping.batches import _first_fit

    rng = np.random.default_rng(n)
    order = GroupOrder(rng.permutation(n), np.full(n // group, group, dtype=np.int64))
    if n % group:
        order = GroupOrder(order.order[:n - n % group], order.sizes)
    fast, slow = pack(order, batch, world), _first_fit(order, batch, world)
    assert np.array_equal(fast.batches, slow.batches)
    assert (fast.split_groups, fast.dropped) == (slow.split_groups, slow.dropped)


def test_pack_keeps_groups_whole_and_steps_equal():
    x, _ = planted()
    order = knn_order(x, GroupingConfig(strategy="knn", group_size=4, neighbours=8), 1, 0)
    p = pack(order, batch_size=16, world_size=2)
    assert p.steps(2) == len(x) // 32 and p.dropped == len(x) - p.batches.size
    batch_of = {int(i): b for b, row in enumerate(p.batches) for i in row}
    whole = [g for g in order.groups() if all(int(i) in batch_of for i in g)]
    spanning = sum(len({batch_of[int(i)] for i in g}) > 1 for g in whole)
    assert spanning == p.split_groups <= 1  # only when nothing in the look-ahead fits the last slots
    odd = pack(GroupOrder(np.arange(30), np.array([7, 7, 7, 9])), batch_size=8, world_size=1)
    assert odd.split_groups > 0 and odd.batches.size == 24  # nothing fits whole: split, counted


# ----------------------------------------------------------------------------- through Ray Data
def _corpus_file(tmp_path, sentences, extra=b""):
    p = tmp_path / "corpus.txt"
    p.write_bytes(("\n".join(sentences) + "\n\n   \n").encode() + extra)
    return p


def _rows(eb):
    return {name: list(rows) for name, rows in eb.rows.items()}


@pytest.mark.parametrize("strategy", ["random", "shingle", "knn", "cluster"])
def test_every_strategy_loses_and_duplicates_nothing_with_two_workers(ray_cluster, tiny_model, tmp_path, strategy):
    from conftest import make_sentences
    from raycse.data.dataset import load_corpus
    from raycse.grouping.embed import embed_corpus

    sents = make_sentences(150, seed=11)
    corpus = load_corpus(DataConfig(corpus=str(_corpus_file(tmp_path, sents + sents[:10])), dedup=True), seed=3)
    assert corpus.num_examples == len(set(sents)) and corpus.stats.duplicates_dropped == 10
    assert corpus.stats.empty_dropped == 2
    cfg = GroupingConfig(strategy=strategy, group_size=4, neighbours=8)
    eb = epoch_batches(corpus, cfg, batch_size=16, world_size=2, seed=3, epoch=0, first_step=0,
                       vectors=lambda: embed_corpus(corpus, str(tiny_model), 16))
    rows = _rows(eb)
    assert [r["step"] for r in rows["rank0"]] == [r["step"] for r in rows["rank1"]] == list(range(eb.steps))
    seen = collections.Counter(t for rs in rows.values() for r in rs for t in row_examples(r))
    assert max(seen.values()) == 1 and set(seen) <= set(sents)
    assert 0 <= len(set(sents)) - sum(seen.values()) < 32  # only the final partial global batch
    if strategy != "random":  # rows hold whole groups in order: batch b = groups packed in sequence
        groups = eb.order.groups()
        slot = {int(i): k for k, i in enumerate(eb.packing.batches.reshape(-1))}
        # a group is split when the members it keeps lie in more than one batch (one member may be left out
        # with the short last batch: faiss 1.11-1.12's neighbours gave such a group, 1.15's did not)
        spanning = sum(len({slot[int(i)] // 16 for i in g if int(i) in slot}) > 1 for g in groups)
        assert spanning == eb.packing.split_groups <= 1


def test_planted_topics_stay_together_in_worker_batches(ray_cluster, tmp_path):
    """Texts of 8 planted topics; grouping by their (planted) vectors; every row's groups are whole."""
    from raycse.data.dataset import load_corpus

    rng = np.random.default_rng(0)
    centers = rng.normal(size=(8, 16))
    texts = [f"topic{t} sentence {i}" for t in range(8) for i in range(12)]
    corpus = load_corpus(DataConfig(corpus=str(_corpus_file(tmp_path, texts))), seed=5)
    by_id = {r["_id"]: r["text"] for r in corpus.dataset.iter_rows()}
    topic = {i: int(t.split()[0][5:]) for i, t in by_id.items()}
    vecs = np.stack([centers[topic[i]] + 0.01 * rng.normal(size=16) for i in range(len(by_id))])
    eb = epoch_batches(corpus, GroupingConfig(strategy="knn", group_size=4, neighbours=6), 8, 2, 5, 0, 0,
                       vectors=lambda: vecs)
    row_of = {t: (name, k) for name, rs in _rows(eb).items() for k, r in enumerate(rs) for t in r["text"]}
    assert len(row_of) == eb.packing.batches.size
    groups = [g for g in eb.order.groups() if all(by_id[int(i)] in row_of for i in g)]
    assert all(len({topic[int(i)] for i in g}) == 1 for g in groups)  # kNN found the planted topics
    spanning = sum(len({row_of[by_id[int(i)]] for i in g}) > 1 for g in groups)
    assert spanning == eb.packing.split_groups <= 1, (spanning, eb.packing.split_groups, eb.order.sizes)


def test_same_seed_same_order_different_seed_different_order(ray_cluster, tmp_path):
    from conftest import make_sentences
    from raycse.data.dataset import load_corpus

    path = _corpus_file(tmp_path, make_sentences(120, seed=2))

    def order(seed, strategy="shingle"):
        corpus = load_corpus(DataConfig(corpus=str(path)), seed=seed)
        eb = epoch_batches(corpus, GroupingConfig(strategy=strategy, group_size=4), 8, 2, seed, 0, 0)
        return [r["text"] for rs in _rows(eb).values() for r in rs]

    assert order(1) == order(1)
    assert order(1) != order(2)
    assert order(7, "random") == order(7, "random") != order(8, "random")


def test_grouping_none_keeps_the_files_order_every_epoch(ray_cluster, tmp_path):
    """BSC's "w/o shuffle": grouping none reads the corpus without its pre-shuffle and batches it in
    the files' own order (files in name order, lines in file order), the same each epoch."""
    from conftest import make_sentences
    from raycse.data.dataset import load_corpus

    folder = tmp_path / "docs"
    folder.mkdir()
    lines = make_sentences(48, seed=9)
    for i, name in enumerate(("a.txt", "b.txt", "c.txt")):
        (folder / name).write_text("\n".join(lines[16 * i:16 * (i + 1)]) + "\n")
    corpus = load_corpus(DataConfig(corpus=str(folder)), seed=3, shuffle=False)
    text_of = {r["_id"]: r["text"] for r in corpus.dataset.iter_rows()}
    assert [text_of[i] for i in range(48)] == lines
    world, bs = 2, 4
    plans = [plan_epoch(corpus, GroupingConfig(strategy="none"), bs, world, 3, e, e * 6) for e in range(2)]
    rows = lay_out(corpus, plans, world)
    for r in range(world):
        for row in rows[f"rank{r}"]:
            b = (row["step"] - row["epoch"] * 6) * world + r  # batch b of the epoch goes to rank b % world
            assert list(row["text"]) == lines[b * bs:(b + 1) * bs]
    shuffled = load_corpus(DataConfig(corpus=str(folder)), seed=3)
    assert sorted(r["text"] for r in shuffled.dataset.iter_rows()) == sorted(lines)
    assert [r["text"] for r in shuffled.dataset.iter_rows()] != lines  # the default pre-shuffles


def test_several_epochs_laid_out_in_one_pass_follow_each_epochs_plan(ray_cluster, tmp_path):
    """Three epochs (the last cut short by max_steps) laid out together: each rank reads every step
    once, in order, and each (step, rank) row holds exactly the texts of the plan's batch, in its order."""
    from conftest import make_sentences
    from raycse.data.dataset import load_corpus

    path = _corpus_file(tmp_path, make_sentences(100, seed=5))
    corpus = load_corpus(DataConfig(corpus=str(path)), seed=3)
    text_of = {r["_id"]: r["text"] for r in corpus.dataset.iter_rows()}
    world, bs = 2, 8
    spe = corpus.num_examples // bs // world  # 6
    plans = [plan_epoch(corpus, GroupingConfig(strategy="random"), bs, world, 3, e, e * spe,
                        max_steps=(spe if e < 2 else 2)) for e in range(3)]
    assert [p.packing.steps(world) for p in plans] == [spe, spe, 2]
    assert not np.array_equal(plans[0].packing.batches, plans[1].packing.batches)  # each epoch its own order
    laid_out = lay_out(corpus, plans, world)
    for rank in range(world):
        rows = laid_out[f"rank{rank}"]
        assert [r["step"] for r in rows] == list(range(2 * spe + 2))
        for r in rows:
            e = r["epoch"]
            assert e == min(r["step"] // spe, 2)
            b = (r["step"] - e * spe) * world + rank  # batch b of epoch e goes to rank b % world
            assert list(r["text"]) == [text_of[int(i)] for i in plans[e].packing.batches[b]]


def test_bad_corpora_give_one_clear_line(ray_cluster, tmp_path):
    from raycse.data.dataset import load_corpus

    with pytest.raises(DataError, match="corpus file not found"):
        load_corpus(DataConfig(corpus=str(tmp_path / "missing.txt")), 1)
    with pytest.raises(DataError, match="no corpus file matches"):
        load_corpus(DataConfig(corpus=str(tmp_path / "*.nothing")), 1)
    (tmp_path / "blank.txt").write_text("\n   \n\t\n")
    with pytest.raises(DataError, match="no usable text after cleaning"):
        load_corpus(DataConfig(corpus=str(tmp_path / "blank.txt")), 1)
    (tmp_path / "c.jsonl").write_text(json.dumps({"body": "hello there"}) + "\n")
    with pytest.raises(DataError, match=r"column 'text' not found in .*c.jsonl: none of its 1 records has it \(the "
                                        r"first's fields: body\)"):
        load_corpus(DataConfig(corpus=str(tmp_path / "c.jsonl")), 1)
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"body": ["a b c"]}), tmp_path / "c.parquet")
    with pytest.raises(DataError, match="column 'text' not found"):
        load_corpus(DataConfig(corpus=str(tmp_path / "c.parquet")), 1)
    ok = load_corpus(DataConfig(corpus=str(tmp_path / "c.parquet"), text_column="body"), 1)
    assert ok.num_examples == 1
    bad = tmp_path / "bytes.txt"
    bad.write_bytes(b"fine line\nbroken \xff\xfe line\nanother\n")
    with pytest.raises(DataError, match=r"bytes.txt:2: undecodable bytes"):
        load_corpus(DataConfig(corpus=str(bad), on_decode_error="error"), 1)
    replaced = load_corpus(DataConfig(corpus=str(bad)), 1)
    assert replaced.num_examples == 3 and replaced.stats.decode_replaced == 1


def test_globs_several_files_and_character_cap(ray_cluster, tmp_path):
    from raycse.data.dataset import load_corpus

    (tmp_path / "a.txt").write_text("one sentence here\n" + "x" * 500 + "\n")
    (tmp_path / "b.txt").write_text("another sentence\n")
    (tmp_path / "c.jsonl").write_text(json.dumps({"text": "from json"}) + "\n")
    c = load_corpus(DataConfig(corpus=str(tmp_path / "*.txt"), max_chars=100), 1)
    texts = sorted(r["text"] for r in c.dataset.iter_rows())
    assert c.num_examples == 3 and c.stats.truncated == 1 and max(map(len, texts)) == 100
    both = load_corpus(DataConfig(corpus=f"{tmp_path / 'b.txt'},{tmp_path / 'c.jsonl'}"), 1)
    assert sorted(r["text"] for r in both.dataset.iter_rows()) == ["another sentence", "from json"]


def test_pairs_are_grouped_by_their_first_text(ray_cluster, tiny_model, tmp_path):
    from conftest import write_stsb
    from raycse.data.dataset import load_corpus
    from raycse.grouping.embed import embed_corpus

    path = write_stsb(tmp_path / "pairs.csv", n=100, seed=4)
    corpus = load_corpus(DataConfig(corpus=str(path), format="stsb"), seed=1)
    eb = epoch_batches(corpus, GroupingConfig(strategy="knn", group_size=4, neighbours=8), 16, 2, 1, 0, 0,
                       vectors=lambda: embed_corpus(corpus, str(tiny_model), 16))
    pairs = [p for rs in _rows(eb).values() for r in rs for p in row_examples(r)]
    assert len(pairs) == 96 and len(set(pairs)) == 96
    source = {(r["text"], r["pair"]) for r in corpus.dataset.iter_rows()}
    assert {(p.query, p.positive) for p in pairs} <= source
    assert all(p.score is not None and 0 <= p.score <= 1 and p.negatives == () for p in pairs)


def test_pairs_are_keyed_by_their_second_text_when_asked(ray_cluster, tiny_model, tmp_path):
    """BSC: "the case of second elements is the same": grouping.by second keys (and embeds) the pair's a."""
    from conftest import write_stsb
    from raycse.data.dataset import load_corpus
    from raycse.grouping.embed import embed_corpus, shingle_keys
    from raycse.grouping.strategies import shingle_key

    corpus = load_corpus(DataConfig(corpus=str(write_stsb(tmp_path / "pairs.csv", n=40, seed=5)), format="stsb"),
                         seed=1)
    rows = sorted(corpus.dataset.iter_rows(), key=lambda r: r["_id"])
    keys = shingle_keys(corpus, 3, 0, size=2, by="second")
    assert keys.tolist() == [shingle_key(r["pair"], 3, 0, r["_id"], 2) for r in rows]
    second = embed_corpus(corpus, str(tiny_model), 16, precision="fp32", by="second")
    from raycse.model.encoder import Encoder

    want = Encoder.from_pretrained(str(tiny_model)).encode([r["pair"] for r in rows], max_length=16)
    assert np.allclose(second, want, atol=1e-4)
    from raycse.config import RunConfig
    from raycse.errors import ConfigError

    run = RunConfig()
    run.grouping.by = "second"
    with pytest.raises(ConfigError, match="grouping.by: second groups pairs by their second text"):
        run.validate()


def test_hugging_face_dataset_offline_names_the_alternative(monkeypatch):
    from raycse.data.dataset import raw_dataset

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(DataError, match="cannot load Hugging Face dataset 'no-such/dataset-xyz' split 'train'.*"
                                        "save it elsewhere as Parquet/JSONL"):
        raw_dataset(DataConfig(corpus="no-such/dataset-xyz", format="hf"), seed=0)


def test_compcse_subsampling_adds_rows_where_the_corpus_is_read(ray_cluster, tmp_path):
    """The extra rows are made in the Ray Data pipeline: counted, shuffled and numbered with the rest,
    and a run whose subsampling differs does not reuse another's laid-out data."""
    from raycse.config import RunConfig
    from raycse.objectives.compcse import FIELD
    from raycse.train.prepare import data_key, load_run_corpus

    sents = [f"topic{i} north, city{i} river; king{i} road" for i in range(30)] + ["plain sentence"] * 1
    run = RunConfig()
    run.data.corpus = str(_corpus_file(tmp_path, sents))
    run.objective.name = "compcse"
    plain = load_run_corpus(run)
    run.objective.params = {"subsample": "subsuming"}
    sub = load_run_corpus(run)
    texts = [r["text"] for r in sub.dataset.iter_rows()]
    extra = [t for t in texts if FIELD in t]
    # 3 phrases: the halving gives one node below the root, (c0 c1 | c2) -> (c0, c1)
    assert plain.num_examples == 31 and sub.num_examples == 61 and sub.stats.extra_rows == len(extra) == 30
    assert sorted(r["_id"] for r in sub.dataset.iter_rows()) == list(range(61))
    parts = sorted(tuple(t.split(FIELD)) for t in extra)
    assert parts == sorted((f"topic{i} north, city{i} river;", f"topic{i} north,", f"city{i} river;") for i in range(30))
    follows = sum(texts[k - 1].startswith(texts[k].split(FIELD)[0]) for k, t in enumerate(texts) if FIELD in t and k)
    assert follows < 30  # shuffled in with the rest, not left behind their sentence
    key = data_key(run)
    run.objective.params = {"subsample": "adjacent"}
    assert data_key(run) != key


def test_faiss_loads_without_its_loaders_lines_where_a_process_logs_at_info():
    """Ray's workers log at INFO, where faiss's loader said a line per ISA build the wheel lacks
    (``ModuleNotFoundError("No module named 'faiss.swigfaiss_avx512_spr'")`` in every kNN run's output)."""
    import subprocess
    import sys

    code = ("import logging; logging.basicConfig(level=logging.INFO); import numpy as np; "
            "from raycse.grouping import knn; "
            "x = np.random.default_rng(0).standard_normal((64, 8)).astype('float32'); "
            "print(knn.measure_recall(x, np.zeros((64, 2), dtype='int64'), 8, 0))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert 0 <= float(done.stdout) <= 1
    assert "faiss" not in done.stderr, done.stderr

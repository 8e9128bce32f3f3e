"""Two real torch.distributed (gloo) ranks stream uneven files: equal steps, every row once."""

from __future__ import annotations

import json
import multiprocessing as mp
import os

import pytest

from tests.conftest_stream import write_numbered
from tests.helpers import kill_tree


def _rank_main(rank: int, world_size: int, init_file: str, paths: list[str], out: str) -> None:
    import torch
    import torch.distributed as dist

    from naiad.parallel import WorkerPool
    from naiad.stream.batches import StreamOptions, iter_batches
    from naiad.stream.reads import make_handler_factory
    from tests.conftest_stream import ids_of, open_numbered

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
    try:
        src = open_numbered(paths, "csv")
        # rank and world_size are not given: they come from torch.distributed.
        opts = StreamOptions(batch_size=4, shuffle=True, seed=2, shuffle_buffer=10)
        ids: list[int] = []
        steps = 0
        with WorkerPool(make_handler_factory(src), num_workers=1, mode="thread") as pool:
            for batch in iter_batches(src, opts, epoch=0, imap=pool.imap):
                # A collective per step, as DDP's gradient all-reduce: a rank with one step
                # fewer would leave the other waiting here forever.
                n = torch.tensor([len(ids_of(batch))])
                dist.all_reduce(n)
                ids += ids_of(batch).tolist()
                steps += 1
        with open(out, "w") as f:
            json.dump({"ids": ids, "steps": steps}, f)
    finally:
        dist.destroy_process_group()


@pytest.mark.timeout(120)
def test_ddp_ranks_take_equal_steps_and_every_row_once(tmp_path):
    paths = write_numbered(str(tmp_path), "csv", [50, 0, 27])  # 77 rows: ranks get 38 and 39
    ctx = mp.get_context("spawn")
    outs = [str(tmp_path / f"rank{r}.json") for r in range(2)]
    procs = [
        ctx.Process(target=_rank_main, args=(r, 2, str(tmp_path / "init"), paths, outs[r]))
        for r in range(2)
    ]
    try:
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout=100)
    finally:  # a rank that hangs (or a test timeout): the ranks end, with their workers
        for p in procs:
            if p.pid is not None and p.exitcode is None:
                kill_tree(p.pid)
    assert [p.exitcode for p in procs] == [0, 0]
    results = [json.load(open(o)) for o in outs]
    assert results[0]["steps"] == results[1]["steps"] == 10
    assert sorted(results[0]["ids"] + results[1]["ids"]) == list(range(77))
    assert os.path.exists(outs[0])


def _destroyed_rank_main(rank: int, world_size: int, init_file: str, paths: list[str], out: str) -> None:
    import torch.distributed as dist

    import naiad
    from tests.conftest_stream import ids_of, open_numbered

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
    loader = naiad.DataLoader(open_numbered(paths, "csv"), batch_size=4, shuffle=True, seed=2, shuffle_buffer=10)
    try:
        it = iter(loader)
        first = [ids_of(next(it)).tolist() for _ in range(3)]  # planned on 2 ranks
        dist.destroy_process_group()  # as a script does before its last checkpoint
        mid = loader.state_dict()
        rest = [ids_of(b).tolist() for b in it]
        end = loader.state_dict()  # every batch received: the next epoch's start
    finally:
        loader.close()
    with open(out, "w") as f:
        json.dump({"first": first, "mid": mid, "rest": rest, "end": end}, f)


@pytest.mark.timeout(120)
def test_state_after_destroy_process_group_names_the_world_size_the_pass_was_planned_with(tmp_path):
    import naiad
    from tests.conftest_stream import ids_of, open_numbered

    paths = write_numbered(str(tmp_path), "csv", [50, 0, 27])
    ctx = mp.get_context("spawn")
    outs = [str(tmp_path / f"rank{r}.json") for r in range(2)]
    procs = [
        ctx.Process(target=_destroyed_rank_main, args=(r, 2, str(tmp_path / "init"), paths, outs[r]))
        for r in range(2)
    ]
    try:
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout=100)
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(timeout=10)
    assert [p.exitcode for p in procs] == [0, 0]
    results = [json.load(open(o)) for o in outs]
    seen = []
    for rank, result in enumerate(results):
        mid, end = result["mid"]["pipeline"], result["end"]["pipeline"]
        assert (mid["plan"]["rank"], mid["plan"]["world_size"], mid["batches"]["yielded"]) == (rank, 2, 3)
        assert (result["end"]["epoch"], end["plan"]["rank"], end["plan"]["world_size"]) == (1, rank, 2)
        # The state resumes that rank exactly where the pass stood.
        resumed = naiad.DataLoader(open_numbered(paths, "csv"), batch_size=4, shuffle=True, seed=2,
                                   shuffle_buffer=10, rank=rank, world_size=2)
        try:
            resumed.load_state_dict(result["mid"])
            assert [ids_of(b).tolist() for b in resumed] == result["rest"]
        finally:
            resumed.close()
        seen += [i for batch in result["first"] + result["rest"] for i in batch]
    assert sorted(seen) == list(range(77))

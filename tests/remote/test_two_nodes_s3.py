"""Two machines, one bucket (issue 24): two torchrun agents on this host stand in for two nodes
(c10d rendezvous on loopback, 2 ranks each, gloo) and train one DDP job into one ``s3://`` store
on the moto server. One node's whole process tree is SIGKILLed mid-run while the other node's
ranks are inside the next all-reduce; that node then fails on its own (waited for, bounded), as
in life. Both agents rerun: the job resumes from the last complete step and ends bitwise equal
to an uninterrupted run of the same two-node layout. Either node may die: the one of global
rank 0 (the timeline's lease holder, spec §21) or the other one.

4 ranks, so both runs use ``DDP(find_unused_parameters=True)``: see
tests/distributed/test_ddp.py's four-rank test for why default DDP is not bitwise across a
restart at 3+ ranks even without Ravex.
"""

from __future__ import annotations

import uuid

import pytest
import torch
from rhelpers import BUCKET, KEY, SECRET, options_for

from ravex.format import open_store
from ravex.format.history.leases import generations, read_holder
from tests.distributed import dharness as h

NODES, PER_NODE = 2, 2
RANKS = range(NODES * PER_NODE)
STEPS = 8  # 2 epochs x 4 batches per rank at 4 ranks
EVERY, KILL_AT = 2, 5  # steps 2 and 4 are complete when the node dies; the rerun resumes from 4


@pytest.fixture(scope="module")
def two_node_reference(tmp_path_factory):
    """The uninterrupted two-node job without Ravex: its joined result and final state."""
    cwd = tmp_path_factory.mktemp("two-node-reference")
    out = cwd / "final.pt"
    nodes = h.run_nodes(PER_NODE, cwd, h.env(T_ENTRY="none", T_FIND_UNUSED="1", T_OUT=str(out)), NODES)
    ref = h.joined(nodes)
    assert all(n.returncode == 0 for n in nodes), ref.explain()
    assert all(len(ref.losses(r)) == STEPS for r in RANKS), ref.explain()
    return ref, torch.load(out, weights_only=False)


def _node_of(rank: int, nodes_lines: list[list[str]]) -> int | None:
    """The agent whose ranks include ``rank`` (global ranks are assigned at the rendezvous)."""
    return next((n for n, lines in enumerate(nodes_lines) if any(ln.startswith(f"LOSS {rank} ") for ln in lines)),
                None)


@pytest.mark.parametrize("victim_rank", [0, 2], ids=["node-of-rank-0", "other-node"])
def test_one_node_sigkilled_then_both_rerun_is_bitwise(moto_server, tmp_path, two_node_reference, victim_rank):
    ref, ref_state = two_node_reference
    url = f"s3://{BUCKET}/two-nodes-{uuid.uuid4().hex[:12]}"
    cwd = h.workdir(tmp_path, every=EVERY, keep_last="null",
                    storage=f"{{url: '{url}', endpoint: '{moto_server.url}', region: us-east-1, path_style: true}}")
    env = h.env(T_ENTRY="activate", T_FIND_UNUSED="1", AWS_ACCESS_KEY_ID=KEY, AWS_SECRET_ACCESS_KEY=SECRET)
    # Every rank flushes step 4's checkpoint at step 5 and says BLOCKED; the victim's ranks wait
    # there, the other node's train on into step 6's all-reduce, where the kill fails them.
    victims = f"{victim_rank},{victim_rank + 1}"  # the ranks of one node (2 per node, in order)
    all_blocked = h.all_ranks("BLOCKED", len(RANKS))

    def victim(nodes_lines: list[list[str]]) -> int | None:
        every_line = [ln for lines in nodes_lines for ln in lines]
        return _node_of(victim_rank, nodes_lines) if all_blocked(every_line) else None

    first = h.run_nodes(PER_NODE, cwd, dict(env, T_BLOCK_AT=str(KILL_AT), T_BLOCK_RANKS=victims), NODES,
                        kill_node_when=victim)
    joined = h.joined(first)
    assert [n.killed for n in first].count(True) == 1, joined.explain()
    survivor = next(n for n in first if not n.killed)
    assert not survivor.hung and survivor.returncode != 0, survivor.explain()  # it failed, on its own
    # its agent SIGTERMs the ranks still running: no crashed rank promises a checkpoint then
    assert "step they next agree on" not in survivor.stderr, survivor.explain()
    for rank in RANKS:
        got = joined.losses(rank)
        assert got and got == {s: v for s, v in ref.losses(rank).items() if s in got}, "ravex perturbed training"
    store = open_store(url, storage_options=options_for(moto_server.url))
    assert {2, 4} <= set(store.complete_steps()), joined.explain()

    out = tmp_path / "final.pt"
    second = h.run_nodes(PER_NODE, cwd, dict(env, T_OUT=str(out), RAVEX_LOG_LEVEL="DEBUG"), NODES)
    rerun = h.joined(second)
    assert all(n.returncode == 0 for n in second), rerun.explain()
    for rank in RANKS:
        assert rerun.restored(rank) == 4, rerun.explain()
        assert rerun.losses(rank) == {s: v for s, v in ref.losses(rank).items() if s > 4}, f"rank {rank}"
    h.assert_same_state(torch.load(out, weights_only=False), ref_state)
    assert "FAILED" not in rerun.stderr, rerun.explain()
    # rank 0 alone read the step's manifests and handed them to the three others, across nodes
    # (the others say so at DEBUG; the job's line is rank 0's)
    assert rerun.stderr.count("the manifests from rank 0") == len(RANKS) - 1, rerun.explain()

    store = open_store(url, storage_options=options_for(moto_server.url))
    reader = store.open_step(STEPS)
    assert reader.world_size == len(RANKS) and len({m.run for m in reader.manifests}) == 1
    # one lease for the job, taken by global rank 0 alone in each run (spec §21), and released
    assert generations(store.storage, "main") == [2]
    holder = read_holder(store.storage, "main")
    assert holder is not None and holder.released

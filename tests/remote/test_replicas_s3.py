"""``replicas: 1`` (issue 33 item 2): two torchrun agents as two machines on this host, one rank
each, each machine with its own local tier (``RAVEX_LOCAL`` per agent), one moto S3 bucket as
the durable tier. Checkpoints every 4 steps land in both local tiers (each rank's own, and a
replica of the other machine's rank); only every 2nd is copied to the bucket. One machine is
SIGKILLed after step 13 (checkpoint 12 only in the local tiers, 8 in the bucket; the other
machine fails on its own), its local tier is deleted, and the rerun resumes from step 12 through
the other machine's tier, not from the bucket's 8, ending bitwise equal to an uninterrupted run.
A rollback (``resume: 8``) forks the timeline in both machines' tiers. Two machines of two ranks
pair by local rank, and three machines keep a full copy of each step on each."""

from __future__ import annotations

import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from rhelpers import BUCKET, KEY, SECRET, options_for

from ravex.format import open_store
from ravex.format.reports.validate import validate
from tests.distributed import dharness as h

STEPS = 16  # 2 epochs x 8 batches per rank at 2 ranks


def _both_blocked():
    """True once both agents' ranks printed BLOCKED (each agent's lines come separately)."""
    seen: set[str] = set()

    def check(lines: list[str]) -> bool:
        if lines and lines[-1].startswith("BLOCKED "):
            seen.add(lines[-1].split()[1])
        return seen >= {"0", "1"}

    return check


@dataclass
class Job:
    cwd: Path
    url: str
    tiers: list[Path]
    environ: dict[str, str]  # what both agents' environments add (the bucket's credentials)

    @property
    def per_node(self) -> list[dict[str, str]]:
        return [{"RAVEX_LOCAL": str(tier)} for tier in self.tiers]

    def run(self, **extra: str) -> list[h.Result]:
        return h.run_nodes(1, self.cwd, h.env(T_ENTRY="activate", **self.environ, **extra), nnodes=len(self.tiers),
                           node_env=self.per_node)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The uninterrupted 2-rank run without Ravex: its result and final state."""
    where = tmp_path_factory.mktemp("replicas-reference")
    ref = h.run(2, where, h.env(T_ENTRY="none", T_OUT=str(where / "final.pt")))
    assert ref.returncode == 0, ref.explain()
    return ref, torch.load(where / "final.pt", weights_only=False)


def _job(moto_server, folder: Path, name: str, every: int, **env: str) -> Job:
    """A two-machine job's folder: checkpoints every ``every`` steps, every 2nd to the bucket."""
    url = f"s3://{BUCKET}/{name}-{uuid.uuid4().hex[:12]}"
    cwd = folder / "job"
    cwd.mkdir()
    (cwd / "ravex.yaml").write_text(
        f"storage:\n  url: {url}\n  endpoint: {moto_server.url}\n  region: us-east-1\n  path_style: true\n"
        f"checkpoint_every: {every}\npersist_every: 2\nkeep_last: 2\npersist_keep_last: null\nreplicas: 1\n")
    return Job(cwd, url, [cwd / "local-node0", cwd / "local-node1"],
               {"AWS_ACCESS_KEY_ID": KEY, "AWS_SECRET_ACCESS_KEY": SECRET, **env})


@pytest.fixture
def job(moto_server, tmp_path) -> Job:
    return _job(moto_server, tmp_path, "replicas", 4)


def _first_run(job: Job, reference, moto_server, killed: int | None) -> None:
    """Train to step 13 and SIGKILL: machine ``killed`` alone (its rank blocks after step 13 while
    the other trains on into the next all-reduce and fails on its own, as a cluster's surviving
    machines do), or the whole job (None). Step 12 is then in both local tiers, 8 in the bucket."""
    ref, _ = reference
    environ = h.env(T_ENTRY="activate", T_BLOCK_AT="13", **job.environ)
    if killed is None:
        results = h.run_nodes(1, job.cwd, environ, nnodes=2, node_env=job.per_node, kill_job_when=_both_blocked())
    else:
        environ["T_BLOCK_RANKS"] = str(killed)  # rank r is machine r's one rank
        seen = _both_blocked()
        results = h.run_nodes(1, job.cwd, environ, nnodes=2, node_env=job.per_node,
                              kill_node_when=lambda lines: killed if seen(lines[0]) or seen(lines[1]) else None)
        assert not results[1 - killed].hung, results[1 - killed].explain()  # it failed on its own
    first = h.joined(results)
    assert first.killed, first.explain()
    for rank in (0, 1):
        got = first.losses(rank)
        assert got == {s: v for s, v in ref.losses(rank).items() if s in got}, "ravex perturbed training"
    for tier in job.tiers:  # each machine's tier holds both ranks' manifests of steps 8 and 12
        assert open_store(tier).current().complete_steps()[-2:] == [8, 12], first.explain()
    assert _bucket(job, moto_server).current().complete_steps() == [8], first.explain()  # the 2nd checkpoint
    assert "replicated: tiers local + replica" in first.stderr, first.explain()
    for result in results if killed is None else [results[killed]]:  # a survivor's copies fail once alone
        assert "FAILED" not in result.stderr and "Traceback" not in result.stderr, first.explain()


def _bucket(job: Job, moto_server):
    return open_store(job.url, storage_options=options_for(moto_server.url))


def _check_resumed(second: h.Result, reference, expect: int) -> None:
    ref, _ = reference
    assert second.returncode == 0, second.explain()
    for rank in (0, 1):
        assert second.restored(rank) == expect, second.explain()
        assert second.losses(rank) == {s: v for s, v in ref.losses(rank).items() if s > expect}, second.explain()


@pytest.mark.parametrize("lost", [1, 0], ids=["node1-lost", "node0-lost"])
def test_a_machine_lost_resumes_the_newest_local_step_from_its_replica_bitwise(job, moto_server, tmp_path,
                                                                              reference, lost):
    _first_run(job, reference, moto_server, killed=lost)
    shutil.rmtree(job.tiers[lost])  # the machine is gone with its disk; a new one takes its place
    out = tmp_path / "final.pt"
    results = job.run(T_OUT=str(out))
    second = h.joined(results)
    _check_resumed(second, reference, 12)
    assert f"ravex: step 12 came from rank {1 - lost}'s machine" in results[lost].stderr, second.explain()
    assert "came from the durable tier" not in second.stderr, second.explain()
    # the lost machine's rank checked itself against its own witness, which came back with the step
    assert "ravex: resume verified: after step 12, step 13 matches the run that wrote it on 2 ranks" \
        in second.stderr, second.explain()
    assert "FAILED" not in second.stderr and "did not" not in second.stderr, second.explain()
    h.assert_same_state(torch.load(out, weights_only=False), reference[1])
    assert _bucket(job, moto_server).current().complete_steps()[-1] == STEPS, second.explain()  # at exit
    for tier in job.tiers:
        assert open_store(tier).current().complete_steps()[-1] == STEPS, second.explain()


def test_a_rollback_forks_the_timeline_in_both_machines_tiers_bitwise(job, moto_server, tmp_path, reference):
    """``resume: 8`` (older than the newest step, 12): rank 0 forks the timeline in its machine's
    tier; the other machine's rank takes the fork from there, and both tiers get its steps."""
    _first_run(job, reference, moto_server, killed=None)
    out = tmp_path / "final.pt"
    second = h.joined(job.run(T_OUT=str(out), RAVEX_RESUME="8"))
    _check_resumed(second, reference, 8)
    h.assert_same_state(torch.load(out, weights_only=False), reference[1])
    for tier in job.tiers:
        current = open_store(tier).current()
        assert current.timeline.fork_step == 8 and current.complete_steps()[-1] == STEPS, second.explain()


@pytest.mark.slow
def test_two_ranks_per_machine_pair_by_local_rank_and_resume_bitwise(moto_server, tmp_path):
    """Two machines of two ranks each (ranks 0,1 | 2,3; pairs 0-2 and 1-3): each tier holds all
    four ranks' manifests; with machine 1's tier gone its two ranks take step 6 from machine 0's
    tier, once (under the tier's lock), and the job ends bitwise equal to an uninterrupted run.
    ``find_unused_parameters`` keeps 4-rank DDP bitwise across a restart (see test_ddp)."""
    ref_dir = tmp_path / "ref"
    ref_dir.mkdir()
    ref_out = ref_dir / "final.pt"
    ref = h.run(4, ref_dir, h.env(T_ENTRY="none", T_FIND_UNUSED="1", T_OUT=str(ref_out)))
    assert ref.returncode == 0, ref.explain()
    job = _job(moto_server, tmp_path, "replicas4", 2, T_FIND_UNUSED="1")
    seen: set[str] = set()

    def all_blocked(lines: list[str]) -> bool:
        if lines and lines[-1].startswith("BLOCKED "):
            seen.add(lines[-1].split()[1])
        return seen >= {"0", "1", "2", "3"}

    first = h.joined(h.run_nodes(2, job.cwd, h.env(T_ENTRY="activate", T_BLOCK_AT="7", **job.environ), nnodes=2,
                                 node_env=job.per_node, kill_job_when=all_blocked))
    assert first.killed, first.explain()
    for tier in job.tiers:
        store = open_store(tier).current()
        assert store.complete_steps()[-2:] == [4, 6], first.explain()
        assert list(store.step_info(6).ranks) == [0, 1, 2, 3], first.explain()
    assert _bucket(job, moto_server).current().complete_steps() == [4], first.explain()

    shutil.rmtree(job.tiers[1])
    out = tmp_path / "final.pt"
    results = h.run_nodes(2, job.cwd, h.env(T_ENTRY="activate", T_OUT=str(out), **job.environ), nnodes=2,
                          node_env=job.per_node)
    second = h.joined(results)
    assert second.returncode == 0, second.explain()
    assert results[1].stderr.count("ravex: step 6 came from rank") == 1, second.explain()
    for rank in range(4):
        assert second.restored(rank) == 6, second.explain()
        assert second.losses(rank) == {s: v for s, v in ref.losses(rank).items() if s > 6}, second.explain()
    h.assert_same_state(torch.load(out, weights_only=False), torch.load(ref_out, weights_only=False))


def test_three_machines_keep_every_step_on_each_and_resume_a_lost_ones_bitwise(moto_server, tmp_path):
    """Three machines of one rank: each tier holds all three ranks' manifests and objects of each
    step (said once at start: three copies). The middle machine is SIGKILLed after step 7 and its
    tier deleted, and its record of step 7 (its witness of step 6) in the tier the rerun fetches
    step 6 from: the rerun takes step 6 from another machine's tier, not the bucket's 4, its
    witness from the third, verifies itself and ends bitwise equal to an uninterrupted run
    (``find_unused_parameters``: see the 4-rank case). A rollback to the older kept step, whose
    rank-1 witness is gone from every tier, says that rank had no record to verify against,
    forks the timeline in rank 0's tier, and the other two machines take it from there: every
    tier ends on the fork."""
    ref_dir = tmp_path / "ref"
    ref_dir.mkdir()
    ref_out = ref_dir / "final.pt"
    ref = h.run(3, ref_dir, h.env(T_ENTRY="none", T_FIND_UNUSED="1", T_OUT=str(ref_out)))
    assert ref.returncode == 0, ref.explain()
    steps = max(ref.losses(0))  # 64 samples at 3 ranks: 6 batches of each epoch per rank
    job = _job(moto_server, tmp_path, "replicas3", 2, T_FIND_UNUSED="1")
    job.tiers.append(job.cwd / "local-node2")
    seen: set[str] = set()

    def all_flushed(lines: list[list[str]]) -> int | None:
        """Machine 1, once every rank flushed its copies after step 7 (the others train on)."""
        for own in lines:
            if own and own[-1].startswith("BLOCKED "):
                seen.add(own[-1].split()[1])
        return 1 if seen >= {"0", "1", "2"} else None

    results = h.run_nodes(1, job.cwd, h.env(T_ENTRY="activate", T_BLOCK_AT="7", T_BLOCK_RANKS="1", **job.environ),
                          nnodes=3, node_env=job.per_node, kill_node_when=all_flushed)
    first = h.joined(results)
    assert first.killed, first.explain()
    assert results[0].stderr.count("replicas: 1 on 3 machines keeps each step in every machine's local tier") == 1
    lines = {line.split()[3]: line for line in results[0].stderr.splitlines()
             if line.startswith("ravex: checkpoint step")}
    assert lines["2"].endswith("| tiers: local, to 2 replicas in background"), lines  # the job's line, by rank 0
    assert lines["4"].endswith("| tiers: local, to 2 replicas + storage in background"), lines  # every 2nd
    for tier in job.tiers:
        store = open_store(tier).current()
        assert store.complete_steps()[-2:] == [4, 6], first.explain()
        assert list(store.step_info(6).ranks) == [0, 1, 2], first.explain()
        assert validate(store, steps=[6]).ok, first.explain()  # every object of the step is in this tier
    assert _bucket(job, moto_server).current().complete_steps() == [4], first.explain()
    replicated = [line for line in first.stderr.splitlines() if " replicated: tiers local + replica" in line]
    assert replicated and not [line for line in replicated if ", gc " in line], replicated  # no GC over the link
    run = open_store(job.tiers[0]).current().manifest(6, 0).run  # what run wrote it: said in every tier
    assert all((tier / "runs" / f"{run}.json").exists() for tier in job.tiers), first.explain()
    assert _bucket(job, moto_server).storage.exists(f"runs/{run}.json"), first.explain()

    shutil.rmtree(job.tiers[1])
    (job.tiers[2] / "steps" / "6" / "witness-1.json").unlink()  # machine 1 was lost before it got there
    out = tmp_path / "final.pt"
    results = job.run(T_OUT=str(out))
    second = h.joined(results)
    assert second.returncode == 0, second.explain()
    assert "ravex: step 6 came from rank 2's machine" in results[1].stderr, second.explain()
    assert "step 6 came from" not in results[0].stderr + results[2].stderr, second.explain()
    for rank in range(3):
        assert second.restored(rank) == 6, second.explain()
        assert second.losses(rank) == {s: v for s, v in ref.losses(rank).items() if s > 6}, second.explain()
    assert "ravex: the witnesses of step 6 of ranks [1] came from the other machines' local tiers" \
        in results[2].stderr, second.explain()  # from machine 0's tier (machine 1 fetches it, or takes it too)
    assert "ravex: resume verified: after step 6, step 7 matches the run that wrote it on 3 ranks" \
        in results[0].stderr, second.explain()
    assert "FAILED" not in second.stderr, second.explain()
    h.assert_same_state(torch.load(out, weights_only=False), torch.load(ref_out, weights_only=False))
    for tier in job.tiers:  # keep_last 2, by each machine's first rank in its own tier
        assert open_store(tier).current().complete_steps() == [steps - 2, steps], second.explain()

    for tier in job.tiers:  # rank 1's record of the steps after the rollback's step, lost everywhere
        (tier / "steps" / str(steps - 2) / "witness-1.json").unlink()
    results = job.run(T_OUT=str(out), RAVEX_RESUME=str(steps - 2))  # keep_last 2: the older of two
    third = h.joined(results)
    assert (f"ravex: resume not verified (resumed from step {steps - 2}): rank 1 found no record of the steps "
            f"after it") in results[0].stderr, third.explain()
    assert third.returncode == 0, third.explain()
    for rank in range(3):
        assert third.restored(rank) == steps - 2, third.explain()
    h.assert_same_state(torch.load(out, weights_only=False), torch.load(ref_out, weights_only=False))
    for tier in job.tiers:
        current = open_store(tier).current()
        assert current.timeline.fork_step == steps - 2 and current.complete_steps()[-1] == steps, third.explain()

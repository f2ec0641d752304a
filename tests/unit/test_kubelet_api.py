"""The kubelet API's cut of a job's one output stream into each node's lines, and the tags that make the cut
possible (asked for by the operator through service.prepare): tests/integration/kubernetes/test_virtual_node.py
runs them on the real API server and Slurm."""

from __future__ import annotations

import pytest

from bridge import service
from bridge.mpi.bootstrap import node_label, rank_label
from bridge.operator.kubelet_api import node_lines, of_node
from tests.builders import TRAINJOB, cluster
from tests.fakes import FakeBackend


def test_each_node_keeps_its_own_lines_without_the_node_tag_the_launch_wrote() -> None:
    tagged = (node_label(1) + b"from node 1").decode()
    assert of_node(tagged, 1) == "from node 1"
    assert of_node(tagged, 0) is None
    ranked = (rank_label(5, 2) + b"rank five").decode()  # node 2 of a two-per-node job
    assert of_node(ranked, 2) == "[rank-5] rank five"
    assert of_node(ranked, 0) is None and of_node(ranked, 1) is None
    # an untagged line (a one-node job, the batch script's own, the backend's) is node 0's
    assert of_node("srun: error: something", 0) == "srun: error: something"
    assert of_node("srun: error: something", 1) is None
    assert of_node("[node-x] not a tag", 0) == "[node-x] not a tag"


def test_lines_split_across_chunks_go_whole_to_their_node_and_every_chunk_stays_one() -> None:
    chunks = ["[node-0] a\n[node-1] b", "\n[no", "de-1] c\nplain\n", "[node-1] partial"]
    # a line goes out with the chunk that ends it; one never ended goes out last
    assert list(node_lines(chunks, 1)) == ["", "b\n", "c\n", "", "partial"]
    assert list(node_lines(chunks, 0)) == ["a\n", "", "plain\n", ""]
    assert list(node_lines(["", "[node-1] late\n"], 1)) == ["", "late\n"]  # the first (written before) is empty


@pytest.mark.parametrize(("kind", "tagged"), [("slurm", True), ("flux", True), ("kubernetes", False)])
def test_the_operator_asks_jobs_on_backends_without_pods_to_tag_their_lines(monkeypatch, tmp_path, kind,
                                                                             tagged) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    target = cluster(kind, "hpc")
    backend = FakeBackend(target)
    monkeypatch.setattr(service.targets, "get_adapter", lambda cluster: backend)

    def env(**options: bool) -> dict[str, str | None]:
        prepared = service.prepare(service.read_input("-", stdin=TRAINJOB), cluster="hpc",
                                   configured={"hpc": target}, **options)
        return {entry.name: entry.value for entry in prepared.plan.env}

    assert "HPCBRIDGE_TAG_OUTPUT" not in env()  # the CLI's jobs: as they were
    assert env(tag_output=True).get("HPCBRIDGE_TAG_OUTPUT") == ("1" if tagged else None)

"""bunqueue-client 0.1.5's FlowProducer against `shardq start --shards 4`.

Its flows are the legacy v2 sequence (children pushed with `parentId: "pending"`, the parent
with `childrenIds` and `dependsOn`, then one `UpdateParent` per child), and its queues put the
parent and the children on different shards here. The parent's processor reads its children's
values with the client's own `get_children_values`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from bunqueue import FlowProducer, Job, Queue
from compat_clients import Clients
from shardq_harness import ShardqServer, poll_until

from shardq.runtime._routing import shard_of

pytestmark = pytest.mark.timeout(240)

SHARDS = 4


@pytest.fixture(scope="module")
def four_shards(tmp_path_factory: pytest.TempPathFactory) -> Any:
    server = ShardqServer(tmp_path_factory.mktemp("flows"), shards=SHARDS)
    try:
        # Four shards on a shared two-core machine can take a while to come up.
        server.start(timeout=90)
        yield server
    finally:
        server.close()


@pytest.fixture
def flow_clients(four_shards: ShardqServer) -> Any:
    made = Clients(four_shards)
    try:
        yield made
    finally:
        made.close()


def _queues(tag: str) -> list[str]:
    """Three queue names on three different shards."""
    found: dict[int, str] = {}
    for i in range(1000):
        name = f"{tag}-{i}"
        found.setdefault(shard_of(name, SHARDS), name)
        if len(found) == 3:
            break
    return list(found.values())


def _producer(clients: Clients) -> FlowProducer:
    host, port = clients.server.tcp_address
    return FlowProducer(host=host, port=port)


def _results(clients: Clients, queue: str, process: Callable[[Job], Any]) -> dict[str, Any]:
    """Run a worker on `queue`; what each job returned, by id, as it completes."""
    done: dict[str, Any] = {}
    lock = threading.Lock()

    def run(job: Job) -> Any:
        value = process(job)
        with lock:
            done[job.id] = value
        return value

    clients.worker(queue, run)
    return done


def test_a_tree_across_shards_completes_with_its_childrens_values(
    flow_clients: Clients,
) -> None:
    parent_q, child_q, leaf_q = _queues("tree")
    flows = _producer(flow_clients)
    try:
        root = flows.add(
            {
                "name": "root",
                "queueName": parent_q,
                "data": {"k": "root"},
                "children": [
                    {"name": "a", "queueName": child_q, "data": {"k": "a"}},
                    {
                        "name": "b",
                        "queueName": child_q,
                        "data": {"k": "b"},
                        "children": [{"name": "leaf", "queueName": leaf_q, "data": {"k": "l"}}],
                    },
                ],
            }
        )
        queue: Queue = flow_clients.queue(parent_q)
        assert queue.get_state(root.job.id) == "waiting-children"
        roots = _results(flow_clients, parent_q, lambda job: job.get_children_values())
        _results(
            flow_clients, child_q, lambda job: {"k": job.data["k"], **job.get_children_values()}
        )
        _results(flow_clients, leaf_q, lambda job: job.data["k"])
        poll_until(lambda: root.job.id in roots, 30, "the root to run")
        a, b = (node.job.id for node in root.children)
        leaf = root.children[1].children[0].job.id
        assert roots[root.job.id] == {a: {"k": "a"}, b: {"k": "b", leaf: "l"}}
        tree = flows.get_flow(root.job.id)
        assert tree is not None
        assert sorted(node.job.id for node in tree.children) == sorted([a, b])
    finally:
        flows.close()


def test_fan_in_with_add_bulk_then(flow_clients: Clients) -> None:
    final_q, work_q, _ = _queues("fanin")
    flows = _producer(flow_clients)
    try:
        made = flows.add_bulk_then(
            [{"name": f"p{i}", "queueName": work_q, "data": {"i": i}} for i in range(5)],
            {"name": "final", "queueName": final_q},
        )
        finals = _results(flow_clients, final_q, lambda job: job.get_children_values())
        _results(flow_clients, work_q, lambda job: job.data["i"] * 10)
        poll_until(lambda: made["final_id"] in finals, 30, "the final job to run")
        expected = {job_id: i * 10 for i, job_id in enumerate(made["parallel_ids"])}
        assert finals[made["final_id"]] == expected
    finally:
        flows.close()


def test_a_failing_child_fails_its_parent_when_asked(flow_clients: Clients) -> None:
    parent_q, child_q, _ = _queues("failp")
    flows = _producer(flow_clients)
    try:
        root = flows.add(
            {
                "name": "root",
                "queueName": parent_q,
                "children": [
                    {
                        "name": "bad",
                        "queueName": child_q,
                        "opts": {"attempts": 1, "fail_parent_on_failure": True},
                    }
                ],
            }
        )

        def fail(job: Job) -> None:
            raise ValueError("child broke")

        flow_clients.worker(child_q, fail)
        queue = flow_clients.queue(parent_q)
        poll_until(lambda: queue.get_state(root.job.id) == "failed", 30, "the parent to fail")
        child = root.children[0].job.id
        assert queue.get_failed_children_values(root.job.id) == {child: "child broke"}
    finally:
        flows.close()


def test_ignored_and_removed_dependencies(flow_clients: Clients) -> None:
    parent_q, child_q, _ = _queues("ignore")
    flows = _producer(flow_clients)
    try:
        root = flows.add(
            {
                "name": "root",
                "queueName": parent_q,
                "children": [
                    {"name": "bad", "queueName": child_q,
                     "opts": {"attempts": 1, "ignore_dependency_on_failure": True}},
                    {"name": "held", "queueName": child_q, "opts": {"delay": 3_600_000}},
                ],
            }
        )  # fmt: skip

        def fail(job: Job) -> None:
            raise ValueError("ignored")

        flow_clients.worker(child_q, fail)
        queue = flow_clients.queue(parent_q)
        bad, held = (node.job.id for node in root.children)
        poll_until(
            lambda: queue.get_ignored_children_failures(root.job.id) == {bad: "ignored"},
            30,
            "the ignored failure",
        )
        assert queue.get_state(root.job.id) == "waiting-children"  # `held` still pending
        queue.remove_child_dependency(held)
        poll_until(lambda: queue.get_state(root.job.id) == "waiting", 30, "the parent released")
        assert queue.get_children_values(root.job.id) == {}
    finally:
        flows.close()

"""slurmrestd across API versions: which version is spoken, the job description per generation, reading job
states and exit codes, and warnings about ignored fields (a small in-process HTTP server stands in for
slurmrestd here; tests/integration/slurm/test_slurm_rest.py runs the real one on every Slurm version)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from bridge.adapters.base import JobState
from bridge.adapters.slurm.rest import (
    VERSIONS,
    DataParser,
    Legacy,
    RestClient,
    api_for,
    choose_version,
    job_fields,
    served_versions,
    shown_state,
)
from bridge.api.cluster import SlurmConnection
from bridge.errors import BackendRejected


def _unset() -> dict:
    return {"set": False, "infinite": False, "number": 0}


def _set(n: int) -> dict:
    return {"set": True, "infinite": False, "number": n}


@pytest.mark.parametrize(("served", "pinned", "spoken"), [
    ({"v0.0.36", "v0.0.37", "v0.0.38"}, None, "v0.0.38"),                    # Slurm 22.05
    ({"v0.0.40", "v0.0.41", "v0.0.42"}, None, "v0.0.42"),                    # 24.11
    ({"v0.0.42", "v0.0.43", "v0.0.44", "v0.0.45"}, None, "v0.0.45"),         # 26.05
    ({"v0.0.43", "v0.0.44", "v0.0.45", "v0.0.46"}, None, "v0.0.45"),         # a newer one still serving ours
    ({"v0.0.40", "v0.0.41", "v0.0.42"}, "v0.0.40", "v0.0.40"),
])
def test_the_newest_version_both_speak(served, pinned, spoken) -> None:
    assert choose_version(served, pinned) == spoken


@pytest.mark.parametrize(("served", "pinned", "words"), [
    ({"v0.0.46", "v0.0.47"}, None, "serves v0.0.46, v0.0.47, newer than the APIs hpc-bridge speaks"),
    ({"v0.0.35", "v0.0.36", "v0.0.37"}, None, "serves v0.0.35 to v0.0.37, none of the APIs"),
    ({"v0.0.39"}, None, "serves v0.0.39, none of the APIs hpc-bridge speaks (v0.0.38, v0.0.40 to v0.0.45)"),
    (set(), None, "serves no Slurm API"),
    ({"v0.0.42", "v0.0.43"}, "v0.0.40", "does not serve the pinned API v0.0.40 (spec.slurm.restApiVersion); it "
                                        "serves v0.0.42, v0.0.43"),
])
def test_a_server_too_old_or_too_new_is_one_clear_error(served, pinned, words) -> None:
    with pytest.raises(BackendRejected, match=words.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        choose_version(served, pinned)


def test_the_pinned_version_is_one_hpc_bridge_speaks() -> None:
    for version in VERSIONS:
        assert SlurmConnection.model_validate({"transport": "rest", "restUrl": "http://h:1", "restApiVersion": version})
    for version in ("v0.0.39", "v0.0.46", "0.0.42", "v0.0.42; rm"):
        with pytest.raises(ValueError):
            SlurmConnection.model_validate({"transport": "rest", "restUrl": "http://h:1", "restApiVersion": version})


DOCUMENT = {
    "paths": {"/slurm/v0.0.42/job/submit": {"post": {"requestBody": {"content": {"application/json": {
        "schema": {"$ref": "#/components/schemas/v0.0.42_job_submit_req"}}}}}},
              "/slurm/v0.0.42/jobs/": {}, "/slurm/v0.0.41/ping/": {}, "/slurmdb/v0.0.42/jobs/": {}},
    "components": {"schemas": {
        "v0.0.42_job_submit_req": {"properties": {"script": {}, "job": {"$ref": "#/components/schemas/v0.0.42_job"}}},
        "v0.0.42_job": {"properties": {"name": {}, "environment": {}, "tres_per_node": {}, "hold": {}}}}},
}


def test_versions_and_job_fields_come_from_the_servers_openapi_document() -> None:
    assert served_versions(DOCUMENT) == {"v0.0.41", "v0.0.42"}  # slurmdb paths are another API
    assert job_fields(DOCUMENT, "v0.0.42") == {"name", "environment", "tres_per_node", "hold"}
    assert job_fields(DOCUMENT, "v0.0.41") is None  # the document does not say: slurmrestd's answer decides


REQUEST = {"options": {"job-name": "j", "comment": "hpcbridge.io/uid=u", "nodes": "2", "ntasks-per-node": "4",
                       "cpus-per-task": "2", "mem": "1000M", "gpus-per-node": "2", "time": "00:10:00",
                       "partition": "p", "array": "0-3", "exclusive": None, "output": "o-%j.out", "chdir": "/w",
                       "hold": None},
           "environment": {"PATH": "/bin", "A": "1=2"}, "time_minutes": 10}


def test_one_job_description_per_generation() -> None:
    legacy = Legacy("v0.0.38").job(REQUEST)
    assert legacy["nodes"] == "2" and legacy["gpus_per_node"] == "2" and legacy["memory_per_node"] == 1000
    assert legacy["exclusive"] == "exclusive" and legacy["time_limit"] == 10
    assert legacy["environment"] == {"PATH": "/bin", "A": "1=2"}
    assert legacy["standard_output"] == "/w/o-%j.out" and legacy["current_working_directory"] == "/w"
    for version in VERSIONS[1:]:
        job = api_for(version).job(REQUEST)
        assert (job["minimum_nodes"], job["maximum_nodes"]) == (2, 2) and "nodes" not in job
        assert job["tres_per_node"] == "gres/gpu:2" and "gpus_per_node" not in job
        assert job["shared"] == ["none"] and "exclusive" not in job
        assert job["memory_per_node"] == _set(1000) and job["time_limit"] == _set(10)
        assert job["environment"] == ["PATH=/bin", "A=1=2"]
        assert job["hold"] is True and job["array"] == "0-3" and job["tasks_per_node"] == 4
        assert job["cpus_per_task"] == 2 and job["tres_per_task"] == "cpu=2" and job["name"] == "j"


def test_totals_and_ranges_a_script_leaves_to_slurm_stay_so() -> None:
    """-n 6 --gpus=3 --nodes=1-3 --threads-per-core=1: totals stay totals, the range a range, no per-node count
    invented (the batch script's own layout, as render.directives gives it)."""
    request = {"options": {"job-name": "j", "nodes": "1-3", "ntasks": "6", "gpus": "3", "gpus-per-task": "1",
                           "threads-per-core": "1", "mem": "2G", "chdir": "/w"},
               "environment": {}, "time_minutes": None}
    job = DataParser("v0.0.45").job(request)
    assert (job["minimum_nodes"], job["maximum_nodes"], job["tasks"]) == (1, 3, 6) and "tasks_per_node" not in job
    assert job["tres_per_job"] == "gres/gpu:3" and job["tres_per_task"] == "gres/gpu:1"
    assert "tasks" not in DataParser("v0.0.42").job({**request, "options": {"nodes": "2", "ntasks-per-node": "3",
                                                                            "chdir": "/w"}})
    assert job["threads_per_core"] == 1 and job["memory_per_node"] == _set(2048) and "time_limit" not in job
    legacy = Legacy("v0.0.38").job(request)
    assert (legacy["nodes"], legacy["tasks"], legacy["gpus"], legacy["gpus_per_task"]) == ("1-3", 6, "3", "1")


@pytest.mark.parametrize(("states", "shown", "state"), [
    (["PENDING"], "PENDING", JobState.PENDING),
    (["RUNNING", "COMPLETING"], "COMPLETING", JobState.COMPLETING),
    (["PENDING", "REQUEUED"], "REQUEUED", JobState.PENDING),
    (["PENDING", "REQUEUED", "EXPEDITING"], "EXPEDITING", JobState.PENDING),  # 26.05
    (["COMPLETED"], "COMPLETED", JobState.SUCCEEDED),
    (["FAILED", "LAUNCH_FAILED"], "FAILED", JobState.FAILED),
    (["CANCELLED"], "CANCELLED", JobState.CANCELLED),
    (["NEWSTATE"], "NEWSTATE", JobState.UNKNOWN),  # reported by its name, never taken for success
    ("COMPLETED", "COMPLETED", JobState.SUCCEEDED),  # v0.0.38's string
])
def test_job_state_lists_read_as_squeue_prints_them(states, shown, state) -> None:
    assert shown_state(states) == shown
    record = DataParser("v0.0.42").record({"job_id": 5, "job_state": states, "exit_code": {}, "name": "n",
                                           "het_job_id": _unset(), "state_reason": "None"})
    assert record.state == state and record.job_id == "5"
    if state == JobState.UNKNOWN:
        assert record.reason == "UnknownSlurmState:NEWSTATE"


@pytest.mark.parametrize(("exit_code", "code"), [
    ({"status": ["EXITED"], "return_code": _set(3), "signal": {"id": _unset(), "name": ""}}, 3),
    ({"status": ["SUCCESS"], "return_code": _set(0), "signal": {"id": _unset(), "name": ""}}, 0),
    ({"status": ["SIGNALED"], "return_code": _unset(), "signal": {"id": _set(9), "name": "KILL"}}, 137),
    ({"status": ["PENDING"], "return_code": _unset(), "signal": {"id": _unset(), "name": ""}}, None),
])
def test_exit_code_objects(exit_code, code) -> None:
    record = DataParser("v0.0.45").record({"job_id": 5, "job_state": ["FAILED"], "exit_code": exit_code,
                                           "het_job_id": _unset()})
    assert record.exit_code == code
    # the raw wait status of v0.0.38 reads the same
    assert Legacy("v0.0.38").record({"job_id": 5, "job_state": "FAILED", "exit_code": 768}).exit_code == 3


def test_a_heterogeneous_component_is_known_by_its_leader() -> None:
    api = DataParser("v0.0.42")
    assert api.record({"job_id": 8, "job_state": ["RUNNING"], "het_job_id": _set(7)}).job_id == "7"
    assert api.record({"job_id": 8, "job_state": ["RUNNING"], "het_job_id": _unset()}).job_id == "8"


def test_nodes_and_partitions_read_as_sinfo_rows() -> None:
    nodes = [{"name": "node1", "cpus": 4, "alloc_cpus": 1, "alloc_idle_cpus": 3, "real_memory": 2000,
              "alloc_memory": 500, "gres": "gpu:a100:2", "gres_used": "gpu:a100:1(IDX:0)", "state": ["MIXED"],
              "partitions": ["debug"]},
             {"name": "node2", "cpus": 4, "alloc_cpus": 0, "alloc_idle_cpus": 4, "real_memory": 2000,
              "alloc_memory": 0, "gres": "", "gres_used": "", "state": ["IDLE", "DRAIN"], "partitions": ["debug"]}]
    partitions = [{"name": "debug", "flags": ["DEFAULT"], "partition": {"state": ["UP"]},
                   "maximums": {"time": {"set": True, "infinite": True, "number": 0}, "nodes": _set(2)}}]
    rows = DataParser("v0.0.42").node_rows(nodes, partitions)
    assert [(r.node, r.state, r.idle_cpus, r.gpus, r.used_gpus, r.default, r.time_limit, r.max_nodes)
            for r in rows] == [("node1", "mixed", 3, 2, 1, True, None, 2), ("node2", "drain", 4, 0, 0, True, None, 2)]


class _Slurmrestd(BaseHTTPRequestHandler):
    """Answers as a 24.11 slurmrestd would: an OpenAPI document, and a submission that warns."""

    calls: list[tuple[str, str]] = []
    submit_answer: dict = {}

    def _reply(self, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        self.calls.append(("GET", self.path))
        self._reply(DOCUMENT if self.path == "/openapi/v3" else {})

    def do_POST(self) -> None:  # noqa: N802
        self.calls.append(("POST", self.path))
        self._reply(self.submit_answer)

    def do_DELETE(self) -> None:  # noqa: N802
        self.calls.append(("DELETE", self.path))
        self._reply({})

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def server():
    httpd = HTTPServer(("127.0.0.1", 0), _Slurmrestd)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    _Slurmrestd.calls = []
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def _client(url: str, tmp_path) -> RestClient:
    token = tmp_path / "token"
    token.write_text("SLURM_JWT=t\n")
    return RestClient(url, user="alice", token_file=str(token))


def test_a_field_the_server_would_ignore_is_refused_before_sending(server, tmp_path) -> None:
    client = _client(server, tmp_path)
    with pytest.raises(BackendRejected, match="v0.0.42 at .* has no job field gpus_per_node; the job would run "
                                              "without it"):
        client.submit({"script": "#!/bin/sh\n", "job": {"name": "j", "gpus_per_node": "2"}})
    assert ("POST", "/slurm/v0.0.42/job/submit") not in _Slurmrestd.calls


def test_a_warning_about_an_ignored_field_cancels_the_job_and_is_an_error(server, tmp_path) -> None:
    _Slurmrestd.submit_answer = {"job_id": 41, "warnings": [
        {"description": "Field ignored: exclusive", "source": "DATA_PARSER"}], "errors": []}
    client = _client(server, tmp_path)
    with pytest.raises(BackendRejected, match=r"ignored part of the job, so job 41 was cancelled: Field ignored: "
                                              r"exclusive \[DATA_PARSER\]"):
        client.submit({"script": "#!/bin/sh\n", "job": {"name": "j"}})
    assert ("DELETE", "/slurm/v0.0.42/job/41") in _Slurmrestd.calls


def test_a_held_job_is_submitted_though_slurmrestd_lists_it_as_an_error(server, tmp_path) -> None:
    _Slurmrestd.submit_answer = {"job_id": 42, "errors": [
        {"error": "Job is in held state, pending scheduler release", "error_number": 2042}], "warnings": []}
    assert _client(server, tmp_path).submit({"script": "#!/bin/sh\n", "job": {"name": "j", "environment": []}}) \
        == "42"


def test_a_pinned_version_renders_without_the_server_and_submit_checks_it_is_served(server, tmp_path) -> None:
    token = tmp_path / "token"
    token.write_text("t")
    assert RestClient("http://127.0.0.1:9", token_file=str(token), api_version="v0.0.40").api.version == "v0.0.40"
    client = RestClient(server, token_file=str(token), api_version="v0.0.40")
    with pytest.raises(BackendRejected, match="does not serve the pinned API v0.0.40"):
        client.submit({"script": "#!/bin/sh\n", "job": {"name": "j"}})
    assert not [call for call in _Slurmrestd.calls if call[0] == "POST"]


#: jobs as slurmrestd 24.11 (v0.0.42) and 26.05 (v0.0.45) answered GET /job/{id}: one that exited 3, one
#: cancelled while it ran (tests/integration/slurm/test_slurm_rest.py runs the same against the real servers)
REAL_JOBS = {
    "v0.0.42": [
        {"job_id": 1, "job_state": ["FAILED"], "exit_code": {"status": ["ERROR"], "return_code": _set(3),
                                                            "signal": {"id": _unset(), "name": ""}},
         "het_job_id": _set(0), "standard_output": "/w/o-1.out", "stdout_expanded": None, "comment": "",
         "nodes": "node1", "state_reason": "NonZeroExitCode", "user_name": "root", "name": "e"},
        {"job_id": 2, "job_state": ["CANCELLED"], "exit_code": {"status": ["SIGNALED"], "return_code": _unset(),
                                                               "signal": {"id": _set(15), "name": "TERM"}},
         "het_job_id": _set(0), "standard_output": "/w/slurm-2.out", "stdout_expanded": None, "comment": "",
         "nodes": "node2", "state_reason": "None", "user_name": "root", "name": "s"}],
    "v0.0.45": [
        {"job_id": 1, "job_state": ["FAILED"], "exit_code": {"status": ["ERROR"], "return_code": _set(3),
                                                            "signal": {"id": _unset(), "name": ""}},
         "het_job_id": _set(0), "standard_output": "/w/o-%j.out", "stdout_expanded": "/w/o-1.out", "comment": "",
         "nodes": "node1", "state_reason": "NonZeroExitCode", "user_name": "root", "name": "e"},
        {"job_id": 2, "job_state": ["CANCELLED"], "exit_code": {"status": ["SIGNALED"], "return_code": _unset(),
                                                               "signal": {"id": _set(15), "name": "TERM"}},
         "het_job_id": _set(0), "standard_output": "slurm-%j.out", "stdout_expanded": "/w/slurm-2.out",
         "comment": "", "nodes": "node2", "state_reason": "None", "user_name": "root", "name": "s"}],
}


@pytest.mark.parametrize("version", sorted(REAL_JOBS))
def test_real_answers_of_each_version(version) -> None:
    api = api_for(version)
    failed, cancelled = (api.record(job) for job in REAL_JOBS[version])
    assert (failed.job_id, failed.state, failed.exit_code, failed.reason) == ("1", JobState.FAILED, 3,
                                                                             "NonZeroExitCode")
    assert (cancelled.job_id, cancelled.state, cancelled.exit_code) == ("2", JobState.CANCELLED, 143)
    # the output file as the server expanded it (26.05 keeps standard_output as written)
    assert [api.output_path(job, str(job["job_id"])) for job in REAL_JOBS[version]] == ["/w/o-1.out",
                                                                                         "/w/slurm-2.out"]


def test_partitions_without_flags_leave_the_default_unknown_unless_there_is_one() -> None:
    from bridge.adapters.base import NodeNeed
    from bridge.adapters.slurm.sinfo import count

    node = {"name": "node1", "cpus": 2, "alloc_cpus": 0, "alloc_idle_cpus": 2, "state": ["IDLE"],
            "gres": "gpu:a100:2", "gres_used": "gpu:a100:0(IDX:N/A)", "partitions": ["debug"], "real_memory": 2000,
            "alloc_memory": 0}
    # 24.11 (v0.0.42) as it answers: "flags": None
    part = {"name": "debug", "flags": None, "partition": {"state": ["UP"]},
            "maximums": {"nodes": {"set": False, "infinite": True, "number": 0},
                         "time": {"set": False, "infinite": True, "number": 0}}}
    need = NodeNeed(cpus=1, gpus=0, memory_mib=None)
    lone = DataParser("v0.0.42").node_rows([node], [part])
    assert lone[0].default and count(lone, need, 1, None, None).fitting == 1
    two = DataParser("v0.0.42").node_rows([{**node, "partitions": ["debug", "long"]}],
                                         [part, {**part, "name": "long"}])
    unknown = count(two, need, 1, None, None)
    assert unknown.fitting == 0 and "does not say which partition is its default" in unknown.detail
    assert count(two, need, 1, "long", None).fitting == 1


def test_ping_reports_only_a_controller_that_answers() -> None:
    from bridge.errors import BackendUnavailable

    assert DataParser("v0.0.45").pings({"pings": [{"hostname": "vm", "responding": True, "status": "No error"}]}) \
        == "vm UP"
    assert Legacy("v0.0.38").pings({"pings": [{"hostname": "vm", "ping": "UP"}]}) == "vm UP"
    with pytest.raises(BackendUnavailable, match=r"slurmctld does not answer slurmrestd \(vm DOWN\); is the token"):
        DataParser("v0.0.42").pings({"pings": [{"hostname": "vm", "pinged": "DOWN", "responding": False}]})


def test_a_held_jobs_warning_is_what_was_asked(server, tmp_path) -> None:
    held = [{"description": "Job submission resulted in non-zero return code: Job is in held state, pending "
                            "scheduler release", "source": "slurm_submit_batch_job()"}]
    _Slurmrestd.submit_answer = {"job_id": 43, "warnings": held, "errors": []}
    assert _client(server, tmp_path).submit({"script": "#!/bin/sh\n", "job": {"name": "j", "hold": True}}) == "43"
    # the same warning for a job that did not ask to be held is something else: refused
    with pytest.raises(BackendRejected, match="ignored part of the job"):
        _client(server, tmp_path).submit({"script": "#!/bin/sh\n", "job": {"name": "j"}})



def test_a_job_left_to_slurms_default_output_file_is_found_in_its_working_directory() -> None:
    """v0.0.38 leaves standard_output empty for a job submitted without one: the file is slurm-<id>.out (an
    array task's slurm-<array>_<task>.out) in the job's working directory, as slurmd writes it."""
    api = Legacy("v0.0.38")
    plain = {"job_id": 444, "standard_output": "", "current_working_directory": "/w", "array_job_id": 0,
             "array_task_id": None}
    assert api.output_path(plain, "444") == "/w/slurm-444.out"
    task = {**plain, "job_id": 446, "array_job_id": 445, "array_task_id": 1}
    assert api.output_path(task, "446") == "/w/slurm-445_1.out"
    assert api.output_path({**plain, "current_working_directory": ""}, "444") is None

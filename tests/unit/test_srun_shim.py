"""The srun/scontrol shim of a batch script off Slurm (bridge.mpi.step): srun's command line and its defaults
from the job's environment, the variables of a job and of its steps, labelled output, exit codes, hostile
arguments. Steps here run on the local transport (this machine's processes); the real backends are in
tests/integration/test_sbatch_anywhere.py, with real Slurm as the oracle."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from bridge.convert.sbatch import to_trainjob
from bridge.errors import InvalidSpec
from bridge.mpi import step
from bridge.sbatch.script import parse_script

JOB = {"SLURM_NTASKS": "4", "SLURM_NTASKS_PER_NODE": "2", "SLURM_NNODES": "2"}


@pytest.mark.parametrize("argv, options, command", [
    (["-N2", "-n", "4", "hostname"], {"nodes": "2", "ntasks": "4"}, ["hostname"]),
    (["--nodes=1", "--ntasks", "1", "-l", "echo", "-n", "x"], {"nodes": "1", "ntasks": "1", "label": None},
     ["echo", "-n", "x"]),
    (["-ln2", "true"], {"label": None, "ntasks": "2"}, ["true"]),
    (["--mpi=pmix", "-K", "--", "./a.out", "--flag"], {"mpi": "pmix", "kill-on-bad-exit": None}, ["./a.out", "--flag"]),
    (["--exclusive", "-c", "2", "--cpu-bind=cores", "x"], {"exclusive": None, "cpus-per-task": "2",
                                                          "cpu-bind": "cores"}, ["x"]),
])
def test_srun_command_line(argv, options, command) -> None:
    assert step.parse_srun(argv) == (options, command)


@pytest.mark.parametrize("argv, words", [
    (["--pty", "bash"], "--pty is not available off Slurm"),
    (["-w", "node1", "hostname"], "-w is not available off Slurm"),
    (["-N"], "-N needs a value"),
])
def test_srun_options_it_cannot_honour_are_refused_by_name(argv, words) -> None:
    with pytest.raises(step.StepError, match=words):
        step.parse_srun(argv)


def decide(argv: list[str], env: dict[str, str] = JOB, allocated: int = 2) -> step.Step:
    options, command = step.parse_srun(argv)
    return step.decide(options, command, env, allocated)


def test_a_bare_srun_runs_the_jobs_tasks_over_its_nodes() -> None:
    shape = decide(["hostname"])
    assert (shape.nodes, shape.ntasks, shape.per_node) == (2, 4, 2)
    assert [list(shape.tasks_on(node)) for node in range(2)] == [[0, 1], [2, 3]]


def test_explicit_counts_win_and_uneven_tasks_fill_the_first_nodes() -> None:
    assert decide(["-N1", "-n1", "x"])[:3] == (1, 1, 1)
    shape = decide(["-n3", "x"])
    assert (shape.nodes, shape.ntasks) == (2, 3) and [len(shape.tasks_on(n)) for n in range(2)] == [2, 1]
    assert decide(["-N2", "x"])[:2] == (2, 2)  # -N alone: one task per node
    assert decide(["-n1", "x"])[:2] == (1, 1)  # fewer tasks than nodes: fewer nodes


def test_ntasks_per_node_against_the_jobs_ntasks_is_ignored_with_sruns_warning(capsys) -> None:
    # what real srun 22.05 prints and does for `srun --ntasks-per-node=1` in a 2 x 2 job (the oracle test saw it)
    shape = decide(["--ntasks-per-node=1", "x"])
    assert (shape.nodes, shape.ntasks) == (2, 4)
    assert capsys.readouterr().err == (
        "srun: Warning: can't honor --ntasks-per-node set to 1 which doesn't match the requested tasks 4 with the "
        "number of requested nodes 2. Ignoring --ntasks-per-node.\n")


@pytest.mark.parametrize("argv, words", [
    (["-N3", "x"], "the allocation has 2 node"),
    (["-N2", "-n1", "x"], "fewer than --nodes"),
    (["-n", "0", "x"], "'0' is not a positive count"),
    (["--export=NONE", "x"], "only ALL"),
    (["--mpi=cray_pals", "x"], "use one of none, pmix or pmi2"),
    (["-D", "/tmp", "x"], "run cd before srun"),
    ([], "no command"),
])
def test_steps_the_allocation_cannot_hold_are_refused(argv, words) -> None:
    with pytest.raises(step.StepError, match=words):
        decide(argv)


def test_job_and_step_variables() -> None:
    assert step.tasks_per_node_text([2, 2, 1]) == "2(x2),1"
    assert step.node_names(["localhost"] * 3) == ["127.0.0.1", "127.0.0.2", "127.0.0.3"]
    assert step.node_names(["pod-0.x", "pod-1.x"]) == ["pod-0.x", "pod-1.x"]
    job = step.batch_env("42", ["node-0", "node-1"], 2, {"SLURM_NTASKS": "3"})
    assert {k: job[k] for k in ("SLURM_JOB_ID", "SLURM_JOB_NODELIST", "SLURM_NNODES", "SLURM_NTASKS",
                                "SLURM_TASKS_PER_NODE", "SLURM_PROCID", "SLURMD_NODENAME")} == {
        "SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "node-[0-1]", "SLURM_NNODES": "2", "SLURM_NTASKS": "3",
        "SLURM_TASKS_PER_NODE": "2,1", "SLURM_PROCID": "0", "SLURMD_NODENAME": "node-0"}
    values = step.step_env(decide(["-n3", "-c", "2", "x"]), 5, ["node-0", "node-1"])
    assert (values["SLURM_STEP_ID"], values["SLURM_STEP_NUM_TASKS"], values["SLURM_STEP_NODELIST"],
            values["SLURM_STEP_TASKS_PER_NODE"], values["SLURM_CPUS_PER_TASK"]) == ("5", "3", "node-[0-1]", "2,1", "2")


def test_the_environment_a_step_passes_on_leaves_a_parent_launchers_identity_behind() -> None:
    kept = step.exported({"A": "1", "OMPI_COMM_WORLD_RANK": "3", "PMI_RANK": "1", "FLUX_TASK_RANK": "2",
                          "BASH_FUNC_x%%": "() { :; }", "SLURM_JOB_ID": "7"})
    assert kept == {"A": "1", "SLURM_JOB_ID": "7"}


def test_step_ids_count_up_per_job(tmp_path) -> None:
    assert [step._next_step_id(str(tmp_path)) for _ in range(3)] == [0, 1, 2]
    assert step._next_step_id(None) == 0


def test_scontrol_show_hostnames_and_hostlist(capsys) -> None:
    assert step.scontrol(["show", "hostnames"], {"SLURM_JOB_NODELIST": "n[1-3],gpu07"}) == 0
    assert capsys.readouterr().out == "n1\nn2\nn3\ngpu07\n"
    assert step.scontrol(["show", "hostlist", "n3,n1,n2"], {}) == 0
    assert step.scontrol(["show", "hostlistsorted", "n3,n1,n2"], {}) == 0
    assert capsys.readouterr().out == "n[3,1-2]\nn[1-3]\n"
    with pytest.raises(step.StepError, match="only 'scontrol show hostnames'"):
        step.scontrol(["show", "job", "1"], {})


def shim(args: list[str], tmp_path, hosts: int = 2, **env: str) -> subprocess.CompletedProcess:
    """`srun ARGS` as a batch script's line runs it on the local transport (what hpcbridge launch sets up)."""
    full = {**os.environ, **JOB, step.TRANSPORT_ENV: "local", step.HOSTS_ENV: ",".join(["localhost"] * hosts),
            step.STATE_ENV: str(tmp_path), step.PYTHON_ENV: sys.executable, **env}
    full.pop(step.TASK_ENV, None)
    return subprocess.run([sys.executable, "-m", "bridge.mpi.step", "srun", *args], env=full, capture_output=True,
                          text=True, timeout=60)


def test_srun_runs_each_task_with_its_identity(tmp_path) -> None:
    ran = shim(["-l", "sh", "-c", 'echo "$SLURM_PROCID $SLURM_LOCALID $SLURM_NODEID $SLURMD_NODENAME $SLURM_STEP_ID"'],
               tmp_path)
    assert ran.returncode == 0, ran.stderr
    assert sorted(ran.stdout.splitlines()) == ["0: 0 0 0 127.0.0.1 0", "1: 1 1 0 127.0.0.1 0",
                                               "2: 2 0 1 127.0.0.2 0", "3: 3 1 1 127.0.0.2 0"]


def test_labels_are_padded_to_the_widest_task_id_and_cover_stderr_and_an_unfinished_line(tmp_path) -> None:
    ran = shim(["-n", "11", "-l", "sh", "-c", '[ "$SLURM_PROCID" = 10 ] && { echo out; echo err >&2; printf tail; }; :'],
               tmp_path)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout == "10: out\n10: tail\n" and ran.stderr == "10: err\n"


def test_hostile_arguments_reach_every_task_unchanged(tmp_path) -> None:
    words = ["a b", "it's", 'say "hi"', "new\nline", "$(touch PWNED)", "*", "-n"]
    ran = shim(["-n", "2", sys.executable, "-c", "import sys, json; print(json.dumps(sys.argv[1:]))", *words],
               tmp_path)
    assert ran.returncode == 0, ran.stderr
    import json

    assert [json.loads(line) for line in ran.stdout.splitlines()] == [words, words]
    assert not (tmp_path / "PWNED").exists() and not os.path.exists("PWNED")


def test_the_step_ends_with_the_highest_task_code_and_reports_failed_tasks_as_srun_does(tmp_path) -> None:
    ran = shim(["sh", "-c", 'case $SLURM_PROCID in 1) exit 3;; 2|3) exit 4;; esac'], tmp_path)
    assert ran.returncode == 4
    assert sorted(ran.stderr.splitlines()) == ["srun: error: 127.0.0.1: task 1: Exited with exit code 3",
                                               "srun: error: 127.0.0.2: tasks 2-3: Exited with exit code 4"]


def test_kill_on_bad_exit_ends_the_other_tasks_with_the_failed_tasks_code(tmp_path) -> None:
    ran = shim(["-K", "-n2", "sh", "-c", '[ "$SLURM_PROCID" = 1 ] && exit 3; exec sleep 60'], tmp_path)
    assert ran.returncode == 3
    assert "task 1: Exited with exit code 3" in ran.stderr and "task 0: Terminated" in ran.stderr


def test_a_missing_command_is_127_and_outside_an_allocation_srun_says_so(tmp_path) -> None:
    ran = shim(["-n1", "no-such-command-here"], tmp_path)
    assert ran.returncode == 127 and "no-such-command-here: command not found" in ran.stderr
    outside = subprocess.run([sys.executable, "-m", "bridge.mpi.step", "srun", "true"], capture_output=True, text=True,
                             env={k: v for k, v in os.environ.items() if not k.startswith("HPCBRIDGE_STEP")})
    assert outside.returncode == 2 and "not inside an hpc-bridge allocation" in outside.stderr


def test_hpcbridge_image_line_sets_the_image_and_anything_else_on_it_is_refused() -> None:
    text = "#!/bin/bash\n#SBATCH -N 2\n#HPCBRIDGE --image=registry.example/train:1.2\nsrun hostname\n#HPCBRIDGE --x\n"
    trainjob, _ = to_trainjob(parse_script(text, "job.sbatch"))
    assert trainjob.spec.trainer.image == "registry.example/train:1.2"
    with pytest.raises(InvalidSpec, match=r"#HPCBRIDGE --gpus=2: takes only --image=VALUE \(got '--gpus=2'\)") as info:
        to_trainjob(parse_script("#!/bin/bash\n#HPCBRIDGE --gpus=2\nhostname\n", "job.sbatch"))
    assert info.value.exit_code == 2
    with pytest.raises(InvalidSpec, match="one word"):
        to_trainjob(parse_script("#!/bin/bash\n#HPCBRIDGE --image 'a b'\nhostname\n", "job.sbatch"))


def test_sigterm_to_srun_ends_every_task_of_the_step(tmp_path) -> None:
    """A cancelled job's script gets SIGTERM; its srun passes it to the tasks (each in a session of its own) and
    ends with them, as srun does, instead of leaving them running."""
    marker = tmp_path / "started"
    full = {**os.environ, **JOB, step.TRANSPORT_ENV: "local", step.HOSTS_ENV: "localhost,localhost",
            step.STATE_ENV: str(tmp_path), step.PYTHON_ENV: sys.executable}
    proc = subprocess.Popen([sys.executable, "-m", "bridge.mpi.step", "srun", "-n2", "sh", "-c",
                             f'echo $$ >> {marker}; exec sleep 300'], env=full, stderr=subprocess.PIPE, text=True)
    for _ in range(600):  # both tasks have started (a bound, not a timing assertion)
        if marker.exists() and len(marker.read_text().split()) == 2:
            break
        time.sleep(0.1)
    proc.terminate()
    assert proc.wait(timeout=60) == 143
    assert sorted(proc.stderr.read().splitlines()) == ["srun: error: 127.0.0.1: task 0: Terminated",
                                                       "srun: error: 127.0.0.2: task 1: Terminated"]
    for pid in marker.read_text().split():
        assert not os.path.exists(f"/proc/{pid}") or "Z" in open(f"/proc/{pid}/stat").read().split()[2]

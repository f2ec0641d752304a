"""Unchanged batch scripts off Slurm: each #SBATCH option is mapped for the backend, dropped with one note
naming its line (the options that change nothing about what the job computes: ``SBATCH_DROPPED_OFF_SLURM``),
or refused naming its line; never silently. The corpus walk renders every script of the Slurm oracle's corpus
and the examples on a local, a Flux and a Kubernetes cluster through the CLI, as a user types it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bridge import cli, service, tenancy
from bridge.annotations import SBATCH_PASSTHROUGH_PREFIX
from bridge.api.loader import parse_object
from bridge.errors import InvalidSpec
from bridge.plan import SBATCH_DROPPED_OFF_SLURM
from bridge.sbatch.script import parse_script
from tests.builders import cluster, trainjob_doc

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted([*(ROOT / "tests/integration/slurm/sbatch_corpus").glob("*.sbatch"),
                  *(ROOT / "examples").glob("*.sbatch")])
#: one cluster of each type that runs a script by its meaning
CLUSTERS = {"local": "local", "flux": "flux", "kubernetes": "k8s"}
#: the local cluster lends GPUs of its own list, so what a script asks of GPUs is mapped whatever this machine has
CONFIG = """\
apiVersion: hpcbridge.io/v1alpha1
kind: BridgeCluster
metadata: {name: local}
spec: {type: local, gpus: ["0", "1", "2", "3", "4", "5", "6", "7"]}
---
apiVersion: hpcbridge.io/v1alpha1
kind: BridgeCluster
metadata: {name: flux}
spec: {type: flux}
---
apiVersion: hpcbridge.io/v1alpha1
kind: BridgeCluster
metadata: {name: k8s}
spec: {type: kubernetes, defaults: {image: "python:3.12"}}
"""
NOTE = "hpcbridge: note: "
ERROR = "hpcbridge: error: "


@pytest.fixture(autouse=True)
def _config(tmp_path, monkeypatch):
    config = tmp_path / "clusters.yaml"
    config.write_text(CONFIG)
    monkeypatch.setenv("HPCBRIDGE_CONFIG", str(config))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))


def run(capsys, *argv: str) -> tuple[int, list[str], list[str]]:
    """``hpcbridge ARGV`` in this process: exit code, its notes and its error lines."""
    code = cli.main(list(argv))
    err = capsys.readouterr().err.splitlines()
    return (code, [line[len(NOTE):] for line in err if line.startswith(NOTE)],
            [line[len(ERROR):] for line in err if line.startswith(ERROR)])


def write(tmp_path: Path, text: str, name: str = "job.sbatch") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def line_of(where: str) -> str:
    """``#SBATCH line 6`` from a directive's ``#SBATCH line 6: --mail-type``."""
    return where.rpartition(": ")[0]


# --- the corpus, on every backend that runs a script by its meaning ----------------------------------------


def test_every_corpus_line_is_mapped_noted_or_refused_by_name_on_each_backend(capsys) -> None:
    summary = []
    for backend, name in CLUSTERS.items():
        accepted = dropped = refused_by_line = refused_whole = mapped = 0
        for path in SCRIPTS:
            code, notes, errors = run(capsys, "render", str(path), "--cluster", name)
            label = f"{path.name} on {backend}"
            if code != 0:
                assert code == 2 and len(errors) == 1, (label, errors)
                # a refusal names what the user wrote: a line of the script, or the script as a whole
                assert "metadata.annotations[" not in errors[0], (label, errors[0])
                if re.search(r"#SBATCH line \d+|command line: ", errors[0]):
                    refused_by_line += 1
                else:
                    assert re.search(r"\bline \d+|script: |a document must be", errors[0]), (label, errors[0])
                    refused_whole += 1
                continue
            accepted += 1
            assert not [n for n in notes if "passed through verbatim" in n], (label, notes)
            request = parse_script(path.read_text(), path.name)
            passed = {key.removeprefix(SBATCH_PASSTHROUGH_PREFIX) for key in
                      service.read_input(str(path)).single_trainjob().metadata.annotations or {}
                      if key.startswith(SBATCH_PASSTHROUGH_PREFIX)}
            for option, directive in request.options.items():
                told = [n for n in notes if n.startswith(f"{line_of(directive.where)}: --{option}")]
                if option in passed:
                    # Slurm's alone: accepted here only dropped, with exactly one note naming its line
                    assert len(told) == 1 and f"dropped on cluster '{name}' ({backend}): " in told[0], \
                        (label, option, notes)
                    dropped += 1
                else:
                    # a TrainJob field or a knob this backend declares (check_options passed)
                    assert not told, (label, option, told)
                    mapped += 1
        summary.append(f"sbatch anywhere on {backend}: {accepted}/{len(SCRIPTS)} scripts render; {mapped} lines "
                       f"mapped, {dropped} dropped with a note; {refused_by_line} scripts refused naming the line, "
                       f"{refused_whole} refused as a whole (sbatch refuses them, or only Slurm runs them)")
        assert accepted and dropped, summary[-1]
    print("\n" + "\n".join(summary))


def test_the_example_script_runs_off_slurm_with_one_note_for_its_mail_line(capsys, tmp_path, monkeypatch) -> None:
    from bridge import service

    # no scheduler here to ask: what each one answers a dry run is tested on the daemons (tests/integration)
    monkeypatch.setattr(service, "dry_run", lambda prepared, **_: None)
    example = str(ROOT / "examples/train.sbatch")
    for backend, name in CLUSTERS.items():
        code, notes, errors = run(capsys, "render", example, "--cluster", name)
        assert code == 0 and not errors, (backend, errors)
        mail = [n for n in notes if "mail-type" in n]
        assert mail == [f"#SBATCH line 6: --mail-type=END dropped on cluster '{name}' ({backend}): "
                        f"{SBATCH_DROPPED_OFF_SLURM['mail-type']}"], notes
        # dry-run and submit take the same path: the same verdict and the same notes
        dry = run(capsys, "submit", example, "--dry-run", "--cluster", name)
        assert dry[0] == 0 and dry[1] == notes
    # Slurm gets the script as it is: nothing dropped
    code, notes, _ = run(capsys, "render", example, "--to", "slurm")
    assert code == 0 and not [n for n in notes if "dropped" in n]


def test_each_harmless_option_is_dropped_once_and_what_matters_is_refused_naming_its_line(capsys, tmp_path):
    harmless = ("#!/bin/bash\n#SBATCH -N 2 --ntasks-per-node=2 -n 4 --time=UNLIMITED\n"
                "#SBATCH --comment='nightly run' --mail-type=END,FAIL --mail-user=me@example.org\n"
                "#SBATCH --nice=10 --requeue --kill-on-invalid-dep=yes --acctg-freq=30 --profile=task\n"
                "#SBATCH --wckey=proj --export=ALL --open-mode=append -v --ignore-pbs\n"
                "true\n")
    path = write(tmp_path, harmless)
    for backend, name in CLUSTERS.items():
        code, notes, errors = run(capsys, "render", path, "--cluster", name)
        assert code == 0 and not errors, errors
        said = {n.split(": ")[1].split("=")[0].split(" ")[0] for n in notes if " dropped on cluster " in n}
        assert said == {"--time", "--ntasks", "--comment", "--mail-type", "--mail-user", "--nice", "--requeue",
                        "--kill-on-invalid-dep", "--acctg-freq", "--profile", "--wckey", "--export",
                        "--open-mode", "--verbose", "--ignore-pbs"}, (backend, notes)
        assert len([n for n in notes if " dropped on cluster " in n]) == len(said)
        assert not [n for n in notes if "passed through verbatim" in n]
    # what changes the job: refused, the error naming the line the user wrote
    for line, where in (("--signal=USR1@60", "#SBATCH line 2: --signal"), ("--begin=now+1hour", "#SBATCH line 2: -"
                        "-begin"), ("--export=NONE", "#SBATCH line 2: --export"), ("-n 5 -N 2", "#SBATCH line 2: -n"),
                        ("--mem-per-cpu=1G", "#SBATCH line 2: --mem-per-cpu"), ("-p gpu", "#SBATCH line 2: -p")):
        path = write(tmp_path, f"#!/bin/bash\n#SBATCH {line}\ntrue\n")
        code, notes, errors = run(capsys, "render", path, "--cluster", "local")
        assert code == 2 and len(errors) == 1 and errors[0].startswith(f"{path}: {where}: "), (line, errors)
        assert "cluster 'local'" in errors[0]
        dry = run(capsys, "submit", path, "--dry-run", "--cluster", "local")
        assert dry[0] == 2 and dry[2] == errors


def test_open_mode_is_dropped_only_where_the_job_has_no_output_file_of_its_own(capsys, tmp_path) -> None:
    path = write(tmp_path, "#!/bin/bash\n#SBATCH --open-mode=append\n#SBATCH --output=run.log\ntrue\n")
    code, _, errors = run(capsys, "render", path, "--cluster", "flux")  # Flux writes --output itself
    assert code == 2 and errors[0].startswith(f"{path}: #SBATCH line 2: --open-mode: "), errors


# --- the same TrainJob as YAML, from the CLI and through the operator --------------------------------------


def trainjob(annotations: dict[str, str], namespace: str = "default"):
    return parse_object(trainjob_doc(namespace=namespace, uid="0b4c1f7e-0000-4000-8000-00000000000a",
                                     annotations=annotations,
                                     trainer={"command": ["python3", "train.py"], "image": "python:3.12"}), "TrainJob")


def test_a_trainjobs_pass_through_is_dropped_or_refused_naming_the_annotation() -> None:
    key = f"{SBATCH_PASSTHROUGH_PREFIX}mail-type"
    for kind in CLUSTERS:
        target = cluster(kind, name=f"my-{kind}")
        prepared = service.prepare(service.Input((trainjob({key: "END"}),), "t.yaml", None),
                                   configured={target.name: target}, cluster=target.name)
        assert prepared.plan.options.sbatch_extra == ()
        assert prepared.plan.options.dropped == (("mail-type", "END", SBATCH_DROPPED_OFF_SLURM["mail-type"]),)
        assert [n for n in prepared.notes if "dropped" in n] == [
            f"metadata.annotations[{key}]: --mail-type=END dropped on cluster 'my-{kind}' ({kind}): "
            f"{SBATCH_DROPPED_OFF_SLURM['mail-type']}"]
        with pytest.raises(InvalidSpec) as refused:
            service.prepare(service.Input((trainjob({f"{SBATCH_PASSTHROUGH_PREFIX}signal": "USR1@60"}),),
                                          "t.yaml", None), configured={target.name: target}, cluster=target.name)
        assert refused.value.field == f"metadata.annotations[{SBATCH_PASSTHROUGH_PREFIX}signal]"
        assert "has no equivalent of sbatch's --signal" in str(refused.value)
    # Slurm keeps every option
    slurm = cluster("slurm")
    plan = service.prepare(service.Input((trainjob({key: "END"}),), "t.yaml", None), configured={"hpc": slurm},
                           cluster="hpc").plan
    assert plan.options.sbatch_extra == (("mail-type", "END"),) and plan.options.dropped == ()


@pytest.mark.parametrize("kind, tenant", [("kubernetes", {}), ("flux", {"user": "alice"})])
def test_a_tenants_trainjob_is_held_to_the_allowlist_before_anything_is_dropped(kind, tenant) -> None:
    target = cluster(kind, name="shared", tenants=[{"name": "team-a", "namespaces": ["team-a"], **tenant}])

    def prepare(annotations: dict[str, str]) -> service.Prepared:
        return service.prepare(service.Input((trainjob(annotations, "team-a"),), "TrainJob team-a/train", None),
                               configured={"shared": target}, cluster="shared",
                               tenancy=tenancy.Request("team-a"))

    # the operator's path gives the CLI's verdict for an allowed option: dropped, with the same note
    allowed = prepare({f"{SBATCH_PASSTHROUGH_PREFIX}mail-type": "END"})
    assert [o for o, _, _ in allowed.plan.options.dropped] == ["mail-type"]
    # dropping never widens the allowlist: whom a job mails and its comment stay a tenant's refusals
    for option in ("mail-user", "comment"):
        assert option in SBATCH_DROPPED_OFF_SLURM and option not in tenancy.TENANT_SBATCH_OPTIONS
        with pytest.raises(InvalidSpec, match="not among the sbatch options a TrainJob from Kubernetes may pass"):
            prepare({f"{SBATCH_PASSTHROUGH_PREFIX}{option}": "x@example.org"})


def test_the_drop_list_is_documented_where_users_read_about_scripts_off_slurm() -> None:
    migration = (ROOT / "docs/migration.md").read_text()
    docs = (ROOT / "docs/sbatch-anywhere.md").read_text()
    for option in SBATCH_DROPPED_OFF_SLURM:
        assert f"`--{option}`" in docs and f"`--{option}`" in migration, option

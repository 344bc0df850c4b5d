"""Every command README.md shows has a place where it runs, written down here.

A README command is one line of a ```bash block, or an inline `make ...` / `python ...` span.
LEDGER says where each one runs: "as written" in a file (CI's script or a test) that must contain
the command's text literally, so a change on either side fails here; "variant" for a test that runs
the same thing with other arguments (named, with the difference); or "not run" with the reason
(hardware CI does not have). A README command missing from the ledger fails the test: adding one
to the README means deciding where it runs.
"""

import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
# docs/WORKSHOP.md's "One machine for the room" (the room's commands) is held to the same ledger.
ROOM_SECTION = re.search(r"## One machine for the room\n(.*?)(?=\n## )", (ROOT / "docs/WORKSHOP.md").read_text(), re.S)[1]

AS_WRITTEN, VARIANT, NOT_RUN = "as written", "variant", "not run"
LEDGER = {
    "make learn": (AS_WRITTEN, ".ci/check-learn.sh", "make learn"),
    "make test": (AS_WRITTEN, ".ci/run", "make test"),
    "make test-presets": (AS_WRITTEN, ".ci/run", "make test-presets"),
    "make test-room": (AS_WRITTEN, ".ci/run", "make test-room"),
    "make learner-copies": (AS_WRITTEN, ".ci/run", "make learner-copies"),
    "make preflight": (AS_WRITTEN, ".ci/run", "make preflight"),
    "python scripts/course_facts.py": (AS_WRITTEN, ".ci/run", "python scripts/course_facts.py"),
    "python scripts/summary.py": (AS_WRITTEN, ".ci/run", "python scripts/summary.py"),
    "python scripts/card_sizes.py": (VARIANT, "tests/test_card_sizes.py", "the script's functions: the same replayed peaks on the same cards, and its table recomputed"),
    "python -m workbench --help": (AS_WRITTEN, ".ci/run", "python -m workbench --help"),
    "python -m workbench": (AS_WRITTEN, ".ci/run", "python -m workbench --help"),
    "make lab": (VARIANT, "tests/test_readme_commands.py", "the teacher's JupyterLab: make learn's last line, on notebooks/ instead of learners/"),
    "make test PYTEST_ARGS=--hog": (VARIANT, ".ci/series", "the busy-core pass: whole .ci/runs beside a pinned busy loop; pytest's own --hog is not run in CI"),
    "make run-all PRESET=cpu": (NOT_RUN, "", "minutes per preset in a real browser; its records are benchmarks/results/lab-*.json"),
    "make run-all PRESET=P": (NOT_RUN, "", "as above"),
    "make benchmark": (NOT_RUN, "", "a timing record, minutes; tests/test_monitor.py covers the monitor it measures"),
    "make gpu-check": (VARIANT, "tests/test_gpu_check.py", "make -o setup gpu-check on this CPU machine (set-up marked done): "
                       "the one no-GPU line, nothing written; the check itself needs a CUDA GPU"),
    "python scripts/gpu_check.py --preset cpu-quick --out /tmp/dry": (NOT_RUN, "", "every notebook once more, minutes; CI's notebook passes cover the notebooks"),
    "python benchmarks/notebook_times.py --preset P --isa avx2 [--hog]": (NOT_RUN, "", "a placeholder command (P); make test-presets runs this script (--start-method spawn)"),
    "python -m workbench --model gpt --precision bf16 --steps 300": (VARIANT, "tests/test_cli.py", "main() with a small model and few steps"),
    "ACCELERATE_USE_CPU=1 accelerate launch --multi_gpu --num_processes 2 -m workbench": (VARIANT, "tests/test_cli.py", "accelerate.commands.launch with 2 CPU processes and small flags"),
    "accelerate launch --multi_gpu --num_processes 4 -m workbench --model gpt": (NOT_RUN, "", "needs 4 GPUs; the 2-CPU-process variant runs in tests/test_cli.py"),
    "torchrun --nproc_per_node 4 -m workbench --model gpt": (VARIANT, "tests/test_two_nodes.py", "torch.distributed.run --standalone with 2 CPU processes: one world of two, equal to one process of both batches"),
    "accelerate launch --multi_gpu --num_machines 2 --num_processes 16 --machine_rank 0 --main_process_ip 10.0.0.1 --main_process_port 29500 -m workbench --model gpt":
        (VARIANT, "tests/test_cli.py", "two 'machines' on loopback, one process each"),
    "scripts/two_nodes.sh /tmp/wb-nodes --model mlp --data digits --batch-size 32 --steps 12 --log-every 2 --save-every 4":
        (AS_WRITTEN, "tests/test_two_nodes.py", "scripts/two_nodes.sh /tmp/wb-nodes --model mlp --data digits --batch-size 32 --steps 12 --log-every 2 --save-every 4"),
    "scripts/two_nodes.sh /tmp/wb-restart --model mlp --data digits --batch-size 32 --steps 12 --log-every 2 --save-every 4 --fail-at-step 10":
        (AS_WRITTEN, "tests/test_two_nodes.py", "scripts/two_nodes.sh /tmp/wb-restart --model mlp --data digits --batch-size 32 --steps 12 --log-every 2 --save-every 4 --fail-at-step 10"),
    "torchrun --standalone --nproc-per-node 2": (VARIANT, "tests/test_two_nodes.py", "with the two-node command's workbench flags, as the reference the two nodes equal"),
    "OUT=/shared/runs/gpt sbatch scripts/slurm_two_nodes.sbatch --model gpt --steps 300 --save-every 50":
        (NOT_RUN, "", "no Slurm here; tests/test_two_nodes.py checks the file parses and gives torchrun the tested options"),
    "accelerate launch --cpu": (NOT_RUN, "", "named as what not to use for 2 CPU processes"),
    "python examples/activation_checkpointing.py": (VARIANT, "tests/test_examples.py", "standalone with the workbench blocked, at tiny sizes (--steps 3 --layers 1 ...), its losses held equal to wb.run's"),
    "python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .gpu/whl/*.whl && export PYTHONPATH=/tmp/site:$PWD && python3 scripts/gpu_check.py --out \"$OUT/gpu\" --tar-only":
        (NOT_RUN, "", "the offline GPU recipe: runs on the GPU machine"),
    "bash scripts/gpu_bundle.sh": (NOT_RUN, "", "downloads wheels for the GPU machine"),
    ".venv/bin/pip install --no-deps -r requirements/dali.txt": (VARIANT, ".ci/run", "CI pip-installs the pinned DALI wheel with requirements/lock.txt as constraints"),
    "python .ci/install_matrix.py": (AS_WRITTEN, ".ci/run", "python .ci/install_matrix.py"),
    "make wheelhouse SET=learn": (VARIANT, ".ci/run", "make wheelhouse: the test set, of which the learner's is a part"),
    "python scripts/install.py learn": (VARIANT, ".ci/check-learn.sh", "make learn runs python3 scripts/install.py learn, then the learner's copies and JupyterLab"),
    "python scripts/install.py learn --open": (VARIANT, "tests/test_install.py", "this environment's python, LEARNERS in a temporary folder, stopped once JupyterLab serves"),
    "python3 scripts/install.py learn --open": (VARIANT, "tests/test_install.py", "as above"),
    "python3 scripts/install.py learn --dry-run": (NOT_RUN, "", "3-4 min (pip reads ~150 whole wheels): `.ci/install_matrix.py --only debian` runs it as a non-root user with Debian's python3, by hand"),
    "python scripts/install.py test": (VARIANT, ".ci/run", "make setup runs python3 scripts/install.py test (from the wheelhouse, offline)"),
    "make learn PYTHON=python3.12": (VARIANT, "tests/test_install.py", "make -n learn: the set-up runs with $(PYTHON); an older Python's refusal names this fix"),
    "python -m workbench notebooks my-course": (VARIANT, "tests/test_packaging.py", "from a wheel installed in a venv outside the repo, into course/"),
    "make wheelhouse": (AS_WRITTEN, ".ci/run", "make wheelhouse"),
    "WORKBENCH_WHEELHOUSE=wheelhouse make learn": (VARIANT, ".ci/run", "CI's set-up: WORKBENCH_WHEELHOUSE=wheelhouse make setup, the index unreachable (make learn's install step)"),
    "make lock": (NOT_RUN, "", "re-resolves against the live index, minutes; tests/test_lock.py checks the lock it wrote (python scripts/lock.py --check, in .ci/run too)"),
    "make drift": (NOT_RUN, "", "a second environment and the whole suite, ~20 min; its last report is benchmarks/results/drift.json"),
    "conda env create -f environment.yml": (NOT_RUN, "", "CI has no conda; tests/test_lock.py checks environment.yml follows the lock"),
    # docs/WORKSHOP.md, "One machine for the room"
    "make room": (VARIANT, "tests/browser/test_room.py", "make -o setup room SEATS=3 ROOM_ARGS=... (loopback, a free port, a test prefix)"),
    "make room SEATS=8 ROOM_ARGS=--https": (VARIANT, "tests/browser/test_room.py", "SEATS=3 with --https and its certificate made at start"),
    "make room-cert HOST=room.lan": (VARIANT, "tests/test_room_hub.py", "make_certificate(tmp, 'room.example'): the same openssl call"),
    "make room-update": (VARIANT, "tests/browser/test_room.py", "python scripts/room_hub.py update --from FOLDER (the fixed copies of a test)"),
    "python scripts/room_hub.py restart learner03": (VARIANT, "tests/browser/test_room.py", "the admin page's Stop Server and Start Server, which the command calls the same hub API for"),
    "python scripts/room_hub.py status": (NOT_RUN, "", "prints the hub API's users; the browser test reads the same API"),
    "make room SEATS=8": (VARIANT, "tests/browser/test_room.py", "SEATS=3, on loopback and a free port, as root"),
    'make room SEATS=8 ROOM_ARGS="--memory 3G --cores 2 --preset cpu --port 8080"':
        (VARIANT, "tests/browser/test_room.py", "ROOM_ARGS with --memory 1536M --cores 1 --preset cpu-quick, a free port"),
    "make room-stop": (VARIANT, "tests/browser/test_room.py", "make -o setup room-stop, in the test's teardown"),
    "make room-reset": (VARIANT, "tests/browser/test_room.py", "make -o setup room-reset, in the test's teardown"),
    "python scripts/room_hub.py start --help": (AS_WRITTEN, "tests/test_room_hub.py", "python scripts/room_hub.py start --help"),
}


def readme_commands(text: str = README) -> list[str]:
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in re.sub(r"\\\n\s*", " ", block).splitlines():
            command = re.sub(r"\s+", " ", line.split("  #")[0]).strip()
            if command and not command.startswith("#"):
                commands.append(command)
    spans = re.findall(r"`((?:[A-Z_]+=\S+ )*(?:make|python3?|bash|conda|accelerate|torchrun|\.venv/bin/\w+) [^`]*)`", text)
    commands += [re.sub(r"\s+", " ", s).strip() for s in spans]
    return sorted(set(commands))


def test_every_readme_command_has_a_place_in_the_ledger():
    missing = [c for c in readme_commands() + readme_commands(ROOM_SECTION) if c not in LEDGER]
    assert not missing, "README commands with no place where they run (add them to LEDGER):\n" + "\n".join(missing)


@pytest.mark.parametrize("command", [c for c, (how, _, _) in LEDGER.items() if how == AS_WRITTEN])
def test_a_command_run_as_written_is_in_its_file_literally(command):
    _, where, text = LEDGER[command]
    assert text in (ROOT / where).read_text(), f"{where} no longer runs {text!r} (README: {command!r})"


def test_the_ledger_names_no_command_the_readme_dropped():
    shown = set(readme_commands()) | set(readme_commands(ROOM_SECTION))
    assert not [c for c in LEDGER if c not in shown]


def test_make_learn_runs_as_written_here(tmp_path):
    """.ci/check-learn.sh's path, on this machine: `make learn` with the set-up step marked done
    (`-o setup`: this environment is installed already, and a test must not re-install it)."""
    learners = tmp_path / "learners"  # not the repository's learners/: a developer's answers live there
    proc = subprocess.run(["bash", ".ci/check-learn.sh", "-o", "setup", f"PY={sys.executable}"], cwd=ROOT,
                          env={**os.environ, "PY_CHECK": sys.executable, "LEARNERS": str(learners)},
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"JupyterLab started on {learners}/" in proc.stdout
    assert len(list(learners.glob("*.ipynb"))) == len(list((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")))
    lab = subprocess.run(["make", "-n", "-o", "setup", "lab", f"PY={sys.executable}"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    assert f"{sys.executable} -m jupyter lab notebooks/" in lab  # the teacher's: the same line on notebooks/

"""JupyterHub for a workshop on one machine: `make room SEATS=8` (scripts/room_hub.py start) runs it.

Everything a room differs by is in <state>/room.json, written by scripts/room_hub.py: the learners, the
preset, cores and memory per learner, the address, the limit mode this machine allows. This file
only turns it into JupyterHub's settings.
"""

import json
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # room.spawner, room.limits

STATE = Path(os.environ["WORKBENCH_ROOM_STATE"])
room = json.loads((STATE / "room.json").read_text())

c = get_config()  # noqa: F821 (JupyterHub's, in the namespace it runs this file in)

# Where the learners come in, and the hub's own two ports (the proxy's API and the hub's), on loopback.
c.JupyterHub.bind_url = f"http://{room['ip']}:{room['port']}"
c.JupyterHub.hub_bind_url = f"http://127.0.0.1:{room['hub_port']}"
c.ConfigurableHTTPProxy.api_url = f"http://127.0.0.1:{room['proxy_api_port']}"
c.ConfigurableHTTPProxy.command = [str(REPO / "room/node_modules/.bin/configurable-http-proxy")]
c.JupyterHub.db_url = f"sqlite:///{STATE / 'jupyterhub.sqlite'}"
c.JupyterHub.cookie_secret_file = str(STATE / "jupyterhub_cookie_secret")
c.JupyterHub.pid_file = str(STATE / "jupyterhub.pid")
c.JupyterHub.cleanup_servers = True  # stopping the hub stops every learner's server and kernels

# Real accounts: PAM checks the system password scripts/room_hub.py set (the roster, root's only).
c.JupyterHub.authenticator_class = "pam"
c.PAMAuthenticator.open_sessions = False  # no login session to open for a web login (and none in a container)
c.Authenticator.allowed_users = set(room["learners"])
c.Authenticator.admin_users = set()

c.JupyterHub.spawner_class = "room.spawner.RoomSpawner"
c.RoomSpawner.cmd = [room["python"], "-m", "jupyterhub.singleuser"]
c.RoomSpawner.default_url = "/lab"
c.RoomSpawner.copies = str(STATE / "copies")
c.RoomSpawner.cores = room["cores"]
c.RoomSpawner.memory_bytes = room["memory_bytes"]
c.RoomSpawner.limit_mode = room["limit_mode"]
threads = str(max(1, int(room["cores"])))
c.RoomSpawner.room_env = {
    "WORKBENCH_PRESET": room["preset"],
    "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads, "OPENBLAS_NUM_THREADS": threads,  # torch's too
    "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
    "PYTHONPATH": str(REPO),  # this checkout's workbench, and room.limits for the kernel start file
    "JUPYTER_PATH": str(STATE / "share/jupyter"),  # the room's python3 kernel spec first
    **room.get("env", {}),
    # the teacher's trackio room (docs/WORKSHOP.md, "What the room measured"): wb.share finds it
    **({"WORKBENCH_ROOM": os.environ["WORKBENCH_ROOM"]} if os.environ.get("WORKBENCH_ROOM") else {}),
}
# Three learners pressing "start" at once on a small machine: give a busy server time to answer.
c.RoomSpawner.start_timeout = 180
c.RoomSpawner.http_timeout = 180

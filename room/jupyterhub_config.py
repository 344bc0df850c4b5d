"""JupyterHub for a workshop on one machine: `make room SEATS=8` (scripts/room_hub.py start) runs it.

Everything a room differs by is in <state>/room.json, written by scripts/room_hub.py: the learners and
the teacher, the preset, cores and memory per learner, the address, the certificate, the idle timeout,
the limit mode this machine allows. This file only turns it into JupyterHub's settings.
"""

import json
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # room.spawner, room.limits

STATE = Path(os.environ["WORKBENCH_ROOM_STATE"])
room = json.loads((STATE / "room.json").read_text())
keys = json.loads((STATE / "room-keys.json").read_text())  # key -> {name, teacher}: root's only

c = get_config()  # noqa: F821 (JupyterHub's, in the namespace it runs this file in)

# Where the learners come in, and the hub's own two ports (the proxy's API and the hub's), on loopback.
c.JupyterHub.bind_url = f"{'https' if room.get('ssl_cert') else 'http'}://{room['ip']}:{room['port']}"
c.JupyterHub.hub_bind_url = f"http://127.0.0.1:{room['hub_port']}"
if room.get("ssl_cert"):  # the teacher's certificate (scripts/room_hub.py cert): the proxy speaks HTTPS
    c.JupyterHub.ssl_cert, c.JupyterHub.ssl_key = room["ssl_cert"], room["ssl_key"]
c.ConfigurableHTTPProxy.api_url = f"http://127.0.0.1:{room['proxy_api_port']}"
# The proxy from the wheelhouse (pip's configurable-http-proxy, in Python; room/proxy.py adds TLS):
# no Node.js, no npm at `make room` time.
c.ConfigurableHTTPProxy.command = [room["python"], str(REPO / "room/proxy.py")]
c.JupyterHub.db_url = f"sqlite:///{STATE / 'jupyterhub.sqlite'}"
c.JupyterHub.cookie_secret_file = str(STATE / "jupyterhub_cookie_secret")
c.JupyterHub.pid_file = str(STATE / "jupyterhub.pid")
c.JupyterHub.cleanup_servers = True  # stopping the hub stops every learner's server and kernels

# Real accounts: PAM checks the system password scripts/room_hub.py set (the roster, root's only).
c.JupyterHub.authenticator_class = "pam"
c.PAMAuthenticator.open_sessions = False  # no login session to open for a web login (and none in a container)
c.Authenticator.allowed_users = set(room["learners"]) | {room["teacher"]}
# The teacher is the hub's admin: /hub/admin lists every learner's server, to stop, start, or open to help
# (JupyterHub's admin role includes access to the servers: admin_access is deprecated and changes nothing).
c.Authenticator.admin_users = {room["teacher"]}

# The room's services, started and stopped with the hub:
# - room: the store learners share to (workbench/classroom/store.py), one key per account, on
#   loopback; also reachable through the proxy at /services/room/ (laptops on the room's network).
# - idle-culler: JupyterHub's own (jupyterhub-idle-culler), stops a server idle for cull_idle_s.
# - room-admin: a token scripts/room_hub.py uses (status, restart), root's only.
python = room["python"]
services = [{"name": "room", "url": f"http://127.0.0.1:{room['store_port']}",
             "command": [python, "-m", "workbench.classroom.store", "--store", str(STATE / "records"),
                         "--keys", str(STATE / "room-keys.json"), "--port", str(room["store_port"])],
             "environment": {"PYTHONPATH": str(REPO)}},
            {"name": "room-admin", "api_token": (STATE / "admin-token").read_text().strip()}]
roles = [{"name": "room-admin", "scopes": ["admin:users", "admin:servers", "list:users", "read:users", "list:services",
                                          "read:services"],
          "services": ["room-admin"]}]
if room.get("cull_idle_s"):
    services.append({"name": "idle-culler",
                     "command": [python, "-m", "jupyterhub_idle_culler", f"--timeout={room['cull_idle_s']}",
                                 f"--cull-every={room['cull_every_s']}"]})
    roles.append({"name": "idle-culler", "services": ["idle-culler"],
                  "scopes": ["list:users", "read:users:activity", "read:servers", "delete:servers"]})
c.JupyterHub.services = services
c.JupyterHub.load_roles = roles

c.JupyterHub.spawner_class = "room.spawner.RoomSpawner"
c.RoomSpawner.cmd = [room["python"], "-m", "jupyterhub.singleuser"]
c.RoomSpawner.default_url = "/lab"
c.RoomSpawner.copies = str(STATE / "copies")
c.RoomSpawner.teacher_copies = str(STATE / "teacher-copies")
c.RoomSpawner.teachers = [room["teacher"]]
c.RoomSpawner.state = str(STATE)
c.RoomSpawner.room_keys = {who["name"]: key for key, who in keys.items()}
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
    # the room's store, straight on loopback (no proxy, no certificate): wb.share needs no argument
    "WORKBENCH_ROOM": f"http://127.0.0.1:{room['store_port']}/services/room/",
    # how often a server tells the hub it was active: often enough for the idle culler's timeout
    "JUPYTERHUB_ACTIVITY_INTERVAL": str(room.get("activity_interval_s", 300)),
    **room.get("env", {}),
}
# Three learners pressing "start" at once on a small machine: give a busy server time to answer.
c.RoomSpawner.start_timeout = 180
c.RoomSpawner.http_timeout = 180

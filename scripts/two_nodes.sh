#!/usr/bin/env bash
# Two "nodes" on one machine: two torchrun agents (one process each) meet at a c10d rendezvous on
# loopback and train one data-parallel run over gloo; each saves every --save-every steps into the
# same folder (rank 0 writes) and, restarted by torchrun (--max-restarts), resumes from the last save.
#
#   scripts/two_nodes.sh OUT [workbench flags...]
#   scripts/two_nodes.sh /tmp/wb-nodes --model mlp --data digits --steps 12 --log-every 2 --save-every 4 --fail-at-step 10
#
# Without a GPU the processes train on the CPU and connect over gloo; with one GPU per process, NCCL.
#
# OUT gets node0.log, node1.log, result.json (rank 0's figures) and saves/step_N (the checkpoints).
# Environment: PORT (the rendezvous port, default 29400), RDZV_ID (default wb-two-nodes),
# MAX_RESTARTS (default 1), TORCHRUN (default torchrun). On two real machines run the same torchrun
# line once on each, with --rdzv-endpoint the first machine's host:PORT and OUT on a shared disk
# (scripts/slurm_two_nodes.sbatch does that under Slurm).
set -euo pipefail
if [ $# -lt 1 ]; then
  echo "usage: $0 OUT [workbench flags...]" >&2
  exit 2
fi
out=$1
shift
mkdir -p "$out"
# torch 2.13's agents share one TCP store with their workers across restarts, and the restarted
# workers read the dead ones' gloo addresses from it (measured: 'connectFullMesh failed ... Connection
# refused' after every restart); with this each round's rank 0 starts a fresh store.
export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=${TORCH_DISABLE_SHARE_RDZV_TCP_STORE:-1}
pids=()
for node in 0 1; do
  ${TORCHRUN:-torchrun} --nnodes 2 --nproc-per-node 1 \
    --rdzv-backend c10d --rdzv-endpoint "127.0.0.1:${PORT:-29400}" --rdzv-id "${RDZV_ID:-wb-two-nodes}" \
    --max-restarts "${MAX_RESTARTS:-1}" \
    -m workbench --save-state-dir "$out/saves" --resume-from auto --json "$out/result.json" "$@" \
    >"$out/node$node.log" 2>&1 &
  pids+=($!)
done
status=0
for node in 0 1; do
  wait "${pids[$node]}" || status=$?
  echo "node $node: exit $([ $status -eq 0 ] && echo 0 || echo $status), log $out/node$node.log"
done
exit $status

#!/usr/bin/env bash
# Starts N training workers on this machine (127.0.0.1, free ports), each with its TF_CONFIG, and waits for them.
#
#   scripts/launch_local_cluster.sh N [train.py flags...]
#   scripts/launch_local_cluster.sh 2 --data_dir data/numbers --logdir runs/numbers_2w --batch_size 4000
#
# Worker 0 is the chief (checkpoints, summaries, dev BLEU). --batch_size is the global batch, split over the N
# workers. Each worker's output goes to $CLUSTER_LOG_DIR/workerI.log (default runs/cluster_logs); the chief's is also
# shown here. Ctrl-C or SIGTERM stops every worker (they agree on the step to stop after and the chief saves a
# checkpoint); if one worker fails, the others are stopped too. Run the same command again to resume.
# Environment: PYTHON (default .venv/bin/python), TRAIN_SCRIPT (default train.py), CLUSTER_LOG_DIR.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

if [ $# -lt 1 ] || ! [[ "$1" =~ ^[1-9][0-9]*$ ]]; then
  echo "usage: $0 N [train.py flags...]   (N >= 1 workers on 127.0.0.1)" >&2
  exit 2
fi
NUM_WORKERS="$1"
shift
PYTHON="${PYTHON:-$ROOT/.venv/bin/python}"
[ -x "$PYTHON" ] || PYTHON=python3
TRAIN_SCRIPT="${TRAIN_SCRIPT:-train.py}"
LOG_DIR="${CLUSTER_LOG_DIR:-$ROOT/runs/cluster_logs}"
GRACE_SECONDS=60
mkdir -p "$LOG_DIR"

# Free ports: bound to port 0 by the OS, then released for the workers' servers.
PORTS=($("$PYTHON" - "$NUM_WORKERS" <<'EOF'
import socket, sys
sockets = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in sockets:
    s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in sockets))
EOF
))
HOSTS="$(printf '"127.0.0.1:%s",' "${PORTS[@]}")"
HOSTS="[${HOSTS%,}]"

PIDS=()
stop_workers() {
  trap - EXIT INT TERM
  local alive=()
  for pid in "${PIDS[@]}"; do
    kill -0 "$pid" 2>/dev/null && alive+=("$pid")
  done
  [ ${#alive[@]} -eq 0 ] && return
  echo "stopping workers ${alive[*]} (SIGTERM; SIGKILL after ${GRACE_SECONDS} s)" >&2
  kill -TERM "${alive[@]}" 2>/dev/null || true
  for _ in $(seq "$GRACE_SECONDS"); do
    local running=0
    for pid in "${alive[@]}"; do
      kill -0 "$pid" 2>/dev/null && running=1
    done
    [ "$running" -eq 0 ] && return
    sleep 1
  done
  kill -KILL "${alive[@]}" 2>/dev/null || true
}
trap stop_workers EXIT
trap 'stop_workers; exit 130' INT
trap 'stop_workers; exit 143' TERM

for ((i = 0; i < NUM_WORKERS; i++)); do
  export TF_CONFIG="{\"cluster\": {\"worker\": $HOSTS}, \"task\": {\"type\": \"worker\", \"index\": $i}}"
  "$PYTHON" "$TRAIN_SCRIPT" --distribute multiworker "$@" > "$LOG_DIR/worker$i.log" 2>&1 &
  PIDS+=($!)
  echo "worker $i: pid $! on 127.0.0.1:${PORTS[$i]}, log $LOG_DIR/worker$i.log"
done
unset TF_CONFIG
tail -n +1 -f "$LOG_DIR/worker0.log" --pid "${PIDS[0]}" &

RUNNING=("${PIDS[@]}")
STATUS=0
while [ ${#RUNNING[@]} -gt 0 ]; do
  FINISHED=""
  wait -n -p FINISHED "${RUNNING[@]}" || STATUS=$?
  RUNNING=($(printf '%s\n' "${RUNNING[@]}" | grep -vx "$FINISHED" || true))
  if [ "$STATUS" -ne 0 ]; then
    echo "worker pid $FINISHED exited with status $STATUS; stopping the others (see $LOG_DIR)" >&2
    stop_workers
    break
  fi
done
wait
exit "$STATUS"

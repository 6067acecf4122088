# shellcheck shell=bash
# The functions of deploy/slurm/flatlab.sbatch that choose the job's ports, check who listens on them and
# start its MLflow server. The batch script sources this file from its checkout (FLATLAB_HOME);
# tests/deploy/test_slurm_script.py runs the same functions without SLURM. Nothing here runs on its own.
#
# What they read: FLATLAB_JOB_TAG (a value only this job's processes carry in their environment), and the
# settings FLATLAB_MLFLOW_PORT, FLATLAB_MLFLOW_WORKERS and FLATLAB_MLFLOW_HOSTS (deploy/settings.env).

log() { printf '%s flatlab.sbatch: %s\n' "$(date +%H:%M:%S)" "$*"; }
die() { log "error: $*" >&2; exit 2; }
alive() { [[ -n $1 ]] && kill -0 "$1" 2>/dev/null; }

free_ports() {  # N: N distinct TCP ports that are free on every address of this machine, one line
  # Each probe socket binds the port on every address (Ray's GCS listens on each interface of a node whose
  # address is not loopback) and never listens; all N are held at once, so they differ.
  python - "$1" <<'PY'
import socket
import sys

held = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in held:
    s.bind(("", 0))
print(" ".join(str(s.getsockname()[1]) for s in held))
PY
}

choose_ports() {  # KEY...: export each KEY (FLATLAB_RAY_PORT ...) as a port free on this machine, all distinct
  (($#)) || return 0
  local ports key i=0
  read -ra ports <<<"$(free_ports $#)"
  ((${#ports[@]} == $#)) || die "could not find $# free ports on $(hostname)"
  for key in "$@"; do
    export "$key=${ports[i]}"
    i=$((i + 1))
  done
}

port_owner() {  # PORT: "ours" when every listener on PORT is a process of this job, "other" when any is not,
  # nothing when nothing listens. A process is this job's when its environment holds FLATLAB_JOB_TAG (ss -p
  # names no process of another user: that listener is not ours either).
  local lines line
  lines=$(ss -Htlnp "sport = :$1" 2>/dev/null) || true
  [[ -n $lines ]] || return 0
  while IFS= read -r line; do
    # no pipelines here: under pipefail, `... | grep -q` fails when grep's early exit cuts its writer off
    if ! [[ $line =~ pid=([0-9]+) ]] || ! grep -qzxF "FLATLAB_JOB_TAG=$FLATLAB_JOB_TAG" "/proc/${BASH_REMATCH[1]}/environ" 2>/dev/null; then
      echo other
      return 0
    fi
  done <<<"$lines"
  echo ours
}

wait_port() {  # ADDR PORT SECONDS WHAT PID: until this job's process listens on PORT and ADDR:PORT accepts,
  # while PID lives; a listener of another process (another job on this node) stops the job at once
  local deadline=$((SECONDS + $3)) owner
  while :; do
    owner=$(port_owner "$2")
    [[ $owner != other ]] || die "$4: port $2 on $(hostname) is taken by a process that is not this job's" \
      "(another job on this node?); leave FLATLAB_RAY_PORT, FLATLAB_DASHBOARD_PORT and FLATLAB_MLFLOW_PORT unset" \
      "and each job probes free ports of its own"
    if [[ $owner == ours ]] && (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null; then
      return 0
    fi
    alive "$5" || die "$4 ended before it listened on $1:$2"
    ((SECONDS < deadline)) || die "$4 did not listen on $1:$2 within $3 s"
    sleep 1
  done
}

mlflow_hosts() {  # PORT ADDR NODE: the Host headers the job's MLflow server answers, comma-separated:
  # FLATLAB_MLFLOW_HOSTS (loopback: an SSH tunnel), then ADDR (the tracking URI's), the node's SLURM name and
  # this machine's hostnames, each at PORT
  local out=$FLATLAB_MLFLOW_HOSTS name
  for name in "$2" "$3" "$(hostname)" "$(hostname -s 2>/dev/null)" "$(hostname -f 2>/dev/null)"; do
    [[ -n $name && ,$out, != *",$name:$1,"* ]] && out+=",$name:$1"
  done
  echo "$out"
}

start_mlflow() {  # ADDR NODE STORE_URI ARTIFACT_URI LOG: the job's MLflow server on ADDR:FLATLAB_MLFLOW_PORT, in a
  # session of its own (mlflow_pid: the session's and its process group's id, for kill -- -PID)
  setsid mlflow server --host "$1" --port "$FLATLAB_MLFLOW_PORT" --workers "$FLATLAB_MLFLOW_WORKERS" \
    --allowed-hosts "$(mlflow_hosts "$FLATLAB_MLFLOW_PORT" "$1" "$2")" \
    --backend-store-uri "$3" --default-artifact-root "$4" --no-serve-artifacts >"$5" 2>&1 &
  mlflow_pid=$!
}

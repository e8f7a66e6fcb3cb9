#!/usr/bin/env bash
# Ray's autoscaler on one machine, end to end: a head with no CPUs (tests/cluster/local.yaml, fake multi-node
# provider), the tiny sweep submitted as a Ray job, worker nodes added for its pending trials, the sweep finished,
# the idle workers removed, the cluster stopped. Prints a timeline; record it with
#   bash tests/cluster/autoscale_local.sh | tee docs/measurements/<date>/autoscale_local/output.txt
# Not in CI: it starts a second Ray cluster (head + up to two raylets) beside pytest's, ~3-5 min on 2 cores.
# It never runs `ray stop` (that stops every Ray process of the machine, other users' too): it ends its own head's
# process group and the raylets under its own temp dir, by pid. Every port it opens is a free one it picked, so it
# runs beside other Ray clusters of the machine.
set -euo pipefail
cd "$(dirname "$0")/../.."
repo=$PWD
work=$(mktemp -d /tmp/calsweep-autoscale.XXXX)
free_port() { python -c "import socket; s = socket.socket(); s.bind(('', 0)); print(s.getsockname()[1])"; }
port=$(free_port) dashboard=$(free_port) client=$(free_port) agent=$(free_port)
ip=$(python -c "import ray._private.services as s; print(s.get_node_ip_address())")
# RAY_AUTH_MODE: `ray start` turns token auth on, its own `ray status` then sends none (a one-machine cluster)
export RAY_FAKE_CLUSTER=1 RAY_AUTH_MODE=disabled RAY_USAGE_STATS_ENABLED=0 RAY_TMPDIR="$work/ray" PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"
export CALSWEEP_DATA_DIR="${CALSWEEP_DATA_DIR:-$(cd .. && pwd)/shared/data}" HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
# the provider starts worker raylets against provider.gcs_address (default <ip>:6379, maybe another user's Ray)
python - "$repo/tests/cluster/local.yaml" "$work/local.yaml" "$ip:$port" <<'EOF'
import sys, yaml
config = yaml.safe_load(open(sys.argv[1]))
config["provider"]["gcs_address"] = sys.argv[3]
yaml.safe_dump(config, open(sys.argv[2], "w"))
EOF
say() { echo "== $(date -u +%T) $*"; }
status() { ray status --address "$ip:$port" 2>&1 | grep -v -e '^-*$' -e '^=' -e '^ *(no .*)$' || true; }
say "ray start --head --num-cpus 0 --autoscaling-config (fake_multinode, gcs $ip:$port, temp dir $work/ray)"
setsid ray start --head --block --num-cpus 0 --port "$port" --dashboard-port "$dashboard" --ray-client-server-port "$client" \
    --dashboard-agent-listen-port "$agent" --temp-dir "$work/ray" --autoscaling-config "$work/local.yaml" \
    >"$work/head.log" 2>&1 &
head=$!
stop() {
  kill -TERM -- "-$head" 2>/dev/null || true
  for _ in $(seq 20); do kill -0 "$head" 2>/dev/null || break; sleep 1; done
  for pid in $(pgrep -f -- "$work/" || true); do kill -KILL "$pid" 2>/dev/null || true; done  # its raylets, the job
  say "cluster stopped; processes left naming $work: $(pgrep -fc -- "$work/" || true)"
}
trap stop EXIT
for _ in $(seq 60); do status | grep -q "Active:" && break; sleep 2; done
say "head up; before the job:"; status
ray job submit --address "http://127.0.0.1:$dashboard" -- \
    python "$repo/sweeps/launch.py" --config "$repo/tests/sweeps/tiny_sweep.yaml" --address auto \
    --results-dir "$work/results" resources.cpus_per_worker=0.9 resources.max_concurrent_trials=2 \
    >"$work/job.log" 2>&1 &
job=$!
say "job submitted (the tiny sweep: 2 trials, each on a 0.9-CPU warm actor, 2 at a time)"
seen=""
while kill -0 "$job" 2>/dev/null; do  # the autoscaler's view whenever it changes: demands, launches, nodes
  now=$(status | grep -E "ray.worker.cpu|CPU|Pending|pending|launching" | sed 's/ *$//' || true)
  if [ "$now" != "$seen" ]; then say "while the job runs:"; status; seen=$now; fi
  sleep 3
done
wait "$job" && rc=0 || rc=$?
say "job ended (ray job submit exit $rc); its output:"; grep -v "^$" "$work/job.log" | sed "s/\x1b\[[0-9;]*m//g" | tail -n 40
say "rows in the store:"
python -c "
from sweeps import store
print(store.read_trials('$work/results', 'tiny').select(['trial_id', 'status', 'node_id', 'hostname']).to_pandas().to_string())"
say "idle workers go after idle_timeout_minutes (0.5):"
for _ in $(seq 40); do
  sleep 5
  if ! ray status --address "$ip:$port" | sed -n '/Active:/,/Pending:/p' | grep -q "ray.worker.cpu"; then break; fi
done
say "after the idle timeout:"; status
exit "$rc"

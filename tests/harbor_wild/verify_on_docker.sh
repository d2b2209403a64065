#!/bin/bash
# Run every task in tests/harbor_wild/tasks/ on a real Docker engine the way Harbor's oracle agent and verifier do,
# once with the reference solution ("oracle") and once with nothing done ("noop"), and print the rewards.
#
#   tests/harbor_wild/verify_on_docker.sh [TASK_NAME ...]
#
# Per task: `docker build -t wild-<task> environment/`; then for each mode a container `sleep infinity`,
# `mkdir -p /logs/verifier /logs/agent` (the harness always does this; tasks must not rely on it but most do),
# oracle only: upload solution/ to /solution and run `/solution/solve.sh` from the WORKDIR (task.toml's
# [environment] workdir if set, else the image's WORKDIR), output to /logs/agent/oracle.txt;
# then upload tests/ to /tests, remove stale reward files, run `/tests/test.sh` from the WORKDIR with output to
# /logs/verifier/test-stdout.txt, and read /logs/verifier/reward.txt or reward.json.
# Every container and image this script creates is removed on exit (it never touches any other image).
#
# Environment: WILD_KEEP_LOGS=DIR copies each run's /logs there; WILD_RESULTS=FILE writes a TSV of the results;
# WILD_TEST_TIMEOUT (seconds, default 300) bounds solve.sh and test.sh each.
# Sequential on purpose (small shared machines).

set -u
HERE="$(cd "$(dirname "$0")" && pwd)"
TASKS_DIR="$HERE/tasks"
TEST_TIMEOUT="${WILD_TEST_TIMEOUT:-300}"
RESULTS="${WILD_RESULTS:-}"

CREATED_CONTAINERS=()
CREATED_IMAGES=()

cleanup() {
  for c in "${CREATED_CONTAINERS[@]}"; do docker rm -f "$c" >/dev/null 2>&1; done
  for i in "${CREATED_IMAGES[@]}"; do docker rmi -f "$i" >/dev/null 2>&1; done
}
trap cleanup EXIT
trap 'exit 130' INT TERM

read_reward() {  # container -> prints the reward (reward.txt, else reward.json compacted, else "none")
  local c="$1"
  if docker exec "$c" test -f /logs/verifier/reward.txt; then
    docker exec "$c" cat /logs/verifier/reward.txt | tr -d '[:space:]'
  elif docker exec "$c" test -f /logs/verifier/reward.json; then
    docker exec "$c" cat /logs/verifier/reward.json | tr -d '[:space:]'
  else
    echo none
  fi
}

run_mode() {  # task image workdir mode -> prints "reward solve_rc test_rc"
  local task="$1" image="$2" workdir="$3" mode="$4"
  local dir="$TASKS_DIR/$task" c="wild-$task-$mode"
  docker rm -f "$c" >/dev/null 2>&1
  docker run -d --name "$c" --label io.raygrpo.wild=1 "$image" sleep infinity >/dev/null || { echo "start_failed - -"; return; }
  docker exec "$c" mkdir -p /logs/verifier /logs/agent
  local solve_rc=-
  if [ "$mode" = oracle ]; then
    docker cp "$dir/solution/." "$c:/solution" >/dev/null
    timeout "$TEST_TIMEOUT" docker exec -w "$workdir" -e DEBIAN_FRONTEND=noninteractive "$c" \
      bash -c 'chmod +x /solution/solve.sh && (/solution/solve.sh) > /logs/agent/oracle.txt 2>&1'
    solve_rc=$?
  fi
  docker exec "$c" rm -f /logs/verifier/reward.txt /logs/verifier/reward.json
  docker cp "$dir/tests/." "$c:/tests" >/dev/null
  timeout "$TEST_TIMEOUT" docker exec -w "$workdir" "$c" \
    bash -c 'chmod +x /tests/test.sh && (/tests/test.sh) > /logs/verifier/test-stdout.txt 2>&1'
  local test_rc=$?
  local reward xcheck=-
  reward="$(read_reward "$c")"
  # Tasks whose test.sh downloads its tooling (uvx) cannot reach astral.sh offline: cross-check the same
  # test_outputs.py with the pytest baked into the image, to tell a tooling failure from a wrong answer.
  if grep -q 'uvx' "$dir/tests/test.sh" && [ -f "$dir/tests/test_outputs.py" ]; then
    docker exec -w "$workdir" "$c" bash -c 'python3 -m pytest -q -p no:cacheprovider /tests/test_outputs.py > /logs/verifier/baked-pytest-crosscheck.txt 2>&1'
    xcheck=$?
  fi
  if [ -n "${WILD_KEEP_LOGS:-}" ]; then
    mkdir -p "$WILD_KEEP_LOGS/$task/$mode"
    docker cp "$c:/logs/." "$WILD_KEEP_LOGS/$task/$mode/" >/dev/null 2>&1
  fi
  docker rm -f "$c" >/dev/null 2>&1
  echo "$reward $solve_rc $test_rc $xcheck"
}

if [ "$#" -gt 0 ]; then TASKS=("$@"); else mapfile -t TASKS < <(ls "$TASKS_DIR"); fi
[ -n "$RESULTS" ] && printf 'task\tfrom\tbuild_s\toracle_reward\toracle_solve_rc\toracle_test_rc\tnoop_reward\tnoop_test_rc\toracle_baked_pytest_rc\tnoop_baked_pytest_rc\n' > "$RESULTS"
printf '%-30s %-20s %7s | %-26s | %-26s\n' task FROM build_s "oracle reward (solve,test rc)" "noop reward (test rc)"

for task in "${TASKS[@]}"; do
  dir="$TASKS_DIR/$task"
  image="wild-$task"
  from="$(awk 'toupper($1) == "FROM" { print $2; exit }' "$dir/environment/Dockerfile")"
  CREATED_IMAGES+=("$image")
  CREATED_CONTAINERS+=("wild-$task-oracle" "wild-$task-noop")  # run_mode runs in a subshell: register here
  t0=$(date +%s)
  if ! docker build -q --label io.raygrpo.wild=1 -t "$image" "$dir/environment" >/tmp/wild-build-$$.log 2>&1; then
    printf '%-30s %-20s %7s | build failed: %s\n' "$task" "$from" - "$(tail -n 1 /tmp/wild-build-$$.log)"
    [ -n "$RESULTS" ] && printf '%s\t%s\t-\tbuild_failed\t-\t-\tbuild_failed\t-\t-\t-\n' "$task" "$from" >> "$RESULTS"
    continue
  fi
  build_s=$(( $(date +%s) - t0 ))
  workdir="$(sed -n 's/^[[:space:]]*workdir[[:space:]]*=[[:space:]]*"\(.*\)".*/\1/p' "$dir/task.toml" | head -n 1)"
  [ -z "$workdir" ] && workdir="$(docker image inspect -f '{{.Config.WorkingDir}}' "$image")"
  [ -z "$workdir" ] && workdir=/
  read -r o_reward o_solve o_test o_x <<<"$(run_mode "$task" "$image" "$workdir" oracle)"
  read -r n_reward _ n_test n_x <<<"$(run_mode "$task" "$image" "$workdir" noop)"
  printf '%-30s %-20s %7s | %-26s | %-26s\n' "$task" "$from" "$build_s" "$o_reward ($o_solve,$o_test)" "$n_reward ($n_test)"
  [ "$o_x" != - ] && printf '%-30s   cross-check with the image'"'"'s baked pytest (exit code): oracle %s, noop %s\n' "" "$o_x" "$n_x"
  [ -n "$RESULTS" ] && printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$task" "$from" "$build_s" "$o_reward" "$o_solve" "$o_test" "$n_reward" "$n_test" "$o_x" "$n_x" >> "$RESULTS"
  docker rmi -f "$image" >/dev/null 2>&1
done
rm -f /tmp/wild-build-$$.log

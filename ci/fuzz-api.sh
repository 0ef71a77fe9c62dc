#!/usr/bin/env bash
# Fuzzes the dashboard's JSON API from its own OpenAPI document with schemathesis (every check,
# a fixed seed): `taskq web` (the binary built by `cargo test`) on a fresh database seeded with
# tasks in every state, on a free loopback port. Used by .ci/run; see docs/dashboard.md.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN="${TASKQ_BIN:-target/debug/taskq}"
DB=taskq_ci_api_fuzz
URL="mysql://root@127.0.0.1:3306/$DB"
SEED="${FUZZ_SEED:-20261201}"
EXAMPLES="${FUZZ_EXAMPLES:-100}"
command -v st >/dev/null 2>&1 || pip install -q schemathesis
st --version
mariadb -uroot -h127.0.0.1 -e "DROP DATABASE IF EXISTS $DB; CREATE DATABASE $DB"
DATABASE_URL="$URL" "$BIN" migrate >/dev/null
# Tasks in every state, so that reads, cancels and retries reach real rows.
for i in $(seq 1 40); do
  state=$(echo "pending running succeeded dead canceled expired" | cut -d' ' -f$(( (i % 6) + 1 )))
  mariadb -uroot -h127.0.0.1 "$DB" -e "INSERT INTO taskq_tasks (queue, name, payload, state,
    max_attempts, attempt, run_at, created_at, updated_at, finished_at)
    VALUES ('fuzz$(( i % 3 ))', 'fuzz_task', '{\"n\": $i}', '$state', 3, 1, UTC_TIMESTAMP(6),
    UTC_TIMESTAMP(6), UTC_TIMESTAMP(6),
    IF('$state' IN ('succeeded', 'dead', 'canceled', 'expired'), UTC_TIMESTAMP(6), NULL))"
done
# Workflows (ids 1 to 3), each a dead step and a step after it canceled by it, so that the
# workflow routes (read, cancel, retry) reach real rows.
for w in 1 2 3; do
  mariadb -uroot -h127.0.0.1 "$DB" -e "
    INSERT INTO taskq_workflows (id, name, created_at) VALUES ($w, 'fuzz_wf', UTC_TIMESTAMP(6));
    INSERT INTO taskq_tasks (queue, name, payload, state, max_attempts, attempt, run_at,
      created_at, updated_at, finished_at, workflow_id)
      VALUES ('fuzz0', 'fuzz_task', '{}', 'dead', 1, 1, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6),
      UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), $w);
    SET @dep = LAST_INSERT_ID();
    INSERT INTO taskq_tasks (queue, name, payload, state, max_attempts, attempt, run_at,
      created_at, updated_at, finished_at, workflow_id)
      VALUES ('fuzz0', 'fuzz_task', '{}', 'canceled', 1, 0, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6),
      UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), $w);
    SET @step = LAST_INSERT_ID();
    INSERT INTO taskq_workflow_steps (task_id, workflow_id, seq, step, deps_left,
      runs_after_failure, canceled_by_dep)
      VALUES (@dep, $w, 0, 'first', 0, 0, 0), (@step, $w, 1, 'second', 1, 0, 1);
    INSERT INTO taskq_workflow_deps (dep_task_id, task_id, settled) VALUES (@dep, @step, 1);"
done
# Batches (ids 1 to 3), each of two members with a waiting on_complete callback: 1 open, 2
# sealed and running, 3 ended (both members succeeded and counted, its callback released), so
# that the batch routes (read, members, cancel, seal, and a seal refused with 409) reach real
# rows.
for b in 1 2 3; do
  if [ $b = 3 ]; then st_m=succeeded; counted=1; done_n=2; ended="UTC_TIMESTAMP(6)"; cb=pending
  else st_m=pending; counted=0; done_n=0; ended=NULL; cb=waiting; fi
  mariadb -uroot -h127.0.0.1 "$DB" -e "
    INSERT INTO taskq_tasks (queue, name, payload, state, max_attempts, attempt, run_at,
      created_at, updated_at)
      VALUES ('fuzz0', 'fuzz_task', '{}', '$cb', 3, 0, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6),
      UTC_TIMESTAMP(6));
    SET @cb = LAST_INSERT_ID();
    INSERT INTO taskq_batches (id, name, created_at, total, succeeded, sealed,
      complete_task_id, completed_at, succeeded_at)
      VALUES ($b, 'fuzz_batch', UTC_TIMESTAMP(6), 2, $done_n, IF($b = 1, 0, 1), @cb,
      $ended, $ended);
    INSERT INTO taskq_tasks (queue, name, payload, state, max_attempts, attempt, run_at,
      created_at, updated_at, finished_at, batch_id)
      VALUES ('fuzz1', 'fuzz_task', '{}', '$st_m', 3, 0, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6),
      UTC_TIMESTAMP(6), $ended, $b);
    SET @m1 = LAST_INSERT_ID();
    INSERT INTO taskq_tasks (queue, name, payload, state, max_attempts, attempt, run_at,
      created_at, updated_at, finished_at, batch_id)
      VALUES ('fuzz1', 'fuzz_task', '{}', '$st_m', 3, 0, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6),
      UTC_TIMESTAMP(6), $ended, $b);
    SET @m2 = LAST_INSERT_ID();
    INSERT INTO taskq_batch_members (task_id, batch_id, counted)
      VALUES (@m1, $b, $counted), (@m2, $b, $counted);"
done
PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
TOKEN="fuzz-$(od -An -N8 -tx1 /dev/urandom | tr -d ' \n')"
TASKQ_WEB_TOKEN="$TOKEN" "$BIN" web --listen "127.0.0.1:$PORT" --database-url "$URL" \
  >target/api-fuzz-server.log 2>&1 &
server=$!
trap 'kill $server 2>/dev/null || true' EXIT
for _ in $(seq 1 100); do
  curl -fsS -o /dev/null -H "Authorization: Bearer $TOKEN" "http://127.0.0.1:$PORT/api/v1/openapi.json" && break
  sleep 0.1
done
# Not the stateful phase: it feeds values from one answer into the next request by field name,
# and a null `task_id` of an audit entry becomes the path `/tasks/None/retry`.
st --config-file ci/schemathesis.toml run "http://127.0.0.1:$PORT/api/v1/openapi.json" \
  --url "http://127.0.0.1:$PORT/api/v1" \
  -H "Authorization: Bearer $TOKEN" -H "Content-Type: application/json" \
  --phases examples,coverage,fuzzing \
  --checks all --seed "$SEED" --generation-deterministic --max-examples "$EXAMPLES" --workers 1

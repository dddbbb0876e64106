#!/usr/bin/env bash
# Runs the api and the worker in the foreground with console logs; Ctrl-C
# stops both. Used by `make run` after the services and database are up.
set -uo pipefail
cd "$(dirname "$0")/.."

export STEPCOLLECT_LOG_FORMAT=${STEPCOLLECT_LOG_FORMAT:-console}
if [ -z "${STEPCOLLECT_API_KEY:-}" ]; then
  STEPCOLLECT_API_KEY=$(head -c 18 /dev/urandom | base64 | tr -d '/+=')
  export STEPCOLLECT_API_KEY
  key_note="generated for this run (set STEPCOLLECT_API_KEY to choose one)"
else
  key_note="from STEPCOLLECT_API_KEY"
fi
api=${STEPCOLLECT_LISTEN:-127.0.0.1:9100}
metrics=${STEPCOLLECT_METRICS_LISTEN:-127.0.0.1:9101}
api_metrics=${STEPCOLLECT_API_METRICS_LISTEN:-$api}

cat <<MSG
stepcollect is starting:
  webhook      http://$api/webhook          (NanoMDM: -webhook-url)
  API          http://$api/v1/steps         key: $STEPCOLLECT_API_KEY  ($key_note)
  API metrics  http://$api_metrics/metrics
  worker       http://$metrics/metrics  /readyz
  logs         below, api and worker interleaved; Ctrl-C stops both
MSG

bin/worker &
worker=$!
bin/api &
api_pid=$!
stopping=0
trap 'stopping=1; kill -INT $worker $api_pid 2>/dev/null' INT TERM
wait -n $worker $api_pid
status=$?
kill -INT $worker $api_pid 2>/dev/null
wait
# Ctrl-C is how this is meant to end (the services may see it before this
# script does, and then exit cleanly); only an unexpected exit is a failure
if [ "$stopping" = 1 ] || [ "$status" = 0 ]; then exit 0; fi
echo "run: a service exited on its own (status $status); see the logs above" >&2
exit $status

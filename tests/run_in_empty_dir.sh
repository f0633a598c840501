#!/usr/bin/env bash
# run_in_empty_dir.sh PROGRAM [ARGS...]: run PROGRAM in a new empty
# temporary directory (as a newcomer runs an example), show its output, and
# exit with its status; the directory and whatever PROGRAM left in it are
# removed afterwards.
set -u
d=$(mktemp -d "${TMPDIR:-/tmp}/keel-run-XXXXXX") || exit 1
trap 'rm -rf "$d"' EXIT
cd "$d" || exit 1
timeout 120 "$@"
rc=$?
[ "$rc" = 0 ] || echo "run_in_empty_dir: $1 exited with status $rc" >&2
exit "$rc"

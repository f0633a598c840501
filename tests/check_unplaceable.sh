#!/usr/bin/env bash
# A cluster of three NATS servers of which two came up cannot place a new
# world's R3 stream (JetStream error 10005): a primary retries for the
# retry window (30 s: a forming cluster gets that long), then is refused,
# saying why, with nothing written: no data directory, no stream.
# usage: check_unplaceable.sh KEEL_WORLD KEEL_WAL
set -u
KW=$1 KWAL=$2
. "$(dirname "$0")/nats_cluster.sh"
d=$(mktemp -d /tmp/keel-unplaceable-XXXXXX)
cleanup() { nats_stop; rm -rf "$d"; }
trap cleanup EXIT
fail() { echo "FAIL: $*"; for f in "$d"/*.out; do echo "--- $f"; tail -n 5 "$f"; done; exit 1; }
nats_start "$d/nats" 3 2 || exit 1
"$KW" --data "$d/w" --replicate sync --until-tick 10 --nats "$NATS_URLS" --world short --quiet >"$d/w.out" 2>&1
rc=$?
[ $rc = 1 ] || fail "a primary whose stream the servers up cannot place: exit $rc, expected 1"
grep -q "too few servers up for the stream's replicas (JetStream error 10005)" "$d/w.out" ||
    fail "the refusal does not say why"
grep -q '^final tick=' "$d/w.out" && fail "the refused primary printed a final line"
[ ! -e "$d/w" ] || fail "the refused primary made its data directory"
"$KWAL" info "$NATS_URL1/short" >"$d/info.out" 2>&1 && fail "keel-wal info found a stream for the refused world"
echo "unplaceable: refused after the retry window, nothing written"

#!/usr/bin/env bash
# Failover on a 3-node JetStream cluster: a sync primary and a standby; the
# primary is frozen (SIGSTOP) until the standby promotes itself, one NATS
# server is killed, the primary resumes and must be fenced (non-zero exit,
# no final line); the promoted standby must end on the hash of an
# uninterrupted run; keel-wal verifies the stream; a fresh read replica
# follows to the same hash; the old primary's directory rejoins (its
# unreplicated tail dropped) and continues to a later tick's reference hash.
# usage: check_failover.sh KEEL_WORLD KEEL_WAL
set -u
KW=$1 KWAL=$2
. "$(dirname "$0")/nats_cluster.sh"
d=$(mktemp -d /tmp/keel-failover-XXXXXX); P=; S=; C=
cleanup() { for p in $P $S $C; do kill -9 "$p" 2>/dev/null; done; nats_stop; rm -rf "$d"; }
trap cleanup EXIT
fail() { echo "FAIL: $*"; for f in "$d"/*.out; do echo "--- $f"; tail -n 5 "$f"; done; exit 1; }
hash_of() { sed -n 's/^final tick=[0-9]* hash=\([0-9a-f]*\)$/\1/p' "$1" | tail -n 1; }
# committed_tick WHERE: the last committed tick of a directory or a stream (empty until it has one)
committed_tick() { "$KWAL" info "$1" 2>/dev/null | sed -n 's/.*last committed tick \([0-9]*\).*/\1/p'; }
# wait_ticked WHERE WHAT: wait (30 s at most) until WHERE has committed a tick
wait_ticked() {
    local i t
    for i in $(seq 1 300); do t=$(committed_tick "$1"); [ -n "$t" ] && [ "$t" -ge 1 ] && return 0; sleep 0.1; done
    fail "$2 never committed a tick"
}
nats_start "$d/nats" 3 || exit 1
U=1200 U2=1260 E=20000
common=(--nats "$NATS_URLS" --world fo --seed 5 --entities $E --lease-ms 1000 --quiet)
"$KW" --memory --seed 5 --entities $E --until-tick $U --tick-rate 0 --quiet >"$d/ref.out" 2>&1
"$KW" --memory --seed 5 --entities $E --until-tick $U2 --tick-rate 0 --quiet >"$d/ref2.out" 2>&1
"$KW" --memory --seed 5 --entities $E --until-tick 600 --tick-rate 0 --quiet >"$d/ref600.out" 2>&1
H=$(hash_of "$d/ref.out") H2=$(hash_of "$d/ref2.out")
[ -n "$H" ] && [ -n "$H2" ] || fail "the reference runs printed no hash"
"$KW" --data "$d/a" --replicate sync --until-tick $U --tick-rate 100 "${common[@]}" >"$d/a.out" 2>&1 & P=$!
wait_ticked "$NATS_URL1/fo" "the primary's stream" # the standby then starts on a world the stream holds
"$KW" --data "$d/b" --standby --until-tick $U "${common[@]}" >"$d/b.out" 2>&1 & S=$!
wait_ticked "$d/b" "the standby's directory" # it follows: freeze the primary
kill -STOP "$P"
for i in $(seq 1 300); do grep -q '^promoted epoch=' "$d/b.out" && break; sleep 0.1; done
grep -q '^promoted epoch=2 ' "$d/b.out" || fail "the standby did not promote itself into epoch 2"
kill -9 $(echo $NATS_PIDS | awk '{print $3}')
kill -CONT "$P"
wait "$P"; rc=$?; P=
[ $rc != 0 ] || fail "the resumed old primary exited 0"
[ -z "$(hash_of "$d/a.out")" ] || fail "the resumed old primary printed a final hash"
grep -q 'fenced' "$d/a.out" || fail "the old primary did not say it was fenced"
wait "$S"; rc=$?; S=
[ $rc = 0 ] && [ "$(hash_of "$d/b.out")" = "$H" ] || fail "the promoted standby: exit $rc, hash $(hash_of "$d/b.out"), expected $H"
"$KWAL" verify "$NATS_URL1/fo" >"$d/verify.out" 2>&1 || fail "keel-wal verify of the stream"
"$KWAL" restore "$NATS_URL1/fo" "$d/r" --to-tick 600 >"$d/restore.out" 2>&1 || fail "keel-wal restore --to-tick 600"
"$KWAL" replay "$d/r" --to-tick 600 >"$d/replay.out" 2>&1 || fail "keel-wal replay of the restored directory"
grep -q "^tick=600 hash=$(hash_of "$d/ref600.out")\$" "$d/replay.out" || fail "the restored directory is not tick 600's state"
"$KWAL" restore "$NATS_URL1/fo" "$d/r2" --to-tick 99999 >"$d/restore2.out" 2>&1 && fail "a restore to a tick the stream lacks succeeded"
[ ! -e "$d/r2/data.mdb" ] || fail "a refused restore left a data file"
"$KW" --data "$d/c" --follow --until-tick $U "${common[@]}" >"$d/c.out" 2>&1 & C=$! # waited for: a kill reaches it
wait "$C" || fail "the read replica failed"
C=
[ "$(hash_of "$d/c.out")" = "$H" ] || fail "the read replica ended on $(hash_of "$d/c.out"), expected $H"
"$KW" --data "$d/a" --replicate sync --until-tick $U2 --tick-rate 0 "${common[@]}" >"$d/a2.out" 2>&1 & C=$!
wait "$C" || fail "the rejoin failed"
C=
[ "$(hash_of "$d/a2.out")" = "$H2" ] || fail "the rejoined primary ended on $(hash_of "$d/a2.out"), expected $H2"
echo "failover: promoted, fenced, verified, followed and rejoined on the reference hashes ($H, $H2)"

#!/usr/bin/env bash
# Published checkpoints and stream retention on one real nats-server: a
# primary checkpoints every 50 ticks and keeps 10 records before its latest
# published checkpoint; a fresh read replica bootstraps from that checkpoint
# to the reference hash (one given another --seed is refused); keel-wal
# verifies the stream and restores it; a
# second primary continues the world on another directory; the first
# directory, now ending before the stream's start, rejoins as primary from
# the published checkpoint and continues to a later tick's reference hash.
# usage: check_bootstrap.sh KEEL_WORLD KEEL_WAL
set -u
KW=$1 KWAL=$2
. "$(dirname "$0")/nats_cluster.sh"
d=$(mktemp -d /tmp/keel-bootstrap-XXXXXX)
trap 'nats_stop; rm -rf "$d"' EXIT
fail() { echo "FAIL: $*"; for f in "$d"/*.out; do echo "--- $f"; tail -n 4 "$f"; done; exit 1; }
hash_of() { sed -n 's/^final tick=[0-9]* hash=\([0-9a-f]*\)$/\1/p' "$1" | tail -n 1; }
nats_start "$d/nats" 1 || exit 1
common=(--nats "$NATS_URLS" --world bs --seed 9 --entities 3000 --quiet)
for t in 300 600 700; do
    "$KW" --memory --seed 9 --entities 3000 --until-tick $t --tick-rate 0 --quiet >"$d/ref$t.out" 2>&1
done
run() { local out=$1; shift; "$KW" "$@" "${common[@]}" >"$d/$out.out" 2>&1 || fail "keel-world $*"; }
run a --data "$d/a" --replicate async --checkpoint-every 50 --retain-records 10 --until-tick 300 --tick-rate 0
[ "$(hash_of "$d/a.out")" = "$(hash_of "$d/ref300.out")" ] || fail "the primary's hash at 300"
run c --data "$d/c" --follow --until-tick 300
[ "$(hash_of "$d/c.out")" = "$(hash_of "$d/ref300.out")" ] || fail "the bootstrapped read replica's hash at 300"
# a node given another world's parameters is refused at open, naming both (the schema holds them)
"$KW" --data "$d/x" --follow --until-tick 300 --nats "$NATS_URLS" --world bs --seed 8 --entities 3000 --quiet \
    >"$d/x.out" 2>&1 && fail "a read replica given --seed 8 for the seed-9 world ran"
grep -q "'world seed=9 entities=3000' in the data directory but 'world seed=8 entities=3000' is registered" "$d/x.out" ||
    fail "the refusal of --seed 8 does not name both worlds"
[ ! -e "$d/x" ] || fail "the refused read replica left the new directory it made"
# a replica's world.params does not decide its world (the stream's schema does): a record of other values
# (an older keel-world recorded a replica's defaults) is written again from the flags the open accepted
printf 'seed=1\nentities=100000\n' >"$d/c/world.params"
run c2 --data "$d/c" --follow --until-tick 300
grep -q '^seed=9$' "$d/c/world.params" && grep -q '^entities=3000$' "$d/c/world.params" ||
    fail "the read replica's world.params was not written again from its accepted flags"
"$KWAL" verify "$NATS_URL1/bs" >"$d/verify.out" 2>&1 || fail "keel-wal verify of the purged stream"
"$KWAL" restore "$NATS_URL1/bs" "$d/r" >"$d/restore.out" 2>&1 || fail "keel-wal restore"
"$KWAL" info "$d/r" >"$d/info.out" 2>&1 || fail "keel-wal info of the restored directory"
grep -qE '^checkpoint *tick [0-9]+,' "$d/info.out" || fail "the restored directory does not start from a published checkpoint"
grep -q '^wal *LSN 1\.\.' "$d/info.out" && fail "the stream was never purged: the restore started at LSN 1"
"$KWAL" replay "$d/r" --to-tick 300 >"$d/replay.out" 2>&1 || fail "keel-wal replay of the restored directory"
grep -q "^tick=300 hash=$(hash_of "$d/ref300.out")$" "$d/replay.out" || fail "the restored state at 300"
run b --data "$d/b" --replicate async --checkpoint-every 50 --retain-records 10 --until-tick 600 --tick-rate 0
[ "$(hash_of "$d/b.out")" = "$(hash_of "$d/ref600.out")" ] || fail "the second primary's hash at 600"
run a2 --data "$d/a" --replicate async --checkpoint-every 50 --retain-records 10 --until-tick 700 --tick-rate 0
[ "$(hash_of "$d/a2.out")" = "$(hash_of "$d/ref700.out")" ] || fail "the first directory's rejoin at 700"
echo "bootstrap: replica, restore and a rejoin behind the purge all on the reference hashes"

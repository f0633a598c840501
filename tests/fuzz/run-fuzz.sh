#!/usr/bin/env bash
# tests/fuzz/run-fuzz.sh BUILD_DIR SECONDS [TARGET...] -- what `make fuzz` runs.
#
# Runs each libFuzzer target (default: fuzz_record fuzz_reader) for SECONDS,
# one after the other, on a scratch copy of its committed corpus
# (tests/fuzz/corpus/<record|reader>), with ASan + UBSan + LeakSanitizer, a
# 5 s per-input timeout and a 2 GiB RSS limit. Any finding (crash, broken
# invariant, sanitizer report, leak, timeout, out-of-memory) fails the run:
# the input that triggered it is kept in BUILD_DIR/fuzz-findings/ and the
# command that reproduces it is printed. FUZZ_ARGS adds libFuzzer flags.
set -euo pipefail
build=$1
secs=$2
shift 2
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(fuzz_record fuzz_reader)
here=$(cd "$(dirname "$0")" && pwd)
findings="$build/fuzz-findings"
mkdir -p "$findings"
work=$(mktemp -d "${TMPDIR:-/tmp}/keel-fuzz.XXXXXX")
# the reader target's LMDB directory: tmpfs when there is one (a sync is free)
if [ -d /dev/shm ] && [ -w /dev/shm ]; then scratch=$(mktemp -d /dev/shm/keel-fuzz.XXXXXX); else scratch="$work"; fi
trap 'rm -rf "$work" "$scratch"' EXIT
status=0
for t in "${targets[@]}"; do
  case $t in
    fuzz_record) corpus=record; max_len=16384 ;;
    fuzz_reader) corpus=reader; max_len=16384 ;;
    *) echo "run-fuzz: unknown target $t" >&2; exit 2 ;;
  esac
  mkdir -p "$work/$t"
  cp "$here/corpus/$corpus"/* "$work/$t/"
  echo "== $t: ${secs}s on $(ls "$work/$t" | wc -l) seed inputs"
  set +e
  KEEL_FUZZ_TMP="$scratch" ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
    "$build/tests/fuzz/$t" -max_total_time="$secs" -max_len="$max_len" -timeout=5 -rss_limit_mb=2048 \
    -detect_leaks=1 -print_final_stats=1 -artifact_prefix="$findings/$t-" ${FUZZ_ARGS:-} \
    "$work/$t" >"$work/$t.log" 2>&1
  rc=$?
  set -e
  grep -E '^#[0-9]+[[:space:]]+(INITED|DONE)' "$work/$t.log" || true
  grep -E '^stat::(number_of_executed_units|average_exec_per_sec|new_units_added|peak_rss_mb)' "$work/$t.log" || true
  if [ $rc -ne 0 ]; then
    status=1
    cp "$work/$t.log" "$findings/$t.log"
    echo "!! $t found a problem (exit $rc); log: $findings/$t.log"
    grep -E 'ERROR|invariant violated|SUMMARY|Test unit written' "$work/$t.log" | head -n 20 || true
    for f in "$findings/$t"-*; do
      case $f in *.log) ;; *) [ -e "$f" ] && echo "   reproduce: $build/tests/fuzz/$t $f" ;; esac
    done
  fi
done
exit $status

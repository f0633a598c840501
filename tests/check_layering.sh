#!/usr/bin/env bash
# The folders of src/ are layers (docs/architecture.md): each may include only
# the folders below it, and only wal/ calls zstd. Prints every violation and
# exits 1 when there is one.
set -u
root=${1:-$(dirname "$0")/..}
cd "$root" || exit 2
allowed() { # folder -> the folders it may include from
    case $1 in
    core) echo "" ;;
    world) echo "core" ;;
    txn) echo "core world" ;;
    durable) echo "core world txn" ;;
    sched) echo "core world txn" ;;
    runtime) echo "core world txn durable sched" ;;
    esac
}
layers="core world txn durable sched runtime"
bad=0
for folder in $layers; do
    [ -d "src/$folder" ] || continue
    ok=" $(allowed "$folder") $folder "
    while IFS=: read -r file line inc; do
        top=${inc%%/*}
        case " $layers " in *" $top "*) ;; *) continue ;; esac
        case "$ok" in *" $top "*) ;; *)
            echo "$file:$line includes $inc ($folder -> $top)"; bad=1 ;;
        esac
    done < <(grep -rnoE '^\s*#\s*include\s+"[^"]+"' "src/$folder" --include='*.[ch]' |
             sed -E 's/^([^:]+):([0-9]+):.*"([^"]+)"/\1:\2:\3/')
done
if grep -rnE '\bZSTD_(compress|decompress|createCCtx|createDCtx|CCtx|DCtx)' src --include='*.[ch]'; then
    echo "zstd is called outside wal/"; bad=1
fi
[ $bad = 0 ] && echo "layering: src/ folders include one way; zstd only in wal/"
exit $bad

#!/usr/bin/env bash
# The man pages of man/: each renders without a groff warning (as
# `man -l` would show it), names the project version in its title line, and
# the page of each tool names every option its --help lists (and, for
# keel-wal, every command and every option of each command's --help).
# Prints every problem and exits 1 when there is one.
# Usage: check_man.sh MAN_DIR VERSION KEEL_WORLD KEEL_WAL KEEL_CRASH
set -u
man=$1 version=$2 world=$3 wal=$4 crash=$5
bad=0
problem() { echo "check_man: $1" >&2; bad=1; }
pages=$(ls "$man"/*.[0-9] 2>/dev/null)
[ -n "$pages" ] || { echo "check_man: no pages in $man" >&2; exit 1; }
for p in $pages; do
    warn=$(groff -man -t -ww -z "$p" 2>&1)
    [ -z "$warn" ] || problem "$(basename "$p") renders with warnings: $warn"
    grep -q "^\.TH .*\"keel $version\"" "$p" || problem "$(basename "$p"): its .TH line does not say \"keel $version\""
done
options() { grep -oE -- '(^|[][ ,|(])--?[a-z][a-z-]*' | grep -oE -- '--?[a-z][a-z-]*' | sort -u; }
check_options() { # check_options PAGE WHERE < help text
    local text
    text=$(sed 's/\\-/-/g' "$man/$1")   # roff writes a hyphen as \-
    for o in $(options); do
        grep -qE -- "(^|[^a-z-])$o([^a-z-]|$)" <<<"$text" || problem "$1 does not mention $o ($2)"
    done
}
for tool in "$world" "$crash"; do
    name=$(basename "$tool")
    "$tool" --help >/dev/null 2>&1 || problem "$name --help fails"
    "$tool" --help 2>&1 | check_options "$name.1" "from $name --help"
done
"$wal" --help | check_options keel-wal.1 "from keel-wal --help"
for cmd in $("$wal" --help | sed -n '/^commands:/,/^$/p' | awk 'NR > 1 && NF {print $1}'); do
    grep -qE "^\.BI $cmd \" (DIR|STREAM)( DEST)?\"" "$man/keel-wal.1" || problem "keel-wal.1 does not describe the command $cmd"
    "$wal" "$cmd" --help | check_options keel-wal.1 "from keel-wal $cmd --help"
done
exit $bad

#!/usr/bin/env bash
# Every public header (include/keel/*.h) compiles alone, first in its
# translation unit, as C11 and as C++ (pedantic, warnings as errors): a header
# includes or forward-declares what it uses (docs/api-stability.md). Usage:
# check_headers.sh ROOT CC [CXX]; without a C++ compiler the C++ half is
# skipped with a note. Prints every failure and exits 1 when there is one.
set -u
root=$1 cc=$2 cxx=${3:-}
[ -n "$cxx" ] || cxx=$(command -v c++ || command -v g++ || command -v clang++ || true)
tmp=$(mktemp -d) || exit 2
trap 'rm -rf "$tmp"' EXIT
bad=0
for h in "$root"/include/keel/*.h; do
    name=$(basename "$h")
    printf '#include "keel/%s"\nint keel_header_check_;\n' "$name" > "$tmp/t.c"
    "$cc" -std=c11 -Wall -Wextra -Wpedantic -Werror -fsyntax-only -I"$root/include" "$tmp/t.c" ||
        { echo "$name does not compile alone as C11"; bad=1; }
    if [ -n "$cxx" ]; then
        cp "$tmp/t.c" "$tmp/t.cpp"
        "$cxx" -std=c++17 -Wall -Wextra -Wpedantic -Werror -fsyntax-only -I"$root/include" "$tmp/t.cpp" ||
            { echo "$name does not compile alone as C++17"; bad=1; }
    fi
done
[ -n "$cxx" ] || echo "check_headers: no C++ compiler found: the C++ half was skipped"
exit $bad

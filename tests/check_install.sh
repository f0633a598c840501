#!/usr/bin/env bash
# keel as an installed library, end to end (docs/api-stability.md, README
# "Install"): `cmake --install` of a configured and built tree into a
# temporary prefix, then, against that prefix only:
#   - the layout: headers, libkeel.so with its SONAME, libkeel.a holding the
#     runtime, wal and base objects, keel.pc, the CMake package, the tools,
#     the power-loss shim (the installed keel-crash finds it), the man pages;
#   - every public header compiles alone as C11 and as C++11 (-pedantic);
#   - a C and a C++ program through pkg-config (shared) and a C program
#     through `pkg-config --static` (libkeel.a), each run;
#   - a C and a C++ consumer through find_package(keel) -> keel::keel, and a C
#     one through keel::keel_static, each run; find_package of the next
#     incompatible version refused;
#   - every docs/examples/*.c built through pkg-config, shared and static,
#     and run in an empty directory (exit 0).
# Usage: check_install.sh BUILD_DIR SOURCE_DIR VERSION SOVERSION
# CONSUMER_FLAGS (environment): compiler flags every consumer needs (the
# sanitizer flags of a sanitizer build). Each failure says which step
# failed and shows its output; the first one ends the check with exit 1.
set -u
build=$1 src=$2 version=$3 soversion=$4
flags=(${CONSUMER_FLAGS:-})
d=$(mktemp -d "${TMPDIR:-/tmp}/keel-install-XXXXXX") || exit 1
trap 'rm -rf "$d"' EXIT
fail() { echo "check_install: FAILED: $1" >&2; exit 1; }
step() { # step WHAT COMMAND...: run COMMAND, output to $d/log; on failure show it and fail naming WHAT
    local what=$1 rc; shift
    "$@" >"$d/log" 2>&1 && return
    rc=$?
    sed 's/^/    /' "$d/log" >&2
    fail "$what (exit $rc): $*"
}

p=$d/prefix
step "cmake --install" cmake --install "$build" --prefix "$p"

# ---- layout -------------------------------------------------------------------
lib=$(dirname "$(find "$p" -name keel.pc -path '*/pkgconfig/*' | head -n 1)")
[ "$lib" != . ] || fail "no keel.pc under the prefix"
lib=$(dirname "$lib")
for f in include/keel/keel.h include/keel/version.h bin/keel-world bin/keel-wal bin/keel-crash \
         share/man/man1/keel-world.1 share/man/man1/keel-wal.1 share/man/man1/keel-crash.1 share/man/man3/keel.3 \
         "${lib#$p/}/libkeel.a" "${lib#$p/}/libkeel.so" "${lib#$p/}/libkeel.so.$soversion" \
         "${lib#$p/}/libkeel.so.$version" "${lib#$p/}/cmake/keel/keelConfig.cmake" \
         "${lib#$p/}/cmake/keel/keelConfigVersion.cmake"; do
    [ -e "$p/$f" ] || fail "$f is not installed"
done
[ -n "$(find "$p" -name libkeel_powerloss.so -path '*/libexec/keel/*')" ] || fail "libexec/keel/libkeel_powerloss.so is not installed"
for h in "$src"/include/keel/*.h; do
    [ -f "$p/include/keel/$(basename "$h")" ] || fail "include/keel/$(basename "$h") is not installed"
done
soname=$(objdump -p "$lib/libkeel.so" | awk '$1 == "SONAME" {print $2}')
[ "$soname" = "libkeel.so.$soversion" ] || fail "libkeel.so has SONAME '$soname', expected libkeel.so.$soversion"
# One library for users: the runtime, libkeel_wal and keel_base objects in one archive.
members=$(ar t "$lib/libkeel.a")
for o in runtime.c.o recover.c.o record.c.o store.c.o error.c.o version.c.o; do
    grep -qx "$o" <<<"$members" || fail "libkeel.a lacks $o"
done
# Only the public keel_ names leave the shared library.
leaked=$(nm -D --defined-only "$lib/libkeel.so" | awk '{print $3}' | grep -v '^keel_' | head -n 5)
[ -z "$leaked" ] || fail "libkeel.so exports non-public symbols: $leaked"
"$p/bin/keel-wal" --help >/dev/null || fail "the installed keel-wal does not run"
# The installed keel-crash finds keel-world beside it and its power-loss shim
# in libexec/keel (a sanitizer build refuses powerloss mode: the shim cannot
# be preloaded before the sanitizer's runtime).
if [ ${#flags[@]} = 0 ]; then
    step "the installed keel-crash in powerloss mode" \
        "$p/bin/keel-crash" --mode powerloss --rounds 2 --until-tick 10 --entities 50
    grep -q '^crashes=[0-9]* lost_acknowledged=0 hash_mismatches=0 invariant_violations=0$' "$d/log" ||
        fail "the installed keel-crash: $(tail -n 1 "$d/log")"
fi

export PKG_CONFIG_PATH=$lib/pkgconfig
step "pkg-config --modversion keel" pkg-config --modversion keel
[ "$(cat "$d/log")" = "$version" ] || fail "keel.pc says version $(cat "$d/log"), expected $version"
cflags=$(pkg-config --cflags keel) && libs=$(pkg-config --libs keel) && slibs=$(pkg-config --static --libs keel) ||
    fail "pkg-config keel"
for l in -llmdb -lurcu-bp -lzstd -lnats -pthread; do
    grep -q -- "$l" <<<"$slibs" || fail "pkg-config --static --libs keel lacks $l: $slibs"
done
# libkeel.a by path, then what it needs: a static user never links libkeel.so.
slibs="$lib/libkeel.a $(sed 's/-lkeel\b//' <<<"$slibs")"
rpath="-Wl,-rpath,$lib"

# ---- headers: each alone, as C and as C++ ----------------------------------------------
for h in "$p"/include/keel/*.h; do
    n=keel/$(basename "$h")
    printf '#include <%s>\n' "$n" >"$d/h.c"
    cp "$d/h.c" "$d/h.cpp"
    step "$n alone as C11" cc -std=c11 -pedantic -Wall -Wextra -Werror -fsyntax-only -I"$p/include" "$d/h.c"
    step "$n alone as C++11" c++ -std=c++11 -pedantic -Wall -Wextra -Werror -fsyntax-only -I"$p/include" "$d/h.cpp"
done

# ---- consumers through pkg-config ----------------------------------------------------
cat >"$d/m.c" <<'EOF'
#include <keel/keel.h>
#include <stdio.h>
#include <string.h>
int main(void)
{
    /* the headers and the library carry one version */
    if (strcmp(keel_version(), KEEL_VERSION_STRING) != 0)
        return 1;
    keel_world *w = NULL;
    if (keel_world_create(NULL, &w) != 0)
        return 2;
    keel_world_destroy(w);
    printf("%s %s\n", keel_version(), keel_strerror(KEEL_ESTALE));
    return 0;
}
EOF
cp "$d/m.c" "$d/m.cpp"
expect="$version KEEL_ESTALE"
run_consumer() { # run_consumer WHAT BINARY
    "$2" >"$d/log" 2>&1 || { cat "$d/log" >&2; fail "$1 does not run (exit $?)"; }
    [ "$(cat "$d/log")" = "$expect" ] || fail "$1 printed '$(cat "$d/log")', expected '$expect'"
}
step "C program via pkg-config" cc "${flags[@]}" "$d/m.c" -o "$d/mc" $cflags $libs $rpath
run_consumer "the C program built via pkg-config" "$d/mc"
step "C++ program via pkg-config" c++ "${flags[@]}" "$d/m.cpp" -o "$d/mcxx" $cflags $libs $rpath
run_consumer "the C++ program built via pkg-config" "$d/mcxx"
step "C program via pkg-config --static" cc "${flags[@]}" "$d/m.c" -o "$d/ms" $cflags $slibs
run_consumer "the C program built via pkg-config --static" "$d/ms"
objdump -p "$d/ms" | grep -q 'NEEDED.*libkeel' && fail "the --static program needs libkeel.so"

# ---- consumers through find_package(keel) ------------------------------------------------
consumer() { # consumer NAME LANG SOURCE TARGET
    mkdir -p "$d/$1"
    cp "$3" "$d/$1/"
    printf 'cmake_minimum_required(VERSION 3.16)\nproject(%s %s)\nfind_package(keel %s REQUIRED)\n' "$1" "$2" "$version" \
        >"$d/$1/CMakeLists.txt"
    printf 'add_executable(m %s)\ntarget_link_libraries(m PRIVATE %s)\n' "$(basename "$3")" "$4" >>"$d/$1/CMakeLists.txt"
    step "find_package(keel) consumer $1: configure" cmake -S "$d/$1" -B "$d/$1/b" -DCMAKE_PREFIX_PATH="$p" \
        -DCMAKE_C_FLAGS="${flags[*]}" -DCMAKE_CXX_FLAGS="${flags[*]}"
    step "find_package(keel) consumer $1: build" cmake --build "$d/$1/b"
    run_consumer "the find_package(keel) consumer $1" "$d/$1/b/m"
}
consumer c C "$d/m.c" keel::keel
consumer cxx CXX "$d/m.cpp" keel::keel
consumer c_static C "$d/m.c" keel::keel_static
objdump -p "$d/c_static/b/m" | grep -q 'NEEDED.*libkeel' && fail "the keel::keel_static consumer needs libkeel.so"
# The package accepts what the ABI promises (docs/api-stability.md): 0.x the
# same minor version, from 1.0 the same major one; so the next one is refused.
IFS=. read -r major minor _ <<<"$version"
if [ "$major" = 0 ]; then next="0.$((minor + 1))"; else next="$((major + 1)).0"; fi
mkdir -p "$d/next"
printf 'cmake_minimum_required(VERSION 3.16)\nproject(next C)\nfind_package(keel %s REQUIRED)\n' "$next" >"$d/next/CMakeLists.txt"
cmake -S "$d/next" -B "$d/next/b" -DCMAKE_PREFIX_PATH="$p" >"$d/log" 2>&1 &&
    fail "find_package(keel $next) accepts the installed $version"
grep -q "requested version \"$next\"" "$d/log" || { cat "$d/log" >&2; fail "find_package(keel $next) failed for another reason than the version"; }

# ---- the examples, against the prefix -------------------------------------------------------
n=0
for ex in "$src"/docs/examples/*.c; do
    [ -f "$ex" ] || continue
    n=$((n + 1))
    b=$(basename "$ex" .c)
    step "docs/examples/$b.c via pkg-config" cc "${flags[@]}" -Wall -Wextra -Werror "$ex" -o "$d/ex-$b" $cflags $libs $rpath
    step "docs/examples/$b.c via pkg-config --static" cc "${flags[@]}" "$ex" -o "$d/exs-$b" $cflags $slibs
    for bin in "$d/ex-$b" "$d/exs-$b"; do
        rm -rf "$d/run" && mkdir "$d/run"
        step "docs/examples/$b.c ($(basename "$bin")) run in an empty directory" \
            bash -c 'cd "$1" && exec timeout 120 "$2"' run "$d/run" "$bin"
    done
done
[ "$n" -gt 0 ] || fail "no docs/examples/*.c"
echo "check_install: $p: layout, $(ls "$p"/include/keel/*.h | wc -l) headers as C and C++, pkg-config (C, C++, static)," \
     "find_package(keel) (C, C++, static) and $n examples (shared and static): ok"

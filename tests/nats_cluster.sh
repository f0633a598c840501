# Real nats-server processes on loopback for the replication tests (sourced).
# nats_start DIR N [UP]: N servers (1: a single node; 3: an R3 JetStream
# cluster) on free ports, JetStream storage under DIR, of which the first UP
# (default N) are started: a cluster some of whose servers never came up;
# sets NATS_URLS (every server's client URL, comma-separated, started or not),
# NATS_URL1 and NATS_PIDS, and returns once every started server answers
# /healthz. nats_stop kills them all and waits for them; the
# caller traps EXIT to call it, so a failing test never leaves one running.
# A server that cannot start fails the test: it never skips.
# free_ports N: N ports nobody listens on, all different (each socket stays bound until the last is picked)
free_ports() { python3 -c 'import socket, sys
s = [socket.socket() for _ in range(int(sys.argv[1]))]
for x in s: x.bind(("127.0.0.1", 0))
print(" ".join(str(x.getsockname()[1]) for x in s))' "$1"; }
nats_start() {
    local dir=$1 n=$2 up=${3:-$2} i routes="" client=() route=() mon=()
    command -v nats-server >/dev/null || { echo "nats-server is missing (Debian package nats-server)"; return 1; }
    local ports=($(free_ports $((3 * n))))
    for i in $(seq 0 $((n - 1))); do client+=("${ports[3 * i]}"); route+=("${ports[3 * i + 1]}"); mon+=("${ports[3 * i + 2]}"); done
    for i in $(seq 0 $((n - 1))); do routes="$routes${routes:+, }nats-route://127.0.0.1:${route[$i]}"; done
    NATS_URLS=""; NATS_PIDS=""
    for i in $(seq 0 $((n - 1))); do
        mkdir -p "$dir/s$i"
        {
            echo "server_name: s$i"
            echo "listen: 127.0.0.1:${client[$i]}"
            echo "http: 127.0.0.1:${mon[$i]}"
            echo "jetstream { store_dir: \"$dir/s$i\", max_mem: 64M, max_file: 1G }"
            [ "$n" -gt 1 ] && echo "cluster { name: keeltest, listen: 127.0.0.1:${route[$i]}, routes: [$routes] }"
        } >"$dir/s$i.conf"
        NATS_URLS="$NATS_URLS${NATS_URLS:+,}nats://127.0.0.1:${client[$i]}"
        [ "$i" -lt "$up" ] || continue
        nats-server -c "$dir/s$i.conf" >"$dir/s$i.log" 2>&1 &
        NATS_PIDS="$NATS_PIDS $!"
    done
    NATS_URL1="nats://127.0.0.1:${client[0]}"
    local tries ok m
    for tries in $(seq 1 120); do
        ok=0
        for m in "${mon[@]:0:$up}"; do curl -sf "http://127.0.0.1:$m/healthz" >/dev/null 2>&1 && ok=$((ok + 1)); done
        [ "$ok" = "$up" ] && return 0
        sleep 0.25
    done
    echo "the NATS servers did not become healthy (logs in $dir)"
    return 1
}
nats_stop() {
    local p
    for p in $NATS_PIDS; do kill "$p" 2>/dev/null; done
    for p in $NATS_PIDS; do wait "$p" 2>/dev/null; done
    NATS_PIDS=""
}
